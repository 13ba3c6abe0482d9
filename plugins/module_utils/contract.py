"""The fleet contract: the role catalog, the route modes and the gateway's environment names.

Each fact here is written once. The collection imports this module as module_utils; the
box-side programs import the same file as ``lobes_contract`` (gateway/lobes_contract.py is a
link to it), so the gateway, the supervisor and the plan cannot drift apart. Standard library
only: it runs on a box that has no Ansible.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

# The collection's version; the gateway reports it on /health (galaxy.yml holds it too, as
# Galaxy requires, and a test holds the two together).
VERSION = "0.1.0"
# The vLLM version the simulator reports on /version: the build the seeds' boxes run, which it
# stands in for. Verify expects it of a simulated gear, as it expects the pinned CPU build's.
SIM_ENGINE_VERSION = "0.23.1rc1.dev672"

# ---------------------------------------------------------------- the role catalog

GENERATE = "generate"
EMBED = "embed"
RERANK = "rerank"
STT = "stt"
TTS = "tts"
AUDIO_TASKS = frozenset({STT, TTS})

LOAD_TESTED = "load-tested"
CONFIGURED = "configured"


@dataclass(frozen=True)
class RoleSpec:
    """One catalog row: what a role is, its env prefix and how its default checkpoint is served."""

    name: str
    prefix: str
    tier: str | None
    compat_alias: str | None
    extra_aliases: tuple[str, ...]
    checkpoint: str
    context: int | None
    gpu_memory_utilization: float | None
    status: str
    task: str
    native_context: int | None = None
    tool_parser: str | None = None
    quantization: str | None = None
    mtp_checkpoint: bool = False
    # Opt-in roles are feasible by default only once their backend is wired.
    opt_in: bool = False
    vllm_args: tuple[str, ...] = ()
    max_active: int = 2  # --max-num-seqs default; pooling gears batch many small requests
    hf_overrides: str | None = None  # JSON, merged with a YaRN rope scaling when both apply
    sim_profile: str = "minor"
    # The checkpoint's hub revision (40 hex), where one has been chosen and checked; never
    # guessed: an unpinned role is pinned by the inventory or the lock file (fleet.lock.yml).
    revision: str | None = None

    @property
    def aliases(self) -> tuple[str, ...]:
        """Every name besides the served id that reaches this role through the gateway."""
        names = (self.tier, self.compat_alias, *self.extra_aliases)
        return tuple(name for name in names if name)

    @property
    def is_audio(self) -> bool:
        return self.task in AUDIO_TASKS

    @property
    def native_window(self) -> int | None:
        """The checkpoint's own window: declared where it differs from the default context."""
        return self.native_context or self.context


_RERANKER_OVERRIDES = (
    '{"architectures": ["Qwen3ForSequenceClassification"], '
    '"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}'
)

