"""Inventory variables (fleet_*) of each host -> typed, frozen declarations, through the schema.

Every value is read by its field's kind (schema.py) and every refusal is collected: a host's
declaration comes back with all of them, never only the first. Whether the mesh can work is
plan.py's question; a declaration marked damaged is left out of it, so one mistake is reported
once and not again as the errors it would cause further on.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from ansible_collections.lobes.fleet.plugins.module_utils.contract import (
    AUDIO_TASKS,
    CLIENT_NAME,
    DEFAULT_GATEWAY_PORT,
    OWNERS,
    POOL,
    PROXY,
    REFER,
    RESERVED_CLIENT_NAMES,
    ROLE_NAMES,
    SERVED_NAME,
    TUNABLES,
    http_origin,
    role_index,
    role_spec,
)
from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import PROFILES
from ansible_collections.lobes.fleet.plugins.module_utils.schema import (
    BOX_FIELDS,
    CLIENT_KEY_FIELDS,
    DEFAULT_GEAR_PORT_BASE,
    POOL_RATE,
    ROLE_FIELDS,
    Field,
    Refused,
    closest,
    shown,
)

# The inventory field that names a role's peers -> the route mode it declares.
_PEER_MODES = {"referral": REFER, "proxy": PROXY, "pool": POOL, "owners": OWNERS}
PEER_FIELDS = tuple(_PEER_MODES)


class Unreadable:
    """A variable whose value could not be read on the controller (a template that does not
    resolve, a vault value without its password): why, without the raw error's noise."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return "<unreadable>"


@dataclass(frozen=True)
class RoleDecl:
    """One role as a host declares it: served here, or which peers serve it and how."""

    role: str
    feasible: bool
    checkpoint: str | None = None
    revision: str | None = None  # the checkpoint's hub revision, pinned here
    served_name: str | None = None
    context: int | None = None
    native_context: int | None = None
    yarn_factor: float | None = None
    gpu_memory_utilization: float | None = None
    max_active: int | None = None
    mtp: bool | None = None
    num_speculative_tokens: int | None = None
    tool_parser: str | None = None
    quantization: str | None = None
    sim_profile: str | None = None
    engine: str | None = None
    referral: str | None = None
    proxy: str | None = None
    pool: tuple = ()
    owners: tuple = ()
    rates: tuple = ()  # ((peer hostname, tok/s), ...) in declaration order
    # A pool's streams continue on another replica when theirs dies: on unless declared off.
    stream_resume: bool | None = None
    kv_cache_gib: int | None = None  # vLLM's CPU build: its KV cache (VLLM_CPU_KVCACHE_SPACE)

    @property
    def peer_field(self) -> str | None:
        """The field that names this role's peers: referral, proxy, pool, owners, or None."""
        return next((name for name in PEER_FIELDS if getattr(self, name)), None)

    @property
    def peer_mode(self) -> str | None:
        """The route mode the peer field declares (contract's REFER, PROXY, POOL, OWNERS)."""
        return _PEER_MODES.get(self.peer_field)


@dataclass(frozen=True)
class ClientKeyDecl:
    """One named client key of a box's gateway; the key itself stays in the vault."""

    name: str
    priority: str
    inflight_limit: int | None = None


@dataclass(frozen=True)
class BoxDecl:
    """One host's fleet_* variables, typed."""

    host: str
    hardware: str
    runtime: str = "compose"
    gateway_port: int = DEFAULT_GATEWAY_PORT
    gateway_host: str = "0.0.0.0"
    origin: str = ""
    has_api_key: bool = False
    has_mesh_key: bool = False
    roles: tuple = ()  # RoleDecl, in catalog order
    aliases: tuple = ()  # ((alias, target), ...)
    force_strict_tools: bool = False
    private_status: bool = False  # GATEWAY_PRIVATE_STATUS: /status and /capabilities need a key
    tuning: tuple = ()  # ((ENV_NAME, value), ...)
    default_model: str | None = None
    headroom_gib: float | None = None
    gear_image: str | None = None
    gear_port_base: int = DEFAULT_GEAR_PORT_BASE
    sim_time_scale: float = 1.0
    python: str = "python3"
    hf_cache: str = "/var/lib/lobes/hf-cache"
    audio_image: str | None = None
    gateway_image: str = "python:3.12-slim"
    gear_engine: str | None = None
    sim_image: str | None = None
    proc_root: str | None = None  # a fake /proc (tests): sim gears hold their shares in it
    # vLLM's CPU build on the box: its venvs, and the checkpoints it loads (<model_dir>/<name>).
    engine_dir: str = "/var/lib/lobes/engines"
    model_dir: str = "/var/lib/lobes/models"
    images_from: str = "registry"  # or "boxes": the gears' images are copied box to box
    require_pins: bool = False  # fleet_models_require_pins: an unpinned gear is refused
    client_keys: tuple = ()  # ClientKeyDecl, by name
    pool_policy: str | None = None  # GATEWAY_POOL_POLICY; None: the gateway's default
    monitoring_host: str | None = None
    monitoring_listen: str | None = None
    # A box-level variable was refused: the box is left out of the mesh checks.
    damaged: bool = False
    # Roles with a refused field or declaration: left out of the checks of the mesh.
    damaged_roles: frozenset = field(default_factory=frozenset)

    def role(self, name: str) -> RoleDecl | None:
        for decl in self.roles:
            if decl.role == name:
                return decl
        return None


