"""services.json -> systemd unit texts for the process runtime on boxes where systemd runs.

Pure functions apart from reading the files whose content is part of a unit's fingerprint; the
systemd_units module writes the texts. A unit carries an "inputs" fingerprint (its .env and
watched source) in a comment, so new code or a new .env changes the unit text and restarts it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ansible_collections.lobes.fleet.plugins.module_utils.service_files import (
    Service,
    env_file_conflict,
    inputs_fingerprint,
    parse_services,
    select,
)

_UNIT_CHARS = re.compile(r"[^A-Za-z0-9:_.-]")
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_./:=+,@-]+\Z")
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


def _ordering(service: Service, layout: UnitLayout) -> list:
    """After= and Requires= on the services that must be healthy first (the start order)."""
    before = " ".join(unit_name(layout.prefix, name) for name in service.after)
    lines = [f"After=network-online.target{' ' + before if before else ''}",
             "Wants=network-online.target"]
    if before:
        lines.append(f"Requires={before}")
    return lines


def _health_wait(service: Service) -> list:
    """The unit is active only once the service is healthy: units ordered after it wait."""
    if not service.health:
        return []
    wait = [service.argv[0], "-m", "lobes_supervisor.health", service.health,
            f"{service.health_timeout_s:g}"]
    return ["ExecStartPost=" + " ".join(_quote(word, exec_line=True) for word in wait),
            f"TimeoutStartSec={service.health_timeout_s + 30:g}"]


def render_unit(service: Service, layout: UnitLayout, fingerprint: str) -> str:
    """The unit text of one service of services.json."""
    name = service.name
    log = os.path.join(layout.log_dir, service.log_name)
    box = f" on {layout.host}" if layout.host else ""
    lines = [
        "# Written by lobes.fleet (systemd_units); edits are overwritten on the next run.",
        prefix_marker(layout.prefix),
        f"# inputs: {fingerprint}",
        "[Unit]",
        f"Description=lobes.fleet {_escape(name)}{_escape(box)}",
        *_ordering(service, layout),
        "",
        "[Service]",
        "Type=simple",
        f"WorkingDirectory={_escape(service.workdir)}",
    ]
    if service.env_path:
        lines.append(f"EnvironmentFile={_escape(service.env_path)}")
    env = {"PYTHONUNBUFFERED": "1", **service.env}
    lines += [f"Environment={_quote(f'{k}={v}', exec_line=False)}" for k, v in sorted(env.items())]
    lines += [
        "ExecStart=" + " ".join(_quote(word, exec_line=True) for word in service.argv),
        *_health_wait(service),
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


def render_units(document: dict, layout: UnitLayout, names: list = (), exclude: list = (),
                 extra_watch: tuple = ()) -> dict:
    """Unit name -> unit text for the selected services of a services.json document."""
    services = select(parse_services(document, layout.base_dir).services, names, exclude)
    for service in services:
        conflict = env_file_conflict(service.env_path, service.env)
        if conflict:
            raise ValueError(f"service {service.name!r}: field 'env_file': {conflict}")
    return {
        unit_name(layout.prefix, s.name): render_unit(s, layout, inputs_fingerprint(s, extra_watch))
        for s in services
    }