ROLES: tuple[RoleSpec, ...] = (
    RoleSpec(
        name="cortex", prefix="PRIMARY", tier="main", compat_alias="hard",
        extra_aliases=("cortex",), checkpoint="sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP",
        context=131072, gpu_memory_utilization=0.30, status=LOAD_TESTED, task=GENERATE,
        tool_parser="qwen3_coder", quantization="modelopt_fp4", mtp_checkpoint=True,
        sim_profile="spark-cortex",
    ),
    RoleSpec(
        # Served trimmed to 32K by default (the window its memory share was sized for); the
        # checkpoint's own window is 128K.
        name="senses", prefix="MULTIMODAL", tier="multimodal", compat_alias="normal",
        extra_aliases=("senses",), checkpoint="coolthor/gemma-4-12B-it-NVFP4A16",
        context=32768, gpu_memory_utilization=0.14, status=LOAD_TESTED, task=GENERATE,
        native_context=131072, tool_parser="gemma4", quantization="compressed-tensors",
        mtp_checkpoint=True, sim_profile="spark-senses",
    ),
    RoleSpec(
        name="minor", prefix="MINOR", tier="minor", compat_alias="cheap",
        extra_aliases=(), checkpoint="Qwen/Qwen3.5-4B", context=32768,
        gpu_memory_utilization=0.10, status=CONFIGURED, task=GENERATE,
        tool_parser="qwen3_coder",
    ),
    RoleSpec(
        name="middle", prefix="MIDDLE", tier=None, compat_alias=None, extra_aliases=(),
        checkpoint="nvidia/Qwen3-14B-NVFP4", context=32768, gpu_memory_utilization=0.12,
        status=CONFIGURED, task=GENERATE, tool_parser="hermes", quantization="modelopt_fp4",
    ),
    RoleSpec(
        name="muse", prefix="MUSE", tier="muse", compat_alias=None, extra_aliases=(),
        checkpoint="nvidia/Gemma-4-31B-IT-NVFP4", context=32768, gpu_memory_utilization=0.55,
        status=CONFIGURED, task=GENERATE, tool_parser="gemma4", quantization="modelopt_fp4",
        opt_in=True,
    ),
    RoleSpec(
        # Its utilization was never measured: a box that hosts it must declare one.
        name="worker", prefix="WORKER", tier="worker", compat_alias=None, extra_aliases=(),
        checkpoint="unsloth/Qwen3.6-35B-A3B-NVFP4", context=32768, gpu_memory_utilization=None,
        status=CONFIGURED, task=GENERATE, tool_parser="qwen3_coder",
        quantization="modelopt_fp4", opt_in=True,
    ),
    RoleSpec(
        name="embedder", prefix="EMBED", tier=None, compat_alias=None, extra_aliases=(),
        checkpoint="Qwen/Qwen3-Embedding-0.6B", context=8192, gpu_memory_utilization=0.06,
        status=LOAD_TESTED, task=EMBED, max_active=16,
        vllm_args=("--runner", "pooling", "--convert", "embed"),
        sim_profile="embedder",
    ),
    RoleSpec(
        name="reranker", prefix="RERANK", tier=None, compat_alias=None, extra_aliases=(),
        checkpoint="Qwen/Qwen3-Reranker-0.6B", context=8192, gpu_memory_utilization=0.06,
        status=LOAD_TESTED, task=RERANK, max_active=16,
        vllm_args=("--runner", "pooling", "--convert", "classify"),
        hf_overrides=_RERANKER_OVERRIDES,
        sim_profile="reranker",
    ),
    RoleSpec(
        name="stt", prefix="STT", tier=None, compat_alias=None, extra_aliases=(),
        checkpoint="nvidia/parakeet-tdt-0.6b-v2", context=None, gpu_memory_utilization=None,
        status=CONFIGURED, task=STT, sim_profile="audio",
    ),
    RoleSpec(
        name="tts", prefix="TTS", tier=None, compat_alias=None, extra_aliases=(),
        checkpoint="ResembleAI/chatterbox", context=None, gpu_memory_utilization=None,
        status=CONFIGURED, task=TTS, sim_profile="audio",
    ),
    RoleSpec(
        name="fallback", prefix="FALLBACK", tier=None, compat_alias=None, extra_aliases=(),
        checkpoint="RedHatAI/Mistral-Small-3.2-24B-Instruct-2506-NVFP4", context=32768,
        gpu_memory_utilization=0.40, status=CONFIGURED, task=GENERATE,
        tool_parser="mistral", quantization="compressed-tensors",
    ),
)

# Capability order of the generate tiers, ascending: a request for a tier no gear serves is
# answered by the next one up.
TIER_ORDER: tuple[str, ...] = ("minor", "multimodal", "worker", "muse", "main")
# Full tiers are shed under pressure; minor is the floor and always served.
SHEDDABLE_TIERS = frozenset(TIER_ORDER[1:])

# The role that owns the primary lane, and the one it fails over to.
PRIMARY_ROLE = "cortex"
FALLBACK_ROLE = "fallback"

# In /v1/models/supported without a role of its own.
CANDIDATES: tuple[tuple[str, str], ...] = (
    ("sakamakismile/gemma-4-12B-coder-fable5-composer2.5-MTP-NVFP4", CONFIGURED),
)

ROLE_NAMES: tuple[str, ...] = tuple(spec.name for spec in ROLES)
ROLES_BY_NAME: dict[str, RoleSpec] = {spec.name: spec for spec in ROLES}


def role_spec(role: str) -> RoleSpec:
    """The catalog row of a role; KeyError for a name the catalog does not know."""
    return ROLES_BY_NAME[role]