class _Reading:
    """The refusals found while reading one host, and the reads that note them."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.errors: list = []

    def fail(self, role: str | None, name: str, message: str, **details) -> None:
        self.errors.append(FleetError(self.host, role, name, message, **details))

    def value(self, spec: Field, value: object, role: str | None = None, name: str = ""):
        """`value` read by its field's kind; None when unset or refused (the refusal noted)."""
        name = name or spec.name
        if value is None:
            if spec.required:
                self.fail(role, name, "is required", allowed=spec.kind.describe())
            return None
        if isinstance(value, Unreadable):
            self.fail(role, name, f"cannot be read: {value.reason}")
            return None
        try:
            return spec.kind.read(value)
        except Refused as refused:
            self.fail(role, name, refused.reason,
                      value=refused.shown_as or shown(value, spec.secret),
                      allowed=spec.kind.describe(), suggestion=refused.suggestion)
            return None


def read_box(host: str, hostvars: dict) -> tuple:
    """(BoxDecl, [FleetError]): one host's variables read, every refusal collected."""
    reading = _Reading(host)
    values = {}
    for name, value in hostvars.items():
        if name == "group_names":
            continue
        spec = BOX_FIELDS.get(name)
        if spec is None:
            reading.fail(None, name, "is not a fleet variable",
                         suggestion=closest(name, BOX_FIELDS))
            continue
        values[name] = reading.value(spec, value)
    _check_hardware_groups(reading, values.get("fleet_hardware"), hostvars)
    roles, damaged_roles = _read_roles(reading, values.get("fleet_roles") or {})
    client_keys = _read_client_keys(reading, values)
    aliases = _read_aliases(reading, values.get("fleet_gateway_aliases") or {})
    tuning = _read_tuning(reading, values.get("fleet_gateway_tuning") or {})
    _check_gate(reading, values, hostvars)
    # Any refusal outside a role leaves the box out of the mesh checks: its peers would
    # otherwise be told of errors that are only this one's consequences.
    damaged = any(error.role is None for error in reading.errors)
    return _box(host, values, roles, client_keys, aliases, tuning, damaged,
                damaged_roles), reading.errors


def _box(host, values, roles, client_keys, aliases, tuning, damaged, damaged_roles) -> BoxDecl:
    def get(name, default=None):
        value = values.get(name)
        return default if value is None else value

    port = get("fleet_gateway_port", DEFAULT_GATEWAY_PORT)
    return BoxDecl(
        host=host,
        hardware=get("fleet_hardware", ""),
        runtime=get("fleet_runtime", "compose"),
        gateway_port=port,
        gateway_host=get("fleet_gateway_host", "0.0.0.0"),
        origin=get("fleet_origin") or http_origin(get("ansible_host", host), port),
        has_api_key=bool(values.get("fleet_gateway_api_key")),
        has_mesh_key=bool(values.get("fleet_mesh_key")),
        roles=roles,
        aliases=aliases,
        force_strict_tools=get("fleet_gateway_force_strict_tools", False),
        private_status=get("fleet_gateway_private_status", False),
        tuning=tuning,
        default_model=get("fleet_default_model"),
        headroom_gib=get("fleet_memory_headroom_gib"),
        gear_image=get("fleet_gear_image"),
        gear_port_base=get("fleet_gear_port_base", DEFAULT_GEAR_PORT_BASE),
        sim_time_scale=get("fleet_sim_time_scale", 1.0),
        python=get("fleet_python", "python3"),
        hf_cache=get("fleet_hf_cache", "/var/lib/lobes/hf-cache"),
        audio_image=get("fleet_audio_image"),
        gateway_image=get("fleet_gateway_image", "python:3.12-slim"),
        gear_engine=get("fleet_gear_engine"),
        sim_image=get("fleet_sim_image"),
        proc_root=get("fleet_proc_root"),
        engine_dir=get("fleet_engine_dir", "/var/lib/lobes/engines"),
        model_dir=get("fleet_model_dir", "/var/lib/lobes/models"),
        images_from=get("fleet_images_from", "registry"),
        require_pins=get("fleet_models_require_pins", False),
        client_keys=client_keys,
        pool_policy=get("fleet_gateway_pool_policy"),
        monitoring_host=get("fleet_monitoring_host"),
        monitoring_listen=get("fleet_monitoring_listen_address"),
        damaged=damaged,
        damaged_roles=frozenset(damaged_roles),
    )


