"""Environment -> typed, frozen configuration; a bad variable stops start-up, named."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from lobes_contract import (
    DEFAULT_GATEWAY_PORT,
    KNOWN_ENV,
    OFF,
    OWNERS,
    POOL,
    POOL_POLICIES,
    PROXY,
    REFER,
    ROLES,
    ROUTE_MODES,
    SERVE,
    TCP_PORTS,
    TUNABLES,
    OriginError,
    RoleSpec,
    parse_http_origin,
    unknown_env,
)

from ..transport.upstream import Origin
from .admission import CLASSES

# Names a named client key may not take: the gateway's own callers (policy/auth.py).
RESERVED_CLIENT_NAMES = frozenset({"anonymous", "client", "fleet"})
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigError(ValueError):
    """A variable of the environment contract is invalid; the message names it and the fix."""

    def __init__(self, variable: str, problem: str, fix: str) -> None:
        super().__init__(f"{variable}: {problem}; {fix}")
        self.variable = variable


@dataclass(frozen=True)
class PeerSpec:
    """One declared replica of a pooled role: origin, pairwise key (after inheritance), prior."""

    origin: str
    api_key: str | None
    rate: float | None


@dataclass(frozen=True)
class ClientKey:
    """One named client key (GATEWAY_CLIENT_KEYS): the name that labels its traffic, the key,
    its default priority class and its own in-flight limit (None: GATEWAY_MAX_INFLIGHT_PER_KEY).
    """

    name: str
    key: str = field(repr=False)
    priority: str
    inflight_limit: int | None = None


@dataclass(frozen=True)
class RoleConfig:
    """What this box's environment says about one role."""

    role: RoleSpec
    route: str  # the route mode (lobes_contract.ROUTE_MODES)
    base_url: Origin | None
    served_name: str
    max_model_len: int | None
    max_active: int | None
    feasible: bool
    peer_origin: str | None
    peer_api_key: str | None
    peers: tuple[PeerSpec, ...]
    # P_QUANTIZATION: published on /capabilities so pooling peers compare it (fingerprint).
    quantization: str | None = None
    # P_STREAM_RESUME: a pooled stream whose replica dies goes on on another one (app/resume.py).
    stream_resume: bool = False
    # P_PRIORITY_SCHEDULING: the gear runs vLLM's priority policy, so a request's class travels
    # to it as `priority`.
    priority_scheduling: bool = False
    # P_RATE: the local gear's declared single-stream tok/s, the admission queue's prior
    # until a request has finished (so a deadline is judged on the first request too).
    rate: float | None = None
    # P_SERVED_NAME was set (the plan always renders it): the model every peer of the role
    # must serve. Unset (an .env written by hand), peers are held to the first ready one.
    served_name_declared: bool = False

    @property
    def name(self) -> str:
        return self.role.name

    @property
    def wired(self) -> bool:
        """A local backend is declared for this role."""
        return self.base_url is not None


@dataclass(frozen=True)
class PressureConfig:
    """The LOBES_* thresholds (percent, compared strictly greater) and the sampler settings."""

    swap_degraded: float = 75.0
    iowait_degraded: float = 50.0
    swap_no_hard: float = 50.0
    swap_prefer_cheap: float = 65.0
    iowait_no_hard: float = 25.0
    # Unified memory (the GPU allocates from the host's RAM): shed when MemAvailable falls
    # strictly under this share of MemTotal, or PSI memory `full avg10` rises strictly over its
    # threshold.
    memavailable_degraded: float = 5.0
    psi_memory_full: float = 10.0
    proc_root: str = "/proc"
    sample_interval_s: float = 1.0
    retry_after_s: int = 5


@dataclass(frozen=True)
class Limits:
    """Request limits and timeouts (seconds)."""

    max_body_bytes: int = 32 * 1024 * 1024
    max_inflight_per_key: int = 32
    header_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    upstream_timeout_s: float = 600.0
    probe_interval_s: float = 5.0
    probe_timeout_s: float = 3.0
    # A resumable pooled stream whose replica sends nothing for this long is taken as cut off.
    stream_stall_s: float = 30.0