def role_index(role: str) -> int:
    """Stable position of a role in the catalog (used for deterministic ports and ordering)."""
    return ROLE_NAMES.index(role)


# ---------------------------------------------------------------- route modes

# How a box answers for a role: the plan chooses one, render writes it as P_ROUTE, the gateway
# routes by it and verify compares what the gateway advertises with it.
SERVE = "serve"  # this box's own gear
POOL = "pool"  # placed across replicas (this box's gear among them, or peers only)
PROXY = "proxy"  # forwarded to the one declared peer, single hop
REFER = "refer"  # answered 404 role_infeasible naming the peer that hosts it
OWNERS = "owners"  # forwarded under the fleet key to the boxes that own it
OFF = "off"  # not answered at all: 404 role_infeasible without a peer
ROUTE_MODES: tuple[str, ...] = (SERVE, POOL, PROXY, REFER, OWNERS, OFF)
# Modes whose answers come from other boxes.
PEER_MODES = frozenset({POOL, PROXY, OWNERS})

# How a pool places a request on its replicas (GATEWAY_POOL_POLICY, the inventory's
# fleet_gateway_pool_policy); the first is the default. The gateway's policy/policies.py
# implements each.
POOL_POLICIES: tuple[str, ...] = ("prefix", "rate", "queue", "pinned")

# The port a box's gateway listens on unless the inventory (fleet_gateway_port) or its .env
# (GATEWAY_PORT) names another, and the ports either may name.
DEFAULT_GATEWAY_PORT = 8000
TCP_PORTS = range(1, 65536)

# Priority classes of client requests, strongest first (GATEWAY_CLIENT_KEYS, X-Lobes-Priority).
PRIORITY_CLASSES: tuple[str, ...] = ("interactive", "standard", "batch")
# A request's class until its key or header says otherwise (the box key's, too).
DEFAULT_PRIORITY_CLASS = "standard"
# The `priority` a class travels to a gear with, where the gear runs vLLM's priority scheduling
# policy (P_PRIORITY_SCHEDULING): lower runs first; standard is vLLM's default and is not sent.
VLLM_PRIORITY = {"interactive": -1, "standard": 0, "batch": 1}

# ---------------------------------------------------------------- environment names

# Per role prefix P, the gateway reads P_<suffix>.
ROLE_ENV_SUFFIXES: tuple[str, ...] = (
    "ROUTE", "BASE_URL", "SERVED_NAME", "MAX_MODEL_LEN", "MAX_ACTIVE", "FEASIBLE",
    "QUANTIZATION", "PEER_ORIGIN", "PEER_PROXY", "PEER_API_KEY", "PEER_ORIGINS",
    "PEER_API_KEYS", "PEER_RATES", "STREAM_RESUME", "PRIORITY_SCHEDULING", "RATE",
)
# Names the gateway reads besides the per-role ones.
GATEWAY_ENV: tuple[str, ...] = (
    "GATEWAY_HOST", "GATEWAY_PORT", "GATEWAY_DEFAULT_MODEL", "GATEWAY_ALIASES",
    "GATEWAY_API_KEY", "GATEWAY_FLEET_KEY", "GATEWAY_SELF_ORIGIN",
    "GATEWAY_FORCE_STRICT_TOOLS", "GATEWAY_POOL_POLICY", "GATEWAY_RETRY_AFTER_S",
    "GATEWAY_MAX_BODY_BYTES", "GATEWAY_MAX_INFLIGHT_PER_KEY", "GATEWAY_HEADER_TIMEOUT_S",
    "GATEWAY_BODY_TIMEOUT_S", "GATEWAY_CONNECT_TIMEOUT_S", "GATEWAY_UPSTREAM_TIMEOUT_S",
    "GATEWAY_PROBE_INTERVAL_S", "GATEWAY_PROBE_TIMEOUT_S", "GATEWAY_ACCESS_LOG",
    "GATEWAY_STREAM_STALL_S", "GATEWAY_CLIENT_KEYS", "GATEWAY_PRIVATE_STATUS",
    # What the plan says of the box, for /status and the live page: its hardware, the gears'
    # memory shares and the headroom the plan keeps free (GiB).
    "GATEWAY_BOX_HARDWARE", "GATEWAY_GEAR_SHARES_GIB", "GATEWAY_MEMORY_HEADROOM_GIB",
    # The names the fleet's first gateways used, kept so an existing fleet's .env still starts.
    "CULTURE_VLLM_API_KEY", "FALLBACK_URL", "AUDIO_URL",
)
# The pressure thresholds (percent) and the sampler's settings.
PRESSURE_ENV: tuple[str, ...] = (
    "LOBES_SWAP_DEGRADED_THRESHOLD", "LOBES_IOWAIT_DEGRADED_THRESHOLD",
    "LOBES_SWAP_NO_HARD_THRESHOLD", "LOBES_SWAP_PREFER_CHEAP_THRESHOLD",
    "LOBES_IOWAIT_NO_HARD_THRESHOLD", "LOBES_MEMAVAILABLE_DEGRADED_THRESHOLD",
    "LOBES_PSI_MEMORY_FULL_THRESHOLD", "LOBES_PROC_ROOT", "LOBES_PRESSURE_SAMPLE_S",
)


