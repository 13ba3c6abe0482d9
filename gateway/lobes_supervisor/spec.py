"""services.json -> typed service specs, and the fingerprint that decides a restart."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_.")


class SpecError(ValueError):
    """A services.json that cannot be supervised; the message names the service and field."""


@dataclass(frozen=True)
class ServiceSpec:
    """One supervised process: what to run, where, with which environment and files."""

    name: str
    argv: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str] = field(default_factory=dict)
    env_file: Path | None = None
    pidfile: str = ""
    log: str = ""
    watch: tuple[Path, ...] = ()

    @property
    def pidfile_name(self) -> str:
        return self.pidfile or f"{self.name}.pid"

    @property
    def log_name(self) -> str:
        return self.log or f"{self.name}.log"


def parse_env_file(text: str) -> dict[str, str]:
    """Parse the dotenv subset the gateway uses: KEY=VALUE, comments, optional quotes."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def _require(entry: Mapping, key: str, kind: type, where: str):
    value = entry.get(key)
    if not isinstance(value, kind):
        raise SpecError(f"{where}: field {key!r} must be a {kind.__name__}, got {value!r}")
    return value


def _service(entry: object, base: Path, index: int) -> ServiceSpec:
    if not isinstance(entry, Mapping):
        raise SpecError(f"services[{index}]: must be an object")
    name = _require(entry, "name", str, f"services[{index}]")
    where = f"service {name!r}"
    if not name or not set(name) <= _NAME_CHARS:
        raise SpecError(f"{where}: field 'name' may hold only a-z, 0-9, '-', '_' and '.'")
    argv = _require(entry, "argv", list, where)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise SpecError(f"{where}: field 'argv' must be a non-empty list of strings")
    env = entry.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise SpecError(f"{where}: field 'env' must map names to strings")
    env_file = entry.get("env_file")
    watch = entry.get("watch", [])
    if not isinstance(watch, list):
        raise SpecError(f"{where}: field 'watch' must be a list of paths")
    for key in ("pidfile", "log"):
        value = entry.get(key, "")
        if not isinstance(value, str) or "/" in value:
            raise SpecError(f"{where}: field {key!r} must be a bare file name")
    return ServiceSpec(
        name=name,
        argv=tuple(argv),
        cwd=base / entry.get("cwd", "."),
        env=dict(env),
        env_file=base / env_file if env_file else None,
        pidfile=entry.get("pidfile", ""),
        log=entry.get("log", ""),
        watch=tuple(base / w for w in watch),
    )


def load_services(path: Path, extra_watch: Iterable[Path] = ()) -> list[ServiceSpec]:
    """Read services.json; relative paths in it are relative to its own directory."""
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{path}: cannot read services file: {exc}") from exc
    entries = document.get("services") if isinstance(document, Mapping) else None
    if not isinstance(entries, list):
        raise SpecError(f"{path}: expected an object with a 'services' list")
    base = path.resolve().parent
    extra = tuple(Path(p) for p in extra_watch)
    specs = [_service(entry, base, i) for i, entry in enumerate(entries)]
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(f"{path}: duplicate service names {duplicates}")
    return [_with_watch(s, extra) for s in specs]


def _with_watch(spec: ServiceSpec, extra: tuple[Path, ...]) -> ServiceSpec:
    if not extra:
        return spec
    return ServiceSpec(**{**spec.__dict__, "watch": spec.watch + extra})


def child_environment(spec: ServiceSpec, inherited: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: a few inherited basics, then env_file, then the spec's env."""
    env = {k: v for k, v in inherited.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TZ")}
    env.setdefault("PATH", os.defpath)
    env["PYTHONUNBUFFERED"] = "1"
    if spec.env_file is not None:
        env.update(parse_env_file(spec.env_file.read_text()))
    env.update(spec.env)
    return env


def _hash_tree(digest: hashlib._Hash, root: Path) -> None:
    if root.is_file():
        digest.update(root.read_bytes())
        return
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())


def fingerprint(spec: ServiceSpec) -> str:
    """A digest of everything that, when changed, requires the service to restart."""
    digest = hashlib.sha256()
    described = {
        "argv": spec.argv,
        "cwd": str(spec.cwd),
        "env": dict(sorted(spec.env.items())),
        "env_file": str(spec.env_file) if spec.env_file else None,
    }
    digest.update(json.dumps(described, sort_keys=True).encode())
    if spec.env_file is not None and spec.env_file.exists():
        digest.update(spec.env_file.read_bytes())
    for path in spec.watch:
        if path.exists():
            _hash_tree(digest, path)
    return digest.hexdigest()[:16]
