"""A box's service files: the .env parser, services.json validation and the restart fingerprint.

Each rule here is written once. The collection imports this module as module_utils (the
systemd_units module); the box-side supervisor imports the same file as ``lobes_service_files``
(gateway/lobes_service_files.py is a link to it), so the two process runtimes read a box's files
alike. Standard library only: it runs on a box that has no Ansible.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

# ---------------------------------------------------------------- compose


def ps_rows(text: str) -> list:
    """`docker compose ps --format json`: one object a line (Compose >= 2.21), or one array."""
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------- .env

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_LINE = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)")
_COMMENT = re.compile(r"(?:^|\s)#")


class EnvFileError(ValueError):
    """A .env line that is not KEY=VALUE; the message names the line."""


def parse_env_file(text: str) -> dict[str, str]:
    """Parse a .env: KEY=VALUE lines, optional `export `, # comments, single or double quotes."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _ENV_LINE.fullmatch(stripped)
        if not match:
            raise EnvFileError(f"line {number}: {stripped!r} is not KEY=VALUE")
        key, rest = match.groups()
        values[key] = _env_value(rest.strip(), number)
    return values


def _env_value(rest: str, number: int) -> str:
    """One value: quoted text taken literally, or unquoted text up to a ` #` comment."""
    if rest[:1] in ("'", '"'):
        end = rest.find(rest[0], 1)
        if end < 0:
            raise EnvFileError(f"line {number}: the quote that opens {rest!r} is never closed")
        after = rest[end + 1:].strip()
        if after and not after.startswith("#"):
            raise EnvFileError(f"line {number}: {after!r} follows the closing quote")
        return rest[1:end]
    comment = _COMMENT.search(rest)
    return (rest[:comment.start()] if comment else rest).rstrip()


def read_env_file(path: str) -> dict[str, str]:
    """Read and parse a .env file; errors name the file and the line."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        return parse_env_file(text)
    except EnvFileError as exc:
        raise EnvFileError(f"{path}, {exc}") from exc


def env_file_conflict(env_path: str | None, env: Mapping[str, str]) -> str | None:
    """Why a service's env_file and its own env cannot both be used, or None (also while the
    file is not there yet): a name set in both. The runtimes disagree on which wins (systemd's
    EnvironmentFile= beats Environment=, Compose and the supervisor let env win), so a name is
    set in one place only and the box runs the same under each. Parse errors raise."""
    if env_path is None or not os.path.exists(env_path):
        return None
    both = sorted(set(read_env_file(env_path)) & set(env))
    if not both:
        return None
    return (f"{env_path} sets {', '.join(both)}, which the service's env sets too; set each "
            "name in one place (remove it from the file, or render the service again)")


# ---------------------------------------------------------------- services.json

_SERVICE_NAME = re.compile(r"[a-z0-9_.-]+")


DEFAULT_HEALTH_TIMEOUT_S = 1200.0


class ServicesError(ValueError):
    """A services.json that cannot be run; the message names the service and the field."""


@dataclass(frozen=True)
class Service:
    """One service of services.json; its relative paths are relative to base_dir."""

    name: str
    argv: tuple[str, ...]
    base_dir: str
    cwd: str = "."
    env: Mapping[str, str] = field(default_factory=dict)
    env_file: str = ""
    pidfile: str = ""
    log: str = ""
    watch: tuple[str, ...] = ()
    # Start order on unified-memory boxes, one start-up peak at a time: the services that must
    # be healthy before this one starts, and the URL that says this one is (its peak is over).
    after: tuple[str, ...] = ()
    health: str = ""
    health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S

    def path(self, relative: str) -> str:
        """A path of services.json made absolute against its directory."""
        return os.path.normpath(os.path.join(self.base_dir, relative))

    @property
    def workdir(self) -> str:
        """The absolute working directory."""
        return self.path(self.cwd)

    @property
    def env_path(self) -> str | None:
        """The absolute env_file, or None when the service has none."""
        return self.path(self.env_file) if self.env_file else None

    @property
    def pidfile_name(self) -> str:
        """The monitor's pidfile name."""
        return self.pidfile or f"{self.name}.pid"

    @property
    def log_name(self) -> str:
        """The log file name."""
        return self.log or f"{self.name}.log"


@dataclass(frozen=True)
class ServicesFile:
    """A whole services.json: the box it was rendered for and its services."""

    base_dir: str
    host: str
    services: tuple[Service, ...]