class OriginError(ValueError):
    """A value that is not a plain-HTTP origin: what is wrong with it, and the fix."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


# A host name of an origin: DNS labels (letters, digits, '-', '_' as some tailnets write them).
_LABEL = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
_HOST_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
MASK = "********"


def _shown(value: str, parts) -> str:
    """The origin as an error may quote it: a user or password in it masked."""
    if "@" not in parts.netloc:
        return repr(value)
    return repr(value.replace(parts.netloc.rpartition("@")[0], MASK, 1))


def valid_host(host: str) -> bool:
    """Whether `host` is a host name or an IP address (IPv6 without brackets)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return len(host) <= 253 and _HOST_NAME.fullmatch(host) is not None
    return True


def parse_http_origin(value: str) -> tuple[str, int]:
    """The host and port of http://host[:port] (80 when absent; an IPv6 address in brackets,
    returned without them), the form every origin of the mesh takes, or OriginError. A user
    or password in it is refused (and masked in the error): keys travel in headers only."""
    parts = urlsplit(value.rstrip("/"))
    shown = _shown(value, parts)
    if parts.scheme != "http" or not parts.hostname:
        raise OriginError(f"{shown} is not an http://host:port origin",
                          "write it as http://host:port (plain HTTP over the private network; "
                          "an IPv6 address in brackets)")
    if "@" in parts.netloc:
        raise OriginError(f"{shown} carries a user or password",
                          "give the origin only: keys belong in fleet_gateway_api_key (vault), "
                          "never in a URL")
    if parts.path or parts.query or parts.fragment or "#" in value or "?" in value:
        raise OriginError(f"{shown} carries a path",
                          "give the origin only, without /v1 or any path, query or fragment")
    try:
        port = 80 if parts.port is None else parts.port
    except ValueError:  # not a number, past 65535, or an IPv6 address without its brackets
        port = -1
    if port not in TCP_PORTS:
        raise OriginError(f"{shown} has an invalid port",
                          f"use a port {TCP_PORTS[0]}-{TCP_PORTS[-1]} (and an IPv6 address "
                          "in brackets)")
    if not valid_host(parts.hostname):
        raise OriginError(f"{shown} has an invalid host",
                          "use a host name (letters, digits, '-', '.') or an IP address")
    return parts.hostname, port


def canonical_origin(value: str) -> str:
    """The one spelling of an origin: lower-case host, explicit port (OriginError when it is
    not one): two spellings of one box compare equal."""
    return http_origin(*parse_http_origin(value))