@dataclass(frozen=True)
class BoxPlan:
    """The plan's word on this box, as /status and /capabilities repeat it."""

    hardware: str | None = None
    gear_shares_gib: float | None = None
    memory_headroom_gib: float | None = None


# Bounds of what the plan renders about the box (a hardware description, GiB figures).
MAX_HARDWARE_CHARS = 120
MAX_GIB = 1_000_000.0


def is_shown_line(value: str, most: int) -> bool:
    """A line shown to people as is: 1 to `most` printable ASCII characters."""
    return 0 < len(value) <= most and value.isascii() and value.isprintable()


@dataclass(frozen=True)
class GatewayConfig:
    """The whole, validated environment contract of one gateway."""

    host: str = "0.0.0.0"
    port: int = DEFAULT_GATEWAY_PORT
    default_model: str | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    api_key: str | None = None
    fleet_key: str | None = None
    self_origin: str | None = None
    force_strict_tools: bool = False
    # /status and /capabilities answer only a caller with a key the gate accepts.
    private_status: bool = False
    # What the plan says of this box (the live page shows it): hardware, the gears' memory
    # shares and the headroom the plan keeps free, in GiB; None where not rendered.
    box: BoxPlan = field(default_factory=BoxPlan)
    audio_url: Origin | None = None
    pool_policy: str = POOL_POLICIES[0]
    # GATEWAY_ACCESS_LOG: None (off), "-" (stdout) or a file path.
    access_log: str | None = None
    client_keys: tuple[ClientKey, ...] = ()
    roles: Mapping[str, RoleConfig] = field(default_factory=dict)
    pressure: PressureConfig = field(default_factory=PressureConfig)
    limits: Limits = field(default_factory=Limits)


class _Env:
    """Typed readers over the environment; empty values count as unset."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._env = environ

    def str(self, name: str) -> str | None:
        if name not in KNOWN_ENV:  # a reader's typo: the contract's table is the only source
            raise KeyError(f"{name} is not a variable of lobes_contract")
        value = self._env.get(name, "").strip()
        return value or None

    def bool(self, name: str, default: bool | None) -> bool | None:
        value = self.str(name)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise ConfigError(name, f"{value!r} is not a boolean", "use true or false")

    def int(self, name: str, default: int | None, minimum: int = 0,
            maximum: int | None = None) -> int | None:
        value = self.str(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(name, f"{value!r} is not an integer", "use a whole number") from None
        if number < minimum:
            raise ConfigError(name, f"{number} is below {minimum}", f"use {minimum} or more")
        if maximum is not None and number > maximum:
            raise ConfigError(name, f"{number} is above {maximum}", f"use {maximum} or less")
        return number

    def tunable(self, name: str) -> float | None:
        """A tunable's value (lobes_contract.TUNABLES: the range the inventory checks too), None
        when unset; a whole number where the contract wants one."""
        value = self.str(name)
        if value is None:
            return None
        tunable = TUNABLES[name]
        number: object = value
        for kind in (int, float):
            try:
                number = kind(value)
                break
            except ValueError:
                continue
        refusal = tunable.refusal(number)
        if refusal is not None:
            raise ConfigError(name, refusal, "change the value (docs/gateway.md lists each one)")
        assert isinstance(number, (int, float))  # refusal() took it: a finite number
        return int(number) if tunable.integer else float(number)

    def origin(self, name: str) -> Origin | None:
        value = self.str(name)
        return None if value is None else parse_origin(name, value)

    def text(self, name: str, most: int) -> str | None:
        """A line of printable ASCII of at most `most` characters, shown to people as is."""
        value = self.str(name)
        if value is not None and not is_shown_line(value, most):
            raise ConfigError(name, f"{value[:most]!r} is not a line of at most {most} "
                              "printable ASCII characters", "render it again from the plan")
        return value

    def gib(self, name: str) -> float | None:
        """A memory figure in GiB: a finite number from 0 to MAX_GIB."""
        value = self.str(name)
        if value is None:
            return None
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(name, f"{value!r} is not a number", "use GiB, e.g. 71.7") from None
        if not 0 <= number <= MAX_GIB:  # NaN fails both comparisons
            raise ConfigError(name, f"{value!r} is not from 0 to {MAX_GIB:g}",
                              "use GiB, e.g. 71.7")
        return number

    def list(self, name: str) -> list[str] | None:
        value = self.str(name)
        return None if value is None else [item.strip() for item in value.split(",")]


def parse_origin(name: str, value: str) -> Origin:
    """Parse http://host[:port] (no path, no /v1) or fail naming the variable."""
    try:
        return Origin(*parse_http_origin(value))
    except OriginError as exc:
        raise ConfigError(name, exc.problem, exc.fix) from None