def _check_hardware_groups(reading: _Reading, hardware: str | None, hostvars: dict) -> None:
    """One hardware group per host, and the profile it names is the host's fleet_hardware."""
    groups = hostvars.get("group_names") or []
    hardware_groups = sorted(set(groups) & set(PROFILES))
    if len(hardware_groups) > 1:
        reading.fail(None, "fleet_hardware", "the host is in more than one hardware group, "
                     f"{' and '.join(hardware_groups)}; put it in one")
    elif hardware_groups and hardware and hardware_groups[0] != hardware:
        reading.fail(None, "fleet_hardware", f"is {hardware!r} but the host is in the hardware "
                     f"group {hardware_groups[0]}; move the host, or fix the group's vars")
    elif hostvars.get("fleet_hardware") is None:
        near = [name for name in (closest(group, PROFILES) for group in groups) if name]
        where = f" (its groups: {', '.join(groups)})" if groups else ""
        in_group = (f"the host is in the group {hardware_groups[0]}, whose vars must set it"
                    if hardware_groups else f"the host is in no hardware group{where}")
        reading.fail(None, "fleet_hardware", f"is not set: {in_group}",
                     allowed=BOX_FIELDS["fleet_hardware"].kind.describe(),
                     suggestion=near[0] if near and not hardware_groups else None)


def _read_roles(reading: _Reading, roles: dict) -> tuple:
    """(RoleDecls in catalog order, names of the roles with a refusal)."""
    decls, damaged = [], set()
    for name, values in roles.items():
        before = len(reading.errors)
        if name not in ROLE_NAMES:
            reading.fail(str(name), "fleet_roles", "is not a catalog role",
                         allowed=", ".join(ROLE_NAMES), suggestion=closest(name, ROLE_NAMES))
            continue
        decl = _read_role(reading, name, values)
        if len(reading.errors) > before or decl is None:
            damaged.add(name)
        if decl is not None:
            decls.append(decl)
    return tuple(sorted(decls, key=lambda decl: role_index(decl.role))), damaged


def _read_role(reading: _Reading, role: str, values: object) -> RoleDecl | None:
    if values is None:
        values = {}
    if not isinstance(values, dict):
        reading.fail(role, "fleet_roles", "must be a mapping of role fields (`{}` for the "
                     "catalog's defaults)", value=shown(values))
        return None
    typed = {}
    for name, value in values.items():
        spec = ROLE_FIELDS.get(name)
        if spec is None:
            reading.fail(role, str(name), "is not a role field",
                         allowed=", ".join(ROLE_FIELDS), suggestion=closest(name, ROLE_FIELDS))
            continue
        typed[name] = reading.value(spec, value, role)
    rates = _read_rates(reading, role, typed.pop("rates", None) or {})
    declared = [name for name in PEER_FIELDS if typed.get(name)]
    if len(declared) > 1:
        reading.fail(role, declared[1], "declare one of referral, proxy, pool or owners, not "
                     + " and ".join(declared))
    if typed.get("pool") and role_spec(role).task in AUDIO_TASKS:
        reading.fail(role, "pool", "audio lanes are served here or proxied to one peer, never "
                     "pooled")
    feasible = typed.pop("feasible", None)
    if feasible is None:
        feasible = not declared
    fields = {name: value for name, value in typed.items() if value is not None}
    return RoleDecl(role=role, feasible=feasible, rates=rates, **fields)


def _read_rates(reading: _Reading, role: str, rates: dict) -> tuple:
    parsed = []
    for peer, rate in rates.items():
        number = reading.value(POOL_RATE, rate, role, f"rates.{peer}")
        if number is not None:
            parsed.append((str(peer), number))
    return tuple(parsed)


def _read_client_keys(reading: _Reading, values: dict) -> tuple:
    """fleet_client_keys: name -> {key (vault), class, inflight_limit}."""
    entries = values.get("fleet_client_keys") or {}
    if entries and not values.get("fleet_gateway_api_key"):
        reading.fail(None, "fleet_client_keys", "named client keys need the box's own key: set "
                     "fleet_gateway_api_key too")
    taken = [key for key in (values.get("fleet_gateway_api_key"), values.get("fleet_mesh_key"))
             if key]
    decls = []
    for name, entry in entries.items():
        typed = _read_client_key(reading, name, entry)
        if typed is None:
            continue
        key = typed.get("key")
        if key == "" or key in taken:
            reading.fail(None, f"fleet_client_keys.{name}.key", "is empty or not unique: give "
                         "each client its own key, distinct from fleet_gateway_api_key and "
                         "fleet_mesh_key")
        taken.append(key)
        decls.append(ClientKeyDecl(name, typed.get("class") or "standard",
                                   typed.get("inflight_limit")))
    return tuple(sorted(decls, key=lambda decl: decl.name))


