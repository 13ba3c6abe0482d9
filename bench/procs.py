"""Processes under test: start them pinned to a core, read their CPU time and RSS from /proc."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


# Where a distribution installs its own python3: the interpreter a box runs the gateway with
# (the process runtime runs `python3`; compose's python image is an optimized build too), not a
# development build first on PATH.
_DISTRO_BIN = "/usr/bin:/bin:/usr/local/bin"
# Prints the interpreter's version and whether its libpython is a shared library it loaded.
_DESCRIBE_INTERPRETER = (
    "import platform; maps = open('/proc/self/maps').read(); "
    "print(platform.python_version(), '/libpython' in maps)"
)


def distro_python() -> str | None:
    """The distribution's python3, if the machine has one."""
    return shutil.which("python3", path=_DISTRO_BIN)


def describe_interpreter(python: str) -> str:
    """`python`'s path, version and build as the figures depend on it: a shared libpython
    (calls across a library boundary, as pyenv and many development builds make it) or one
    linked into the executable (Debian's and Ubuntu's python3)."""
    version, shared = subprocess.run(
        [python, "-c", _DESCRIBE_INTERPRETER], capture_output=True, text=True, check=True
    ).stdout.split()
    build = "shared libpython" if shared == "True" else "libpython linked in"
    return f"{python} ({version}, {build})"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def raise_fd_limit(at_least: int = 0) -> int:
    """Lift this process's (and so its children's) open-file limit to the hard limit, or to
    `at_least` above it where that is allowed (root); returns the limit now in force."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if at_least > hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (at_least, at_least))
            return at_least
        except (ValueError, OSError):
            pass  # not allowed to raise the hard limit (or above fs.nr_open): keep it
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        kids.extend(int(k) for k in task.read_text().split())
    return kids


def process_tree(pid: int) -> list[int]:
    """The pid and all its descendants (nginx: master plus worker)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(_children(current))
    return tree


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of the whole process tree, in seconds: its own code, and the kernel's
    work on its behalf (its syscalls: on loopback a send also runs the receiver's TCP path)."""
    user = system = 0
    for member in process_tree(pid):
        fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        user += int(fields[11])  # utime (field 14)
        system += int(fields[12])  # stime (field 15)
    return user / CLOCK_TICKS, system / CLOCK_TICKS


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process tree, in seconds."""
    return sum(cpu_times(pid))


def sched_ns(pid: int) -> tuple[int, int]:
    """(ns on a CPU, ns runnable but waiting for one) over every thread of the process tree."""
    ran = waited = 0
    for member in process_tree(pid):
        for stat in Path(f"/proc/{member}/task").glob("*/schedstat"):
            on_cpu, on_queue, _slices = stat.read_text().split()
            ran += int(on_cpu)
            waited += int(on_queue)
    return ran, waited


def rss_kib(pid: int) -> int:
    """Resident set size of the whole process tree, in KiB."""
    total = 0
    for member in process_tree(pid):
        total += int(Path(f"/proc/{member}/statm").read_text().split()[1]) * PAGE_KIB
    return total


def raise_priority(nice: int) -> None:
    """Renice this process, and its autogroup (its session's scheduling group) where there is one.

    Children inherit both. Raises PermissionError when not allowed (not root).
    """
    autogroup = Path("/proc/self/autogroup")
    if autogroup.exists():
        autogroup.write_text(str(nice))
    os.nice(nice)


def set_realtime(pids: list[int], enabled: bool) -> None:
    """Put every thread of these process trees under SCHED_FIFO (or back to normal).

    Used for the c=1 phases only: there the processes mostly sleep, and what is measured is
    how fast each hop wakes up, which other work on a shared host otherwise dominates.
    """
    policy = os.SCHED_FIFO if enabled else os.SCHED_OTHER
    param = os.sched_param(1 if enabled else 0)
    for pid in pids:
        for member in process_tree(pid):
            for task in Path(f"/proc/{member}/task").iterdir():
                os.sched_setscheduler(int(task.name), policy, param)


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 15.0) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listened on port {port} within {timeout_s} s: {proc.args!r}")


@dataclass
class Service:
    """A started server process: what it is, where it listens, and its log file."""

    name: str
    port: int
    proc: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def spawn(
    name: str, argv: list[str], port: int, core: int, workdir: Path, env: dict | None = None
) -> Service:
    """Start argv pinned to one core with its output in workdir/<name>.log; wait for its port."""
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["taskset", "-c", str(core), *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    service = Service(name, port, proc, log_path)
    try:
        wait_for_port(port, proc)
    except RuntimeError as error:
        service.stop()
        raise RuntimeError(f"{error}\n--- {log_path}:\n{service.log_tail()}") from error
    return service


def ensure_nginx() -> str:
    """Path of the nginx binary, installing Debian's package when it is missing."""
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if found:
        return found
    quiet = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=quiet)
    subprocess.run(["apt-get", "install", "-y", "-qq", "nginx"], check=True, env=quiet)
    return shutil.which("nginx") or "/usr/sbin/nginx"


def nginx_version(binary: str) -> str:
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False)
    return (out.stderr or out.stdout).strip().split("/", 1)[-1]


NGINX_CONF = """\
{user}worker_processes 1;
daemon off;
master_process on;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
worker_rlimit_nofile {nofile};
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    upstream backend {{
        server 127.0.0.1:{backend_port};
        keepalive 1024;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def start_nginx(backend_port: int, core: int, workdir: Path, nofile: int) -> Service:
    """nginx as the reference reverse proxy: 1 worker, keep-alive upstream, no buffering.

    Its worker may hold `nofile` descriptors; a proxied stream takes two connections (the
    client's and the upstream one), and worker_connections counts both.
    """
    binary = ensure_nginx()
    port = free_port()
    conf_dir = Path(tempfile.mkdtemp(prefix="nginx-", dir=workdir))
    conf = conf_dir / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(
            user="user root;\n" if os.geteuid() == 0 else "",
            dir=conf_dir,
            nofile=nofile,
            connections=max(1024, nofile - 64),
            backend_port=backend_port,
            port=port,
        )
    )
    return spawn("nginx", [binary, "-c", str(conf), "-p", str(conf_dir)], port, core, workdir)