def host_port(host: str, port: int) -> str:
    """host:port as a URL and a Host header write it: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_origin(host: str, port: int) -> str:
    """The plain-HTTP origin of `host` and `port` (parse_http_origin's inverse)."""
    return f"http://{host_port(host, port)}"


def finite_float(value: int | float) -> float | None:
    """`value` as a float, or None when no setting can be it: nan, an infinity, or a whole
    number past any float (YAML and .env files both take such numbers)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class Bound:
    """The numbers a setting takes: the inventory refuses the rest before anything is deployed,
    and the gateway refuses them at start and in what its peers advertise."""

    minimum: float
    maximum: float | None = None
    integer: bool = False
    # The minimum itself is refused: a rate or a time scale must be above 0, not 0.
    above_minimum: bool = False

    def _range(self) -> str:
        """The range in words: "between 1 and 65535", "0.01 or more", "above 0"."""
        low = f"above {_figure(self.minimum)}" if self.above_minimum else _figure(self.minimum)
        if self.maximum is None:
            return low if self.above_minimum else f"{low} or more"
        if self.above_minimum:
            return f"{low} and at most {_figure(self.maximum)}"
        return f"between {_figure(self.minimum)} and {_figure(self.maximum)}"

    def describe(self) -> str:
        """What the bound allows, in words: "a whole number between 1 and 65535"."""
        return f"{'a whole number' if self.integer else 'a number'} {self._range()}"

    def problem(self, value: object) -> str | None:
        """What is wrong with `value` in a few words, or None when it is taken."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "not a number"
        if finite_float(value) is None:
            return "not a finite number"
        if self.integer and not float(value).is_integer():
            return "not a whole number"
        too_low = value <= self.minimum if self.above_minimum else value < self.minimum
        if too_low or (self.maximum is not None and value > self.maximum):
            return "out of range"
        return None

    def refusal(self, value: object) -> str | None:
        """Why `value` is refused, as the gateway says it, or None when it is taken."""
        problem = self.problem(value)
        if problem is None:
            return None
        if problem == "out of range":
            return f"must be {self._range()}, got {value!r}"
        return f"must be {problem.removeprefix('not ')}, got {_short(value)}"


def _figure(number: float) -> str:
    """A bound as people write it: 16777216, 0.01, never 1.67772e+07."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def _short(value: object) -> str:
    """A value for an error message, cut where it is long (a number of 400 digits)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:20] + "..."


_PERCENT = Bound(0, 100)
_SECONDS = Bound(0.01)
# What an inventory may tune through fleet_gateway_tuning, and what the gateway accepts of each.
TUNABLES: dict[str, Bound] = {
    "LOBES_SWAP_NO_HARD_THRESHOLD": _PERCENT, "LOBES_SWAP_PREFER_CHEAP_THRESHOLD": _PERCENT,
    "LOBES_SWAP_DEGRADED_THRESHOLD": _PERCENT, "LOBES_IOWAIT_NO_HARD_THRESHOLD": _PERCENT,
    "LOBES_IOWAIT_DEGRADED_THRESHOLD": _PERCENT, "LOBES_MEMAVAILABLE_DEGRADED_THRESHOLD": _PERCENT,
    "LOBES_PSI_MEMORY_FULL_THRESHOLD": _PERCENT, "LOBES_PRESSURE_SAMPLE_S": _SECONDS,
    "GATEWAY_MAX_BODY_BYTES": Bound(1, integer=True),
    "GATEWAY_MAX_INFLIGHT_PER_KEY": Bound(0, integer=True),
    "GATEWAY_RETRY_AFTER_S": Bound(1, integer=True),
    # A long generation needs a longer upstream timeout; a slow box, a longer stream stall
    # before its stream is continued elsewhere or ended.
    "GATEWAY_HEADER_TIMEOUT_S": _SECONDS, "GATEWAY_BODY_TIMEOUT_S": _SECONDS,
    "GATEWAY_CONNECT_TIMEOUT_S": _SECONDS, "GATEWAY_UPSTREAM_TIMEOUT_S": _SECONDS,
    "GATEWAY_STREAM_STALL_S": _SECONDS, "GATEWAY_PROBE_INTERVAL_S": _SECONDS,
    "GATEWAY_PROBE_TIMEOUT_S": _SECONDS,
}
TUNABLE_ENV: tuple[str, ...] = tuple(TUNABLES)


# ---------------------------------------------------------------- what a gear serves with


@dataclass(frozen=True)
class NamePattern:
    """The text a setting takes: its characters and length, chosen so the value is safe in
    every file and list it is written to (.env lists, compose.yaml, a command line)."""

    pattern: str  # the whole value must match
    maximum_length: int
    allowed: str  # the characters, in words

    def describe(self) -> str:
        return f"{self.allowed}, at most {self.maximum_length} characters"

    def refusal(self, value: object) -> str | None:
        """Why `value` is refused, or None when it is taken; never quotes the value."""
        if not isinstance(value, str):
            return f"must be text, not {type(value).__name__}"
        if not value:
            return "must not be empty"
        if len(value) > self.maximum_length:
            return f"is {len(value)} characters long; at most {self.maximum_length}"
        if re.fullmatch(self.pattern, value) is None:
            return f"holds a character it may not: {self.allowed}"
        return None


