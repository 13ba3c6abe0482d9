"""Inventory variables (fleet_*) of each host -> typed, frozen declarations.

Only syntax and types are checked here; whether the mesh can work is plan.py's question.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ansible_collections.lobes.fleet.plugins.module_utils.contract import (
    DEFAULT_GATEWAY_PORT,
    OWNERS,
    POOL,
    POOL_POLICIES,
    PRIORITY_CLASSES,
    PROXY,
    REFER,
    ROLES_BY_NAME,
    TCP_PORTS,
    TUNABLE_ENV,
    TUNABLES,
    OriginError,
    finite_float,
    http_origin,
    parse_http_origin,
    role_index,
)
from ansible_collections.lobes.fleet.plugins.module_utils.engines import ENGINES
from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import PROFILES

RUNTIMES = ("compose", "process")
DEFAULT_GEAR_PORT_BASE = 18100

ROLE_FIELDS = (
    "feasible", "checkpoint", "served_name", "context", "native_context", "yarn_factor",
    "gpu_memory_utilization", "max_active", "mtp", "num_speculative_tokens", "tool_parser",
    "quantization", "sim_profile", "engine", "referral", "proxy", "pool", "owners", "rates",
    "stream_resume", "kv_cache_gib",
)


CLIENT_KEY_FIELDS = ("key", "class", "inflight_limit")
# The gateway's own callers: a named client key may not take their names.
RESERVED_CLIENT_NAMES = ("anonymous", "client", "fleet")
_CLIENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _number_text(text: str):
    """A number written as text, or the text unchanged when it is not one."""
    try:
        return float(text)
    except ValueError:
        return text


def _finite_number(value: object) -> float | None:
    """An inventory value (YAML, or text from --extra-vars) as a finite float; None when it is
    not one: a bool, not a number, nan or an infinity."""
    if isinstance(value, str):
        value = _number_text(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return finite_float(value)


# The inventory field that names a role's peers -> the route mode it declares.
_PEER_MODES = {"referral": REFER, "proxy": PROXY, "pool": POOL, "owners": OWNERS}


@dataclass(frozen=True)
class RoleDecl:
    """One role as a host declares it: served here, or which peers serve it and how."""

    role: str
    feasible: bool
    checkpoint: str | None = None
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
        declared = (("referral", self.referral), ("proxy", self.proxy), ("pool", self.pool),
                    ("owners", self.owners))
        return next((field for field, value in declared if value), None)

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
    runtime: str
    gateway_port: int
    gateway_host: str
    origin: str
    has_api_key: bool
    has_mesh_key: bool = False
    roles: tuple = ()  # RoleDecl, in catalog order
    aliases: tuple = ()  # ((alias, target), ...)
    force_strict_tools: bool = False
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
    client_keys: tuple = ()  # ClientKeyDecl, by name
    pool_policy: str | None = None  # GATEWAY_POOL_POLICY; None: the gateway's default

    def role(self, name: str) -> RoleDecl | None:
        for decl in self.roles:
            if decl.role == name:
                return decl
        return None


class _Reader:
    """Reads typed values from one mapping, raising FleetError that names where."""

    def __init__(self, host: str, role: str | None, values: dict, prefix: str = "") -> None:
        self.host = host
        self.role = role
        self.values = values
        self.prefix = prefix

    def fail(self, key: str, message: str) -> FleetError:
        return FleetError(self.host, self.role, self.prefix + key, message)

    def get(self, key: str, kind: type, default=None, *, required: bool = False):
        value = self.values.get(key)
        if value is None:
            if required:
                raise self.fail(key, "is required")
            return default
        return self._coerce(key, value, kind)

    def _coerce(self, key: str, value, kind: type):
        # Extra vars (-e key=value) arrive as strings: numbers and booleans written as text
        # are read as such, anything else is an error naming the field.
        if kind is bool:
            if isinstance(value, str) and value.lower() in _BOOL_WORDS:
                return _BOOL_WORDS[value.lower()]
            if isinstance(value, bool):
                return value
            raise self.fail(key, f"must be true or false, got {value!r}")
        if kind is int:
            if isinstance(value, str) and value.strip().isdigit():
                return int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(key, f"must be an integer, got {value!r}")
            return value
        if kind is float:
            number = _finite_number(value)
            if number is None:
                raise self.fail(key, f"must be a finite number, got {value!r}")
            return number
        if kind is str:
            if not isinstance(value, str) or not value:
                raise self.fail(key, f"must be a non-empty string, got {value!r}")
            return value
        if not isinstance(value, kind):
            raise self.fail(key, f"must be a {kind.__name__}, got {value!r}")
        return value


def parse_box(host: str, hostvars: dict) -> BoxDecl:
    """Read one host's fleet_* variables into a BoxDecl."""
    read = _Reader(host, None, hostvars)
    hardware = read.get("fleet_hardware", str, required=True)
    if hardware not in PROFILES:
        raise read.fail("fleet_hardware", f"unknown hardware {hardware!r}; one of "
                        + ", ".join(sorted(PROFILES)))
    runtime = read.get("fleet_runtime", str, "compose")
    if runtime not in RUNTIMES:
        raise read.fail("fleet_runtime", f"must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    port = read.get("fleet_gateway_port", int, DEFAULT_GATEWAY_PORT)
    if port not in TCP_PORTS:
        raise read.fail("fleet_gateway_port",
                        f"must be a TCP port ({TCP_PORTS[0]}-{TCP_PORTS[-1]}), got {port}")
    address = read.get("ansible_host", str, host)
    origin = read.get("fleet_origin", str, http_origin(address, port))
    try:
        parse_http_origin(origin)
    except OriginError as exc:  # the gateway would refuse it at start: say so in the plan
        raise read.fail("fleet_origin", str(exc)) from None
    if origin.endswith("/"):  # the origin names the box in peers' lists: one spelling
        raise read.fail("fleet_origin", f"{origin!r} ends in '/'; write it as http://host:port")
    return BoxDecl(
        host=host,
        hardware=hardware,
        runtime=runtime,
        gateway_port=port,
        gateway_host=read.get("fleet_gateway_host", str, "0.0.0.0"),
        origin=origin,
        has_api_key=bool(hostvars.get("fleet_gateway_api_key")),
        has_mesh_key=bool(hostvars.get("fleet_mesh_key")),
        roles=_parse_roles(host, read.get("fleet_roles", dict, {})),
        aliases=_parse_aliases(read),
        force_strict_tools=read.get("fleet_gateway_force_strict_tools", bool, False),
        tuning=_parse_tuning(read),
        default_model=read.get("fleet_default_model", str),
        headroom_gib=read.get("fleet_memory_headroom_gib", float),
        gear_image=read.get("fleet_gear_image", str),
        gear_port_base=read.get("fleet_gear_port_base", int, DEFAULT_GEAR_PORT_BASE),
        sim_time_scale=read.get("fleet_sim_time_scale", float, 1.0),
        python=read.get("fleet_python", str, "python3"),
        hf_cache=read.get("fleet_hf_cache", str, "/var/lib/lobes/hf-cache"),
        audio_image=read.get("fleet_audio_image", str),
        gateway_image=read.get("fleet_gateway_image", str, "python:3.12-slim"),
        gear_engine=_engine(read, "fleet_gear_engine"),
        sim_image=read.get("fleet_sim_image", str),
        proc_root=_proc_root(read),
        engine_dir=_absolute(read, "fleet_engine_dir", "/var/lib/lobes/engines"),
        model_dir=_absolute(read, "fleet_model_dir", "/var/lib/lobes/models"),
        client_keys=_parse_client_keys(read, bool(hostvars.get("fleet_gateway_api_key"))),
        pool_policy=_pool_policy(read),
    )


def _pool_policy(read: _Reader) -> str | None:
    policy = read.get("fleet_gateway_pool_policy", str)
    if policy is not None and policy not in POOL_POLICIES:
        raise read.fail("fleet_gateway_pool_policy", f"must be one of {', '.join(POOL_POLICIES)} "
                        f"({POOL_POLICIES[0]} when unset), got {policy!r}")
    return policy


def _absolute(read: _Reader, field: str, default: str) -> str:
    path = read.get(field, str, default)
    if not path.startswith("/"):
        raise read.fail(field, f"must be an absolute path, got {path!r}")
    return path


def _proc_root(read: _Reader) -> str | None:
    root = read.get("fleet_proc_root", str)
    if root is not None and not root.startswith("/"):
        raise read.fail("fleet_proc_root", f"must be an absolute path, got {root!r}")
    return root


def _engine(read: _Reader, field: str) -> str | None:
    engine = read.get(field, str)
    if engine is not None and engine not in ENGINES:
        raise read.fail(field, f"must be one of {', '.join(ENGINES)}, got {engine!r}")
    return engine


def _parse_aliases(read: _Reader) -> tuple:
    aliases = read.get("fleet_gateway_aliases", dict, {})
    for alias, target in aliases.items():
        if not isinstance(target, str) or not target or "," in str(alias) or "=" in str(alias):
            raise read.fail("fleet_gateway_aliases",
                            f"alias {alias!r} must map a plain name to a model name")
    return tuple(sorted((str(alias), target) for alias, target in aliases.items()))


def _parse_client_keys(read: _Reader, has_api_key: bool) -> tuple:
    """fleet_client_keys: name -> {key (vault), class, inflight_limit}; the key is only checked
    for presence (the plan action hands it over reduced to that)."""
    field = "fleet_client_keys"
    entries = read.get(field, dict, {})
    if entries and not has_api_key:
        raise read.fail(field, "named client keys need the box's own key: set "
                        "fleet_gateway_api_key too")
    decls = []
    for name, values in sorted(entries.items()):
        where = f"{field}.{name}"
        if not isinstance(name, str) or not _CLIENT_NAME.match(name):
            raise read.fail(field, f"{name!r} is not a key name (letters, digits, . _ -)")
        if name in RESERVED_CLIENT_NAMES:
            raise read.fail(where, "is a name of the gateway's own callers; rename it")
        entry = _Reader(read.host, None, values if isinstance(values, dict) else {}, where + ".")
        unknown = sorted(set(entry.values) - set(CLIENT_KEY_FIELDS))
        if not isinstance(values, dict) or unknown:
            raise read.fail(where, "must be a mapping of " + ", ".join(CLIENT_KEY_FIELDS))
        if not values.get("key"):
            raise read.fail(where + ".key", "is required (the client's key, from vault)")
        priority = entry.get("class", str, "standard")
        if priority not in PRIORITY_CLASSES:
            raise entry.fail("class", "must be one of " + ", ".join(PRIORITY_CLASSES))
        limit = entry.get("inflight_limit", int)
        if limit is not None and limit < 1:
            raise entry.fail("inflight_limit", "must be at least 1 (leave it out for the "
                             "gateway's GATEWAY_MAX_INFLIGHT_PER_KEY)")
        decls.append(ClientKeyDecl(name, priority, limit))
    return tuple(decls)


def _parse_tuning(read: _Reader) -> tuple:
    tuning = read.get("fleet_gateway_tuning", dict, {})
    for name, value in tuning.items():
        if name not in TUNABLE_ENV:
            raise read.fail("fleet_gateway_tuning", f"{name!r} is not a tunable gateway "
                            "variable; one of " + ", ".join(TUNABLE_ENV))
        refusal = TUNABLES[name].refusal(value)
        if refusal is not None:
            raise read.fail("fleet_gateway_tuning", f"{name} {refusal}")
    return tuple(sorted(tuning.items()))


def _parse_roles(host: str, roles: dict) -> tuple:
    decls = []
    for name, values in roles.items():
        if name not in ROLES_BY_NAME:
            raise FleetError(host, name, "fleet_roles", "is not a catalog role")
        decls.append(parse_role(host, name, values or {}))
    return tuple(sorted(decls, key=lambda decl: role_index(decl.role)))


def parse_role(host: str, role: str, values: dict) -> RoleDecl:
    """Read one fleet_roles entry into a RoleDecl."""
    read = _Reader(host, role, values)
    if not isinstance(values, dict):
        raise FleetError(host, role, "fleet_roles", "must be a mapping of role fields")
    unknown = sorted(set(values) - set(ROLE_FIELDS))
    if unknown:
        raise read.fail(unknown[0], "is not a role field; one of " + ", ".join(ROLE_FIELDS))
    referral = read.get("referral", str)
    proxy = read.get("proxy", str)
    pool = _parse_hosts(read, "pool")
    owners = _parse_hosts(read, "owners")
    feasible = read.get("feasible", bool, not (referral or proxy or pool or owners))
    return RoleDecl(
        role=role,
        feasible=feasible,
        checkpoint=read.get("checkpoint", str),
        served_name=read.get("served_name", str),
        context=read.get("context", int),
        native_context=read.get("native_context", int),
        yarn_factor=read.get("yarn_factor", float),
        gpu_memory_utilization=read.get("gpu_memory_utilization", float),
        max_active=read.get("max_active", int),
        mtp=read.get("mtp", bool),
        num_speculative_tokens=read.get("num_speculative_tokens", int),
        tool_parser=read.get("tool_parser", str),
        quantization=read.get("quantization", str),
        sim_profile=read.get("sim_profile", str),
        engine=_engine(read, "engine"),
        referral=referral,
        proxy=proxy,
        pool=pool,
        owners=owners,
        rates=_parse_rates(read),
        stream_resume=read.get("stream_resume", bool),
        kv_cache_gib=read.get("kv_cache_gib", int),
    )


def _parse_hosts(read: _Reader, field: str) -> tuple:
    hosts = read.get(field, list, [])
    if not all(isinstance(member, str) and member for member in hosts):
        raise read.fail(field, f"must be a list of inventory hostnames, got {hosts!r}")
    if len(set(hosts)) != len(hosts):
        raise read.fail(field, f"names a peer twice: {hosts!r}")
    return tuple(hosts)


def _parse_rates(read: _Reader) -> tuple:
    rates = read.get("rates", dict, {})
    parsed = []
    for peer, rate in rates.items():
        number = _finite_number(rate)
        if number is None or number <= 0:
            raise read.fail("rates", f"rate of {peer} must be a positive, finite tok/s, "
                            f"got {rate!r}")
        parsed.append((str(peer), number))
    return tuple(parsed)
