"""services.json -> systemd unit texts for the process runtime on boxes where systemd runs.

Pure functions apart from reading the files whose content is part of a unit's fingerprint; the
systemd_units module writes the texts. A unit carries an "inputs" fingerprint (its .env and
watched source) in a comment, so new code or a new .env changes the unit text and restarts it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

_UNIT_CHARS = re.compile(r"[^A-Za-z0-9:_.-]")
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_./:=+,@-]+$")
RESTART_SEC = 2


@dataclass(frozen=True)
class UnitLayout:
    """Where one box's units point: the services.json directory, its logs, its unit names."""

    base_dir: str
    log_dir: str
    prefix: str
    host: str = ""


class UnitError(ValueError):
    """A service that cannot become a unit; the message names the service and the field."""


def unit_prefix(name: str) -> str:
    """A unit name prefix from a box name: characters systemd rejects become '-'."""
    cleaned = _UNIT_CHARS.sub("-", name).strip("-")
    if not cleaned:
        raise UnitError(f"unit prefix {name!r} holds no character a unit name allows")
    return cleaned


def prefix_marker(prefix: str) -> str:
    """The comment that ties a unit to its box: a prefix may be another box's prefix plus '-x'."""
    return f"# prefix: {unit_prefix(prefix)}"


def unit_name(prefix: str, service: str) -> str:
    """The unit of one service: <prefix>-<service>.service."""
    return f"{unit_prefix(prefix)}-{service}.service"


def _escape(text: str) -> str:
    """Escape systemd specifiers; a literal newline can never be part of a setting."""
    if "\n" in text:
        raise UnitError(f"value {text!r} holds a newline")
    return text.replace("%", "%%")


def _quote(word: str, *, exec_line: bool) -> str:
    word = _escape(word)
    if exec_line:
        # ExecStart expands $VAR and ${VAR}: a literal dollar is doubled.
        word = word.replace("$", "$$")
    if _PLAIN_WORD.match(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _absolute(base: str, path: str) -> str:
    return os.path.normpath(os.path.join(base, path))


def _hash_tree(digest, root: str) -> None:
    if os.path.isfile(root):
        with open(root, "rb") as handle:
            digest.update(handle.read())
        return
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as handle:
                digest.update(handle.read())


def inputs_fingerprint(service: dict, base_dir: str, extra_watch: tuple = ()) -> str:
    """A digest of the content a service reads at start: its env_file and watched paths."""
    digest = hashlib.sha256()
    paths = ([service["env_file"]] if service.get("env_file") else [])
    paths += list(service.get("watch", [])) + list(extra_watch)
    for path in paths:
        absolute = _absolute(base_dir, path)
        digest.update(path.encode())
        if os.path.exists(absolute):
            _hash_tree(digest, absolute)
    return digest.hexdigest()[:16]


def _check(service: object, index: int) -> dict:
    if not isinstance(service, dict) or not isinstance(service.get("name"), str):
        raise UnitError(f"services[{index}]: needs a 'name' string")
    argv = service.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise UnitError(f"service {service['name']!r}: field 'argv' must be a non-empty list "
                        "of strings")
    env = service.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise UnitError(f"service {service['name']!r}: field 'env' must map names to strings")
    return service


def render_unit(service: dict, layout: UnitLayout, fingerprint: str) -> str:
    """The unit text of one service of services.json."""
    name = service["name"]
    cwd = _absolute(layout.base_dir, service.get("cwd", "."))
    log = os.path.join(layout.log_dir, service.get("log") or f"{name}.log")
    box = f" on {layout.host}" if layout.host else ""
    lines = [
        "# Written by lobes.fleet (systemd_units); edits are overwritten on the next run.",
        prefix_marker(layout.prefix),
        f"# inputs: {fingerprint}",
        "[Unit]",
        f"Description=lobes.fleet {_escape(name)}{_escape(box)}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"WorkingDirectory={_escape(cwd)}",
    ]
    if service.get("env_file"):
        lines.append(f"EnvironmentFile={_escape(_absolute(layout.base_dir, service['env_file']))}")
    env = {"PYTHONUNBUFFERED": "1", **service.get("env", {})}
    lines += [f"Environment={_quote(f'{k}={v}', exec_line=False)}" for k, v in sorted(env.items())]
    lines += [
        "ExecStart=" + " ".join(_quote(word, exec_line=True) for word in service["argv"]),
        "Restart=on-failure",
        f"RestartSec={RESTART_SEC}",
        f"StandardOutput=append:{_escape(log)}",
        f"StandardError=append:{_escape(log)}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def select(services: list, names: list, exclude: list) -> list:
    """The services named (all when names is empty), less the excluded ones."""
    known = {s["name"] for s in services}
    unknown = sorted(set(names) - known)
    if unknown:
        raise UnitError(f"services {unknown} are not in services.json; it lists {sorted(known)}")
    return [s for s in services
            if (not names or s["name"] in names) and s["name"] not in exclude]


def render_units(document: dict, layout: UnitLayout, names: list = (), exclude: list = (),
                 extra_watch: tuple = ()) -> dict:
    """Unit name -> unit text for the selected services of a services.json document."""
    services = document.get("services") if isinstance(document, dict) else None
    if not isinstance(services, list):
        raise UnitError("services.json: expected an object with a 'services' list")
    checked = [_check(s, i) for i, s in enumerate(services)]
    return {
        unit_name(layout.prefix, s["name"]): render_unit(
            s, layout, inputs_fingerprint(s, layout.base_dir, extra_watch))
        for s in select(checked, list(names), list(exclude))
    }
