"""A box's processes and listening sockets, as /proc shows them: who holds a port, and which
processes belong to a deployment.

Each rule here is written once. The collection imports this module as module_utils (preflight:
a port held by a process that is not this deployment's is refused); the box-side supervisor
imports the same file as ``lobes_processes`` (gateway/lobes_processes.py is a link to it) to
find its own processes by what they are, not only by pidfiles that can be lost, and to confirm
that what answers a service's health check is the process it started. Standard library only:
it runs on a box that has no Ansible. Linux only (/proc).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass

PROC = "/proc"
# Set in the environment of every process the supervisor starts: the state directory it
# belongs to and its service, so it can be found again when its pidfile is lost.
STATE_DIR_MARK = "LOBES_STATE_DIR"
SERVICE_MARK = "LOBES_SERVICE"
_LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket: its address, port and socket inode."""

    address: str
    port: int
    inode: int


def _address(hex_address: str) -> str:
    """An address of /proc/net/tcp{,6} (hex, in the kernel's byte order) in its usual form."""
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    address = ipaddress.IPv6Address(words)
    return str(address.ipv4_mapped or address)


def listeners(port: int, proc: str = PROC) -> list[Listener]:
    """The sockets listening on `port` in this network namespace (IPv4 and IPv6)."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", table), encoding="ascii") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            hex_address, _colon, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port:
                found.append(Listener(_address(hex_address), port, int(fields[9])))
    return found


def overlaps(bound: str, address: str) -> bool:
    """Whether a socket bound to `bound` takes `address` away from another socket: the same
    address, or either one every address."""
    wildcards = ("0.0.0.0", "::")
    return bound == address or bound in wildcards or address in wildcards


def pids() -> list[int]:
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def socket_owners(inodes: Iterable[int]) -> dict[int, set[int]]:
    """inode -> pids of the processes holding that socket open (those this user may see)."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    owners: dict[int, set[int]] = {inode: set() for inode in wanted.values()}
    if not wanted:
        return owners
    for pid in pids():
        directory = os.path.join(PROC, str(pid), "fd")
        try:
            fds = os.listdir(directory)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(directory, fd))
            except OSError:
                continue
            if target in wanted:
                owners[wanted[target]].add(pid)
    return owners


def port_holders(port: int, address: str = "0.0.0.0") -> tuple[list[Listener], set[int]]:
    """The listeners that take `port` on `address` from us, and the pids that hold them."""
    found = [item for item in listeners(port) if overlaps(item.address, address)]
    owners = socket_owners(item.inode for item in found)
    return found, set().union(*owners.values()) if owners else set()


def cmdline(pid: int) -> list[str]:
    """A process's argv; [] when it is gone or a kernel thread."""
    try:
        with open(os.path.join(PROC, str(pid), "cmdline"), "rb") as handle:
            raw = handle.read()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def environ(pid: int) -> dict[str, str]:
    """A process's environment; {} when it is gone or this user may not read it."""
    try:
        with open(os.path.join(PROC, str(pid), "environ"), "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0"))
    return {name: value for name, sep, value in pairs if sep}


def cwd(pid: int) -> str | None:
    try:
        return os.readlink(os.path.join(PROC, str(pid), "cwd"))
    except OSError:
        return None


def session(pid: int) -> int | None:
    """The session id of a process (the supervisor starts each service in its own session,
    so a service's whole process tree shares its first process's pid as session id)."""
    try:
        with open(os.path.join(PROC, str(pid), "stat"), encoding="utf-8") as handle:
            stat = handle.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[3])


def describe(pid: int) -> str:
    """A process as a message names it: pid and command line (cut)."""
    argv = " ".join(cmdline(pid)) or "?"
    return f"pid {pid} ({argv[:120]})"


def marked(pid: int, state_dir: str) -> str | None:
    """The service a process of the state directory's deployment runs (by its marks), or None
    when the process is not one of them."""
    env = environ(pid)
    if env.get(STATE_DIR_MARK) == state_dir:
        return env.get(SERVICE_MARK)
    return None


def is_monitor(argv: list[str], state_dir: str) -> str | None:
    """The service a supervisor monitor of the state directory watches, from its argv (python
    -m lobes_supervisor --state-dir DIR ... monitor NAME), or None when argv is not one."""
    if (len(argv) >= 6 and argv[1:3] == ["-m", "lobes_supervisor"]
            and argv[-2] == "monitor" and "--state-dir" in argv
            and argv[argv.index("--state-dir") + 1] == state_dir):
        return argv[-1]
    return None


def deployment(state_dir: str) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """This state directory's processes found by what they are: (service -> monitor pids,
    service -> pids of the processes it started, by their marks)."""
    monitors: dict[str, list[int]] = {}
    started: dict[str, list[int]] = {}
    me = os.getpid()
    for pid in pids():
        if pid == me:
            continue
        name = is_monitor(cmdline(pid), state_dir)
        if name is not None:
            monitors.setdefault(name, []).append(pid)
            continue
        name = marked(pid, state_dir)
        if name is not None:
            started.setdefault(name, []).append(pid)
    return monitors, started