def _canonical_origin(name: str, value: str) -> str:
    return parse_origin(name, value).url


def _peers(env: _Env, prefix: str, peer_origin: str | None,
           peer_key: str | None) -> tuple[PeerSpec, ...]:
    origins = env.list(f"{prefix}_PEER_ORIGINS")
    keys_var, rates_var = f"{prefix}_PEER_API_KEYS", f"{prefix}_PEER_RATES"
    if not origins:
        for var in (keys_var, rates_var):
            if env.str(var) is not None:
                raise ConfigError(var, "is set without a pool", f"set {prefix}_PEER_ORIGINS too")
        return ()
    urls = [_canonical_origin(f"{prefix}_PEER_ORIGINS", o) for o in origins]
    keys = env.list(keys_var) or [""] * len(urls)
    rates = env.list(rates_var) or [""] * len(urls)
    for var, values in ((keys_var, keys), (rates_var, rates)):
        if len(values) != len(urls):
            raise ConfigError(var, f"has {len(values)} entries for {len(urls)} origins",
                              f"give one entry per {prefix}_PEER_ORIGINS origin (empty is ok)")
    specs = []
    for url, key, rate in zip(urls, keys, rates, strict=True):
        # An empty slot inherits the singular key only for the singular peer's own origin.
        api_key = key or (peer_key if url == peer_origin else None)
        specs.append(PeerSpec(url, api_key, _rate(rates_var, rate)))
    return tuple(specs)


def _rate(var: str, value: str) -> float | None:
    if not value:
        return None
    try:
        rate = float(value)
    except ValueError:
        raise ConfigError(var, f"{value!r} is not a rate", "give tokens per second") from None
    if not math.isfinite(rate) or rate <= 0:
        raise ConfigError(var, f"{value!r} is not positive", "give tokens per second > 0")
    return rate


def _role(env: _Env, role: RoleSpec, fleet_key: str | None) -> RoleConfig:
    p = role.prefix
    base = env.origin(f"{p}_BASE_URL")
    if base is None and role.name == "fallback":
        base = env.origin("FALLBACK_URL")
    peer_origin_raw = env.str(f"{p}_PEER_ORIGIN")
    peer_origin = (_canonical_origin(f"{p}_PEER_ORIGIN", peer_origin_raw)
                   if peer_origin_raw else None)
    peer_key = env.str(f"{p}_PEER_API_KEY")
    # muse/worker invert the default: feasible only once wired; an explicit value always wins.
    default_feasible = base is not None if role.opt_in else True
    feasible = bool(env.bool(f"{p}_FEASIBLE", default_feasible))
    peer_proxy = bool(env.bool(f"{p}_PEER_PROXY", False))
    peers = _peers(env, p, peer_origin, peer_key)
    route = _route(env, p, feasible, peer_origin, peer_proxy, peers)
    if route == OWNERS and fleet_key is None:
        raise ConfigError(f"{p}_ROUTE", "is owners but GATEWAY_FLEET_KEY is not set",
                          "set GATEWAY_FLEET_KEY (owners are asked under the fleet key)")
    stream_resume = bool(env.bool(f"{p}_STREAM_RESUME", False))
    if stream_resume and route != POOL:
        # Read for a pool only: accepted elsewhere it would promise a resume that never happens.
        raise ConfigError(f"{p}_STREAM_RESUME", f"is true but the role's route is {route}, "
                          "not pool (a lone backend has no replica to continue a stream on)",
                          f"remove {p}_STREAM_RESUME, or pool the role ({p}_ROUTE=pool with "
                          f"{p}_PEER_ORIGINS)")
    return RoleConfig(
        role=role,
        route=route,
        base_url=base,
        served_name=env.str(f"{p}_SERVED_NAME") or role.checkpoint,
        max_model_len=env.int(f"{p}_MAX_MODEL_LEN", role.context, minimum=1),
        max_active=env.int(f"{p}_MAX_ACTIVE", None, minimum=1),
        feasible=feasible,
        peer_origin=peer_origin,
        peer_api_key=peer_key,
        peers=peers,
        quantization=env.str(f"{p}_QUANTIZATION"),
        stream_resume=stream_resume,
        priority_scheduling=bool(env.bool(f"{p}_PRIORITY_SCHEDULING", False)),
        rate=_rate(f"{p}_RATE", env.str(f"{p}_RATE") or ""),
        served_name_declared=env.str(f"{p}_SERVED_NAME") is not None,
    )