# The numbers and names a gear is served with. The plan checks a box's own against them, and a
# gateway checks what its peers advertise against the same ones: a value no box could be
# planned with is never taken from a peer either.
CONTEXT_TOKENS = Bound(1, 16_777_216, integer=True)  # a window, in tokens
MAX_ACTIVE_SLOTS = Bound(1, 1024, integer=True)  # requests a gear runs at once (--max-num-seqs)
TOKEN_RATE = Bound(0, 100_000, above_minimum=True)  # single-stream tokens per second
SERVED_NAME = NamePattern(r"[A-Za-z0-9][A-Za-z0-9._:/+-]*", 256,
                          "letters, digits and . _ : / + - (a letter or digit first)")
# What a box advertises of each role, field by field (origins: parse_http_origin).
ADVERTISED_BOUNDS: dict[str, Bound | NamePattern] = {
    "context": CONTEXT_TOKENS, "max_active": MAX_ACTIVE_SLOTS, "rate": TOKEN_RATE,
    "served_name": SERVED_NAME,
}

# A key (a box's, the fleet's, a client's): the characters every list that carries it can hold
# (P_PEER_API_KEYS' commas, GATEWAY_CLIENT_KEYS' name=key:class) and a .env writes unquoted.
KEY_TEXT = NamePattern(r"[A-Za-z0-9._~+/=-]+", 4096, "letters, digits and . _ ~ + / = -")
# A named client key's name (GATEWAY_CLIENT_KEYS); the gateway's own callers keep theirs.
CLIENT_NAME = NamePattern(r"[A-Za-z0-9][A-Za-z0-9_.-]*", 64,
                          "letters, digits and . _ - (a letter or digit first)")
RESERVED_CLIENT_NAMES: tuple[str, ...] = ("anonymous", "client", "fleet")

# lobes_sim's profiles and the task each serves: a simulated gear takes a profile of its
# role's task (stt and tts share the audio bridge).
SIM_PROFILES: dict[str, str] = {
    "spark-cortex": GENERATE, "thor-cortex": GENERATE, "spark-senses": GENERATE,
    "minor": GENERATE, "instant": GENERATE, "embedder": EMBED, "reranker": RERANK,
    "audio": STT,
}

# Environment values that are secrets: masked in diffs, never logged.
SECRET_ENV = ("GATEWAY_API_KEY", "GATEWAY_FLEET_KEY", "CULTURE_VLLM_API_KEY",
              "GATEWAY_CLIENT_KEYS")
SECRET_ENV_SUFFIXES = ("_API_KEY", "_API_KEYS")


def role_env(prefix: str, suffix: str) -> str:
    """The variable P_<suffix> of a role prefix; the suffix must be a contract one."""
    if suffix not in ROLE_ENV_SUFFIXES:
        raise KeyError(f"{suffix} is not a per-role variable of the contract")
    return f"{prefix}_{suffix}"


KNOWN_ENV: frozenset[str] = frozenset(
    [*GATEWAY_ENV, *PRESSURE_ENV,
     *(f"{spec.prefix}_{suffix}" for spec in ROLES for suffix in ROLE_ENV_SUFFIXES)]
)
# Names under these prefixes belong to the contract: one the gateway does not know is a typo.
_OWNED_PREFIXES = ("GATEWAY_", *(f"{spec.prefix}_" for spec in ROLES))


def is_secret_env(name: str) -> bool:
    return name in SECRET_ENV or name.endswith(SECRET_ENV_SUFFIXES)


def unknown_env(names) -> list[tuple[str, str | None]]:
    """Contract-owned names (GATEWAY_* or role-prefixed) that the contract does not define,
    each with the closest known name (None when nothing is close)."""
    unknown = []
    for name in sorted(names):
        if name in KNOWN_ENV or not name.startswith(_OWNED_PREFIXES):
            continue
        close = difflib.get_close_matches(name, KNOWN_ENV, n=1, cutoff=0.85)
        unknown.append((name, close[0] if close else None))
    return unknown