def _read_client_key(reading: _Reading, name: object, entry: object) -> dict | None:
    """One named key's fields, typed; None when its name or shape is refused."""
    where = f"fleet_client_keys.{name}"
    refusal = CLIENT_NAME.refusal(name)
    if refusal:
        reading.fail(None, "fleet_client_keys", f"a key name {refusal}", value=shown(name),
                     allowed=CLIENT_NAME.describe())
        return None
    if name in RESERVED_CLIENT_NAMES:
        reading.fail(None, where, "is a name of the gateway's own callers; rename it",
                     allowed="any name but " + ", ".join(RESERVED_CLIENT_NAMES))
        return None
    if not isinstance(entry, dict):
        reading.fail(None, where, "must be a mapping of " + ", ".join(CLIENT_KEY_FIELDS),
                     value=shown(entry))
        return None
    typed = {}
    for field_name, value in entry.items():
        spec = CLIENT_KEY_FIELDS.get(field_name)
        if spec is None:
            reading.fail(None, f"{where}.{field_name}", "is not a client key field",
                         allowed=", ".join(CLIENT_KEY_FIELDS),
                         suggestion=closest(field_name, CLIENT_KEY_FIELDS))
            continue
        typed[field_name] = reading.value(spec, value, None, f"{where}.{field_name}")
    if entry.get("key") is None:
        reading.value(CLIENT_KEY_FIELDS["key"], None, None, f"{where}.key")
    return typed


def _read_aliases(reading: _Reading, aliases: dict) -> tuple:
    """fleet_gateway_aliases: alias -> target, both model names (no ',' or '=': GATEWAY_ALIASES
    writes them as alias=target,...); whether the target names a model is plan.py's."""
    pairs = []
    for alias, target in aliases.items():
        where = f"fleet_gateway_aliases.{alias}"
        refusal = SERVED_NAME.refusal(alias)
        if refusal:
            reading.fail(None, "fleet_gateway_aliases", f"an alias {refusal}",
                         value=shown(alias), allowed=SERVED_NAME.describe())
            continue
        refusal = SERVED_NAME.refusal(target)
        if refusal:
            reading.fail(None, where, f"the target {refusal}", value=shown(target),
                         allowed=SERVED_NAME.describe())
            continue
        pairs.append((alias, target))
    return tuple(sorted(pairs))


def _read_tuning(reading: _Reading, tuning: dict) -> tuple:
    pairs = []
    for name, value in tuning.items():
        where = f"fleet_gateway_tuning.{name}"
        if name not in TUNABLES:
            reading.fail(None, "fleet_gateway_tuning", f"{name!r} is not a tunable gateway "
                         "variable", allowed=", ".join(TUNABLES),
                         suggestion=closest(name, TUNABLES))
            continue
        problem = TUNABLES[name].problem(value)
        if problem:
            reading.fail(None, where, problem, value=shown(value),
                         allowed=TUNABLES[name].describe())
            continue
        pairs.append((name, value))
    return tuple(sorted(pairs))


def _check_gate(reading: _Reading, values: dict, hostvars: dict) -> None:
    """A gateway that answers without a key does so on purpose: an empty key, or none on a box
    other boxes reach, needs fleet_gateway_open; a key and the switch contradict each other."""
    declared = hostvars.get("fleet_gateway_api_key") is not None
    refused = [name for name in ("fleet_gateway_api_key", "fleet_gateway_open",
                                 "fleet_gateway_host")
               if hostvars.get(name) is not None and values.get(name) is None]
    if refused:
        return  # the refusal says it already
    key, is_open = values.get("fleet_gateway_api_key"), values.get("fleet_gateway_open")
    bind = values.get("fleet_gateway_host") or "0.0.0.0"
    if key and is_open:
        reading.fail(None, "fleet_gateway_open", "is true but fleet_gateway_api_key is set; "
                     "remove one of them")
    elif declared and not key and not is_open:
        reading.fail(None, "fleet_gateway_api_key", "is empty, which would turn the gate off; "
                     "set the key (from vault), or remove it and set fleet_gateway_open: true "
                     "if this gateway is meant to answer without one")
    elif not declared and not is_open and not ipaddress.ip_address(bind).is_loopback:
        reading.fail(None, "fleet_gateway_api_key", f"is not set and the gateway binds {bind}, "
                     "where other boxes reach it; set the key (from vault), or set "
                     "fleet_gateway_open: true if it is meant to answer without one")