def _legacy_route(feasible: bool, peer_origin: str | None, peer_proxy: bool,
                  peers: tuple[PeerSpec, ...]) -> str:
    """The mode an existing fleet's .env, written before P_ROUTE existed, meant.

    A fleet key never turns a referral into owner forwarding: that takes P_ROUTE=owners.
    """
    if feasible:
        return POOL if peers else SERVE
    if peer_proxy and peers:
        return POOL
    if peer_proxy and peer_origin:
        return PROXY
    return REFER if peer_origin else OFF


def _route(env: _Env, p: str, feasible: bool, peer_origin: str | None, peer_proxy: bool,
           peers: tuple[PeerSpec, ...]) -> str:
    """P_ROUTE, checked against the variables that mode needs; absent: the legacy meaning."""
    name = f"{p}_ROUTE"
    route = env.str(name)
    if route is None:
        return _legacy_route(feasible, peer_origin, peer_proxy, peers)
    route = route.lower()
    if route not in ROUTE_MODES:
        raise ConfigError(name, f"{route!r} is not a route mode",
                          f"use one of {', '.join(ROUTE_MODES)}")
    if route != POOL and feasible != (route == SERVE):
        wanted = "true" if route == SERVE else "false"
        raise ConfigError(name, f"is {route} but {p}_FEASIBLE is {str(feasible).lower()}",
                          f"set {p}_FEASIBLE={wanted} or change the route")
    needs = {POOL: (peers, f"{p}_PEER_ORIGINS"), PROXY: (peer_origin, f"{p}_PEER_ORIGIN"),
             REFER: (peer_origin, f"{p}_PEER_ORIGIN"),
             OWNERS: (peers or peer_origin, f"{p}_PEER_ORIGINS")}
    present, needed = needs.get(route, (True, ""))
    if not present:
        raise ConfigError(name, f"is {route} but {needed} is not set",
                          f"set {needed} to the peers that serve the role")
    if peers and route not in (POOL, OWNERS):
        raise ConfigError(f"{p}_PEER_ORIGINS", f"is set but {name} is {route}",
                          "remove it, or route the role as pool or owners")
    return route


_ALIAS = re.compile(r"^\s*([^=\s][^=]*?)\s*=\s*(\S.*?)\s*$")


def _aliases(env: _Env) -> dict[str, str]:
    pairs = env.list("GATEWAY_ALIASES") or []
    aliases = {}
    for pair in pairs:
        if not pair:
            continue
        match = _ALIAS.match(pair)
        if not match:
            raise ConfigError("GATEWAY_ALIASES", f"{pair!r} is not alias=target",
                              "write comma-separated alias=target pairs")
        aliases[match.group(1)] = match.group(2)
    return aliases