def _field(entry: Mapping, key: str, kind: type, where: str, default: object = None):
    value = entry.get(key, default)
    if not isinstance(value, kind):
        raise ServicesError(f"{where}: field {key!r} must be a {kind.__name__}, got {value!r}")
    return value


def _strings(entry: Mapping, key: str, where: str) -> tuple[str, ...]:
    value = _field(entry, key, list, where, [])
    if not all(isinstance(item, str) for item in value):
        raise ServicesError(f"{where}: field {key!r} must be a list of strings")
    return tuple(value)


def _bare_name(entry: Mapping, key: str, where: str) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str) or "/" in value:
        raise ServicesError(f"{where}: field {key!r} must be a bare file name")
    return value


def _service(entry: object, base_dir: str, index: int) -> Service:
    if not isinstance(entry, Mapping):
        raise ServicesError(f"services[{index}]: must be an object")
    name = _field(entry, "name", str, f"services[{index}]")
    where = f"service {name!r}"
    if not _SERVICE_NAME.fullmatch(name):
        raise ServicesError(f"{where}: field 'name' may hold only a-z, 0-9, '-', '_' and '.'")
    argv = _strings(entry, "argv", where)
    if not argv:
        raise ServicesError(f"{where}: field 'argv' must be a non-empty list of strings")
    env = _field(entry, "env", Mapping, where, {})
    for key, value in env.items():
        if not _ENV_NAME.fullmatch(key) or not isinstance(value, str):
            raise ServicesError(f"{where}: field 'env' must map names to strings, "
                                f"got {key!r}: {value!r}")
    health = _field(entry, "health", str, where, "")
    if health and not health.startswith("http://"):
        raise ServicesError(f"{where}: field 'health' must be an http:// URL, got {health!r}")
    timeout = entry.get("health_timeout_s", DEFAULT_HEALTH_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ServicesError(f"{where}: field 'health_timeout_s' must be a positive number of "
                            f"seconds, got {timeout!r}")
    return Service(
        name=name,
        argv=argv,
        base_dir=base_dir,
        cwd=_field(entry, "cwd", str, where, "."),
        env=dict(env),
        env_file=_field(entry, "env_file", str, where, ""),
        pidfile=_bare_name(entry, "pidfile", where),
        log=_bare_name(entry, "log", where),
        watch=_strings(entry, "watch", where),
        after=_strings(entry, "after", where),
        health=health,
        health_timeout_s=float(timeout),
    )


def parse_services(document: object, base_dir: str) -> ServicesFile:
    """A services.json document checked and typed; base_dir is the directory that holds it."""
    entries = document.get("services") if isinstance(document, Mapping) else None
    if not isinstance(entries, list):
        raise ServicesError("expected an object with a 'services' list")
    host = document.get("host", "")
    if not isinstance(host, str):
        raise ServicesError(f"field 'host' must be a str, got {host!r}")
    services = tuple(_service(entry, base_dir, i) for i, entry in enumerate(entries))
    names = [s.name for s in services]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ServicesError(f"duplicate service names {duplicates}")
    _check_order(services)
    return ServicesFile(base_dir=base_dir, host=host, services=services)


def _check_order(services: tuple[Service, ...]) -> None:
    """Each service's `after` names services listed before it that have a health URL: the
    file's order is the start order, and a start waits only on a health it can check."""
    seen: dict[str, Service] = {}
    for service in services:
        for name in service.after:
            if name not in seen or not seen[name].health:
                raise ServicesError(f"service {service.name!r}: field 'after' names {name!r}, "
                                    "which is not a service with a 'health' URL listed before it")
        seen[service.name] = service


def load_services(path: str) -> ServicesFile:
    """Read and check services.json; its relative paths are relative to its own directory."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ServicesError(f"{path}: cannot read services file: {exc}") from exc
    try:
        return parse_services(document, os.path.dirname(os.path.abspath(path)))
    except ServicesError as exc:
        raise ServicesError(f"{path}: {exc}") from exc


def select(services: Iterable[Service], names: Iterable[str] = (),
           exclude: Iterable[str] = ()) -> list[Service]:
    """The services named (all when names is empty), less the excluded ones."""
    services = list(services)
    chosen, skipped = set(names), set(exclude)
    known = {s.name for s in services}
    unknown = sorted(chosen - known)
    if unknown:
        raise ServicesError(f"services {unknown} are not in services.json; it lists "
                            f"{sorted(known)}")
    return [s for s in services if (not chosen or s.name in chosen) and s.name not in skipped]


# ---------------------------------------------------------------- what decides a restart

_BYTECODE = (".pyc", ".pyo")


def tree_digest(root: str) -> str:
    """A short digest of every file under root, names and bytes (bytecode left out)."""
    digest = hashlib.sha256()
    _hash_tree(digest, root)
    return digest.hexdigest()[:16]


def _hash_tree(digest, root: str) -> None:
    """Feed a file's bytes, or every file under a directory (names too), to digest."""
    if os.path.isfile(root):
        with open(root, "rb") as handle:
            digest.update(handle.read())
        return
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(folder, name)
            if name.endswith(_BYTECODE) or not os.path.isfile(path):
                continue
            digest.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as handle:
                digest.update(handle.read())


def inputs_fingerprint(service: Service, extra_watch: Iterable[str] = ()) -> str:
    """A digest of the content a service reads at start: its env_file and watched paths."""
    digest = hashlib.sha256()
    paths = [service.env_file] if service.env_file else []
    for path in paths + list(service.watch) + list(extra_watch):
        digest.update(path.encode())
        absolute = service.path(path)
        if os.path.exists(absolute):
            _hash_tree(digest, absolute)
    return digest.hexdigest()[:16]


def fingerprint(service: Service, extra_watch: Iterable[str] = ()) -> str:
    """A digest of everything whose change restarts a service: argv, cwd, env and inputs."""
    described = {
        "argv": list(service.argv),
        "cwd": service.workdir,
        "env": dict(service.env),
        "env_file": service.env_path,
        "inputs": inputs_fingerprint(service, extra_watch),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- a failing service's log

# A service that exits or never becomes healthy is reported with why, which is in its log (the
# gateway's one-line start-up errors, a traceback). The log may hold what the service printed of
# its environment, so every secret value of that environment is replaced before a line leaves
# the box in a failure message. Both runtimes quote logs so: the supervisor's and compose's.

LOG_TAIL_LINES = 15
# Read from the end: a log may be large, its last lines never are.
_LOG_TAIL_BYTES = 16 * 1024
# A line longer than this is cut (after masking, so no secret is cut in two).
_LOG_LINE_CHARS = 400
MASK = "********"


def secret_values(env: Mapping[str, str], is_secret: Callable[[str], bool]) -> set[str]:
    """Every secret value of an environment (`is_secret`: the contract's is_secret_env): each
    secret variable's whole value and, for a list of keys (`k1,k2` or GATEWAY_CLIENT_KEYS'
    `name=key:class`), each key in it."""
    secrets = set()
    for name, value in env.items():
        if not is_secret(name):
            continue
        secrets.add(value.strip())
        for item in value.split(","):
            secrets.add(item.split("=", 1)[-1].split(":", 1)[0].strip())
    secrets.discard("")
    return secrets


def env_file_secrets(path: str, is_secret: Callable[[str], bool]) -> set[str]:
    """The secret values of a .env file; none when it is missing or does not parse (then
    nothing started from it)."""
    try:
        return secret_values(read_env_file(path), is_secret)
    except (OSError, EnvFileError):
        return set()


def service_secrets(service: Service, is_secret: Callable[[str], bool]) -> set[str]:
    """The secret values of a service's own env and of its env_file."""
    secrets = secret_values(service.env, is_secret)
    if service.env_path is not None:
        secrets |= env_file_secrets(service.env_path, is_secret)
    return secrets


def log_quote(path: str, tail: str) -> str:
    """Where a failed service's log is and how it ends (masked_tail's), as failures say it."""
    return f"its log {path} ends:\n{tail}" if tail else f"its log {path} is empty or missing"


def masked_tail(path: str, secrets: Iterable[str], lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of the log at `path`, each secret replaced by MASK; "" when
    the log is missing or empty."""
    try:
        with open(path, "rb") as log:
            start = max(0, log.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES)
            log.seek(start)
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return ""
    for secret in sorted(secrets, key=len, reverse=True):  # a key inside another: longest first
        text = text.replace(secret, MASK)
    kept = text.splitlines()
    if start > 0:
        kept = kept[1:]  # read from mid-line: its start, and any secret there, was cut off
    return "\n".join(line[:_LOG_LINE_CHARS] for line in kept[-lines:])