# The tunable fields of PressureConfig and Limits and the variables that set them: an unset one
# keeps its field's default (a test holds these to the contract's TUNABLES, whole).
PRESSURE_VARIABLES = {
    "swap_degraded": "LOBES_SWAP_DEGRADED_THRESHOLD",
    "iowait_degraded": "LOBES_IOWAIT_DEGRADED_THRESHOLD",
    "swap_no_hard": "LOBES_SWAP_NO_HARD_THRESHOLD",
    "swap_prefer_cheap": "LOBES_SWAP_PREFER_CHEAP_THRESHOLD",
    "iowait_no_hard": "LOBES_IOWAIT_NO_HARD_THRESHOLD",
    "memavailable_degraded": "LOBES_MEMAVAILABLE_DEGRADED_THRESHOLD",
    "psi_memory_full": "LOBES_PSI_MEMORY_FULL_THRESHOLD",
    "sample_interval_s": "LOBES_PRESSURE_SAMPLE_S",
    "retry_after_s": "GATEWAY_RETRY_AFTER_S",
}
LIMIT_VARIABLES = {
    "max_body_bytes": "GATEWAY_MAX_BODY_BYTES",
    "max_inflight_per_key": "GATEWAY_MAX_INFLIGHT_PER_KEY",
    "header_timeout_s": "GATEWAY_HEADER_TIMEOUT_S",
    "body_timeout_s": "GATEWAY_BODY_TIMEOUT_S",
    "connect_timeout_s": "GATEWAY_CONNECT_TIMEOUT_S",
    "upstream_timeout_s": "GATEWAY_UPSTREAM_TIMEOUT_S",
    "probe_interval_s": "GATEWAY_PROBE_INTERVAL_S",
    "probe_timeout_s": "GATEWAY_PROBE_TIMEOUT_S",
    "stream_stall_s": "GATEWAY_STREAM_STALL_S",
}


def _tuned(env: _Env, variables: Mapping[str, str]) -> dict[str, float]:
    """The fields among `variables` (field -> variable) whose variable is set, with its value."""
    tuned = {}
    for attr, name in variables.items():
        value = env.tunable(name)
        if value is not None:
            tuned[attr] = value
    return tuned


def _pressure(env: _Env) -> PressureConfig:
    return PressureConfig(proc_root=env.str("LOBES_PROC_ROOT") or "/proc",
                          **_tuned(env, PRESSURE_VARIABLES))


def _limits(env: _Env) -> Limits:
    return Limits(**_tuned(env, LIMIT_VARIABLES))


def _client_key(entry: str) -> ClientKey:
    """One `name=key:class[:inflight_limit]` entry; a message never repeats the key."""
    var = "GATEWAY_CLIENT_KEYS"
    name, sep, rest = entry.partition("=")
    name = name.strip()
    fields = rest.split(":")
    if not sep or not _CLIENT_NAME.fullmatch(name) or len(fields) not in (2, 3):
        shown = name if _CLIENT_NAME.fullmatch(name) else "an entry"
        raise ConfigError(var, f"{shown} is not name=key:class[:inflight_limit]",
                          "write comma-separated name=key:class[:inflight_limit] entries, "
                          "names of letters, digits, . _ -")
    if name in RESERVED_CLIENT_NAMES:
        raise ConfigError(var, f"the name {name!r} is the gateway's own",
                          f"rename it (not {', '.join(sorted(RESERVED_CLIENT_NAMES))})")
    key, priority = fields[0].strip(), fields[1].strip().lower()
    if not key or any(c.isspace() for c in key):
        raise ConfigError(var, f"the key of {name} is empty or holds whitespace",
                          "give each name a key without spaces, commas or colons")
    if priority not in CLASSES:
        raise ConfigError(var, f"{name}'s class {priority!r} is not a priority class",
                          f"use one of {', '.join(CLASSES)}")
    limit = None
    if len(fields) == 3:
        if not fields[2].strip().isdigit() or int(fields[2]) < 1:
            raise ConfigError(var, f"{name}'s in-flight limit {fields[2]!r} is not a whole "
                              "number >= 1", "give a limit of 1 or more, or leave it out")
        limit = int(fields[2])
    return ClientKey(name, key, priority, limit)


def _client_keys(env: _Env, api_key: str | None,
                 fleet_key: str | None) -> tuple[ClientKey, ...]:
    """GATEWAY_CLIENT_KEYS: distinct names and keys, none equal to the box's or fleet's key."""
    var = "GATEWAY_CLIENT_KEYS"
    entries = [entry for entry in env.list(var) or [] if entry]
    if entries and api_key is None:
        raise ConfigError(var, "is set but GATEWAY_API_KEY is not",
                          "set GATEWAY_API_KEY too (named keys open a gated gateway)")
    keys = tuple(_client_key(entry) for entry in entries)
    names = [k.name for k in keys]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(var, f"names {name} twice", "give each client key one entry")
    secrets = [k.key for k in keys]
    for client in keys:
        if secrets.count(client.key) > 1 or client.key in (api_key, fleet_key):
            raise ConfigError(var, f"the key of {client.name} is not unique",
                              "give each name its own key, distinct from GATEWAY_API_KEY and "
                              "GATEWAY_FLEET_KEY")
    return keys


def _refuse_unknown(environ: Mapping[str, str]) -> None:
    """A GATEWAY_* or role-prefixed name the contract does not define is a typo: stop."""
    unknown = unknown_env(environ)
    if not unknown:
        return
    name, closest = unknown[0]
    fix = f"did you mean {closest}?" if closest else "remove it (docs/gateway.md lists the names)"
    others = f" (and {', '.join(pair[0] for pair in unknown[1:])})" if len(unknown) > 1 else ""
    raise ConfigError(name, f"is not a variable of the gateway's contract{others}", fix)


def _access_log(env: _Env) -> str | None:
    """GATEWAY_ACCESS_LOG: off (the default), - for stdout, or a file path."""
    value = env.str("GATEWAY_ACCESS_LOG")
    return None if value is None or value.lower() == "off" else value


def load_config(environ: Mapping[str, str]) -> GatewayConfig:
    """Build the validated config from an environment; raises ConfigError naming the variable."""
    _refuse_unknown(environ)
    env = _Env(environ)
    self_origin = env.str("GATEWAY_SELF_ORIGIN")
    fleet_key = env.str("GATEWAY_FLEET_KEY")
    api_key = env.str("GATEWAY_API_KEY") or env.str("CULTURE_VLLM_API_KEY")
    policy = (env.str("GATEWAY_POOL_POLICY") or POOL_POLICIES[0]).lower()
    if policy not in POOL_POLICIES:
        raise ConfigError("GATEWAY_POOL_POLICY", f"{policy!r} is not a policy",
                          f"use one of {', '.join(POOL_POLICIES)}")
    return GatewayConfig(
        host=env.str("GATEWAY_HOST") or "0.0.0.0",
        port=env.int("GATEWAY_PORT", DEFAULT_GATEWAY_PORT, maximum=TCP_PORTS[-1]) or 0,
        default_model=env.str("GATEWAY_DEFAULT_MODEL"),
        aliases=_aliases(env),
        api_key=api_key,
        fleet_key=fleet_key,
        self_origin=_canonical_origin("GATEWAY_SELF_ORIGIN", self_origin) if self_origin else None,
        force_strict_tools=bool(env.bool("GATEWAY_FORCE_STRICT_TOOLS", False)),
        private_status=bool(env.bool("GATEWAY_PRIVATE_STATUS", False)),
        box=BoxPlan(env.text("GATEWAY_BOX_HARDWARE", MAX_HARDWARE_CHARS),
                    env.gib("GATEWAY_GEAR_SHARES_GIB"), env.gib("GATEWAY_MEMORY_HEADROOM_GIB")),
        audio_url=env.origin("AUDIO_URL"),
        pool_policy=policy,
        access_log=_access_log(env),
        client_keys=_client_keys(env, api_key, fleet_key),
        roles={role.name: _role(env, role, fleet_key) for role in ROLES},
        pressure=_pressure(env),
        limits=_limits(env),
    )
