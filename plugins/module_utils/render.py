"""One box's plan -> its files: the gateway .env, compose.yaml (compose runtime) and
services.json (process runtime). Pure functions; the render module writes the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from ansible_collections.lobes.fleet.plugins.module_utils.contract import (
    GENERATE,
    OWNERS,
    POOL,
    PROXY,
    http_origin,
    is_secret_env,
    role_env,
    role_spec,
)
from ansible_collections.lobes.fleet.plugins.module_utils.engines import (
    CPU_ENGINE_ENV,
    CPU_ENGINE_HEALTH_TIMEOUT_S,
    SIM,
    VLLM_CPU,
)
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import planned_hardware
from ansible_collections.lobes.fleet.plugins.module_utils.plan import holds_memory, memory_gated
from ansible_collections.lobes.fleet.plugins.module_utils.service_files import tree_digest

GEAR_PORT = 8000  # every vLLM gear listens on it inside its container
GATEWAY_SOURCE_MOUNT = "/opt/lobes/gateway"
# The box's state/log, where every container appends its output through logwrap: the same
# files the process runtime's supervisor writes, and they outlive the containers.
LOG_MOUNT = "/var/log/lobes"
# Where a vLLM container sees the box's models directory (fleet_model_dir), read-only.
MODELS_MOUNT = "/models"
# The gateway's access log, in the box's state/log: the process runtime's gateway runs in the
# deploy directory (services.json's), a compose gateway sees state/log at LOG_MOUNT.
ACCESS_LOG = "access.log"
# Containers that run the collection's own Python (gateway, simulated gears) run as nobody.
NOBODY = "65534:65534"
# A simulated gear answers /health within a second of starting; a minute is a failure.
SIM_HEALTH_TIMEOUT_S = 60
# The gateway listens within seconds (its first window probe is bounded by the probe timeout);
# `up` waits this long for its /health, and reports an exit before then with its log's end.
GATEWAY_HEALTH_TIMEOUT_S = 60
# What the gateway and the simulator run of the deployed source (each imports the contract module
# beside its package): a change there restarts them (services.json's watch, compose's label), a
# change elsewhere in the source (the supervisor, the model tools) leaves them running.
INPUTS = {"gateway": ("lobes_gateway", "lobes_contract.py"),
          "sim": ("lobes_sim", "lobes_contract.py")}
# Where a gateway listening on every address is reached from its own box.
_LOOPBACK_OF = {"0.0.0.0": "127.0.0.1", "::": "::1"}
ENV_HEADER = "# Rendered by lobes.fleet.render from the mesh plan: edit the inventory, not this."


class RenderError(ValueError):
    """A plan that cannot be rendered with the secrets given; names host and field."""


# ---------------------------------------------------------------- .env

def render_env(plan: dict, secrets: dict) -> list:
    """The gateway's environment as ordered (NAME, value) pairs: globals, then roles."""
    env = _global_env(plan, secrets)
    for role in plan["roles"].values():
        env.extend(_role_env(plan, role, secrets))
    return env


def _global_env(plan: dict, secrets: dict) -> list:
    gateway = plan["gateway"]
    compose = plan["runtime"] == "compose"
    env = [
        ("GATEWAY_HOST", "0.0.0.0" if compose else gateway["host"]),
        ("GATEWAY_PORT", str(gateway["port"])),
    ]
    if gateway["default_model"]:
        env.append(("GATEWAY_DEFAULT_MODEL", gateway["default_model"]))
    if gateway["aliases"]:
        env.append(("GATEWAY_ALIASES",
                    ",".join(f"{alias}={target}" for alias, target in gateway["aliases"].items())))
    if gateway["auth"]:
        key = _secret(plan, secrets, "gateway_api_key", "fleet_gateway_api_key")
        env.append(("GATEWAY_API_KEY", key))
    if gateway.get("fleet_key"):
        env.append(("GATEWAY_FLEET_KEY", _secret(plan, secrets, "fleet_key", "fleet_mesh_key")))
    if gateway.get("client_keys"):
        env.append(("GATEWAY_CLIENT_KEYS", _client_keys(plan, gateway["client_keys"], secrets)))
    env.append(("GATEWAY_SELF_ORIGIN", plan["origin"]))
    env.append(("GATEWAY_ACCESS_LOG",
                f"{LOG_MOUNT}/{ACCESS_LOG}" if compose else f"state/log/{ACCESS_LOG}"))
    if plan["proc_root"]:
        env.append(("LOBES_PROC_ROOT", plan["proc_root"]))
    if gateway["force_strict_tools"]:
        env.append(("GATEWAY_FORCE_STRICT_TOOLS", "true"))
    if gateway["pool_policy"]:
        env.append(("GATEWAY_POOL_POLICY", gateway["pool_policy"]))
    if gateway["private_status"]:
        env.append(("GATEWAY_PRIVATE_STATUS", "true"))
    env.extend(_box_env(plan))
    audio = _local_audio_url(plan)
    if audio:
        env.append(("AUDIO_URL", audio))
    env.extend((name, _number(value)) for name, value in gateway["tuning"].items())
    return env


def _box_env(plan: dict) -> list:
    """What the plan says of the box, for /status and the live page: its hardware, the memory
    shares of its gears (as the memory gate counts them) and the headroom it keeps free."""
    env = []
    hardware = planned_hardware(plan)
    if hardware.get("description"):
        env.append(("GATEWAY_BOX_HARDWARE", hardware["description"]))
    holding = _gears_holding_memory(plan)
    if plan.get("budget") and holding:
        shares = round(sum(role["gear"]["memory_gib"] for role in holding), 2)
        env.append(("GATEWAY_GEAR_SHARES_GIB", _number(shares)))
        env.append(("GATEWAY_MEMORY_HEADROOM_GIB", _number(plan["budget"]["headroom_gib"])))
    return env


def _gears_holding_memory(plan: dict) -> list:
    """The gears whose shares are the box's memory, by the memory gate's rule (a plan's proc_root
    is set only for a fake /proc)."""
    gated = memory_gated(plan, bool(plan.get("proc_root")))
    return [role for role in start_order(plan) if holds_memory(role["gear"], gated)]


def _secret(plan: dict, secrets: dict, name: str, variable: str) -> str:
    value = secrets.get(name)
    if not value:
        raise RenderError(f"host {plan['host']}, field {variable}: the plan needs this key but "
                          "none was given; set it (from vault) in the host's variables")
    return value


def _client_keys(plan: dict, declared: list, secrets: dict) -> str:
    """GATEWAY_CLIENT_KEYS: name=key:class[:inflight_limit], each key from the vault."""
    keys = secrets.get("client_keys") or {}
    entries = []
    for client in declared:
        name = client["name"]
        key = keys.get(name)
        field = f"fleet_client_keys.{name}.key"
        if not key:
            raise RenderError(f"host {plan['host']}, field {field}: the plan names this client "
                              "key but none was given; set it (from vault) in the host's "
                              "variables")
        if re.search(r"[\s,:]", key):
            raise RenderError(f"host {plan['host']}, field {field}: a client key may not hold "
                              "whitespace, commas or colons; generate another")
        limit = client.get("inflight_limit")
        entries.append(f"{name}={key}:{client['class']}" + (f":{limit}" if limit else ""))
    return ",".join(entries)


def _peer_key(plan: dict, role: dict, peer: dict, secrets: dict) -> str:
    key = (secrets.get("peer_keys") or {}).get(peer["host"])
    if not key:
        raise RenderError(f"host {plan['host']}, role {role['role']}, field "
                          f"fleet_gateway_api_key: {peer['host']} runs an inbound gate but its "
                          "key was not given; set it in that peer's variables")
    return key


def _number(value) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _role_env(plan: dict, role: dict, secrets: dict) -> list:
    prefix = role["prefix"]
    env = [(role_env(prefix, "ROUTE"), role["mode"]),
           (role_env(prefix, "FEASIBLE"), "true" if role["feasible"] else "false")]
    if role["served_name"]:
        env.append((role_env(prefix, "SERVED_NAME"), role["served_name"]))
    if role["context"]:
        env.append((role_env(prefix, "MAX_MODEL_LEN"), str(role["context"])))
    gear = role["gear"]
    if gear and not role_spec(role["role"]).is_audio:
        env.append((role_env(prefix, "BASE_URL"), gear_base_url(plan, role)))
        env.append((role_env(prefix, "MAX_ACTIVE"), str(gear["max_active"])))
        # Published on /capabilities, so peers pooling this gear compare it in the fingerprint.
        if gear["quantization"]:
            env.append((role_env(prefix, "QUANTIZATION"), gear["quantization"]))
        if schedules_by_priority(role):
            env.append((role_env(prefix, "PRIORITY_SCHEDULING"), "true"))
        # The admission queue's prior for the gear's rate, until a request has finished there.
        if gear.get("rate") is not None:
            env.append((role_env(prefix, "RATE"), _wall_rate(plan, gear)))
    env.extend(_peer_env(plan, role, secrets))
    return env


def _wall_rate(plan: dict, gear: dict) -> str:
    """The gear's declared tok/s as the gateway will measure it: a simulated gear runs at
    the box's time scale."""
    scale = plan["gears"]["sim_time_scale"] if gear["engine"] == SIM else 1.0
    return _number(round(gear["rate"] * scale, 3))


def _peer_env(plan: dict, role: dict, secrets: dict) -> list:
    prefix, peers, mode = role["prefix"], role["peers"], role["mode"]
    if not peers:
        return []
    singular = peers[0] if not role["feasible"] else None
    env = []
    if singular:
        env.append((role_env(prefix, "PEER_ORIGIN"), singular["origin"]))
    if singular and singular["auth"] and mode in (PROXY, POOL):
        env.append((role_env(prefix, "PEER_API_KEY"), _peer_key(plan, role, singular, secrets)))
    if mode in (POOL, OWNERS):
        origins = ",".join(peer["origin"] for peer in peers)
        env.append((role_env(prefix, "PEER_ORIGINS"), origins))
    if mode == POOL:
        # An empty slot inherits the singular peer's key; a peer without a gate needs none.
        slots = ["" if peer is singular or not peer["auth"]
                 else _peer_key(plan, role, peer, secrets) for peer in peers]
        env.append((role_env(prefix, "PEER_API_KEYS"), ",".join(slots)))
        if all(peer["rate"] is not None for peer in peers):
            env.append((role_env(prefix, "PEER_RATES"),
                        ",".join(str(peer["rate"]) for peer in peers)))
    # A pool has another replica to continue a stream on (unless the inventory turned it off);
    # a lone backend has none.
    if role["stream_resume"]:
        env.append((role_env(prefix, "STREAM_RESUME"), "true"))
    return env


def gear_base_url(plan: dict, role: dict) -> str:
    """Where the gateway reaches a local gear: its compose service, or 127.0.0.1:port."""
    gear = role["gear"]
    if plan["runtime"] == "compose":
        return f"http://{gear['service']}:{GEAR_PORT}"
    return f"http://127.0.0.1:{gear['port']}"


def start_order(plan: dict) -> list:
    """The local (non-audio) gears, largest memory share first: on a unified-memory box each
    starts only once the one before is healthy, so their start-up peaks never overlap."""
    gears = [role for role in plan.get("roles", {}).values()
             if role["gear"] and not role_spec(role["role"]).is_audio]
    return sorted(gears, key=lambda role: -role["gear"]["gpu_memory_utilization"])


def gear_service_name(plan: dict, role: dict) -> str:
    """A gear's service in the box's runtime: its compose service, or its supervised service."""
    return role["gear"]["service"] if plan["runtime"] == "compose" else f"gear-{role['role']}"


def process_health_url(role: dict) -> str:
    """Where a process-runtime gear answers /health on its box."""
    return f"http://127.0.0.1:{role['gear']['port']}/health"


def gateway_health_url(plan: dict) -> str:
    """Where the process-runtime gateway answers /health on its box: its listening address,
    or the loopback when it listens on every address."""
    host = plan["gateway"]["host"]
    return f"{http_origin(_LOOPBACK_OF.get(host, host), plan['gateway']['port'])}/health"


def _local_audio(plan: dict) -> list:
    return [role for role in plan["roles"].values()
            if role["gear"] and role_spec(role["role"]).is_audio]


def _local_audio_url(plan: dict) -> str | None:
    audio = _local_audio(plan)
    return gear_base_url(plan, audio[0]) if audio else None


_PLAIN = re.compile(r"^[A-Za-z0-9_./:@,=+-]*\Z")


def env_line(name: str, value: str) -> str:
    """One NAME=value line of the .env, as every reader of it takes it literally: the
    supervisor's parser, Compose's env_file and systemd's EnvironmentFile. A plain value goes
    bare; any other in single quotes, which none of them interpolates ($) or unescapes (\\).
    The plan refuses what this cannot carry (a newline, a single quote); meeting one here is
    a defect, refused rather than written wrong."""
    if _PLAIN.match(value):
        return f"{name}={value}"
    if "\n" in value or "\r" in value or "'" in value:
        raise RenderError(f"{name}: a value may not hold a newline or a single quote")
    return f"{name}='{value}'"


def format_env(env: list, mask_secrets: bool = False) -> str:
    """The dotenv text: NAME=value lines (env_line's), secrets masked when asked."""
    lines = [ENV_HEADER]
    for name, value in env:
        line = env_line(name, value)
        if mask_secrets and is_secret_env(name) and value.strip(","):
            line = f"{name}=********"
        lines.append(line)
    return "\n".join(lines) + "\n"


def secret_values(env: list) -> list:
    """Every secret value in an env (keys and key-list slots), for masking."""
    values = []
    for name, value in env:
        if is_secret_env(name):
            values.extend(slot for slot in value.split(",") if slot)
    return values


# ---------------------------------------------------------------- compose.yaml

def render_compose(plan: dict, sources: dict | None = None) -> dict:
    """The compose project: one service per local gear, the gateway, only it published.

    sources holds digests of the deployed source each kind of container runs (source_digests):
    as a label on the gateway and the simulated gears it makes compose recreate them when what
    they run changes, and only then. vLLM gears only start logwrap from it: they are left
    running."""
    sources = sources or {}
    sim_labels = _source_labels(sources.get("sim"))
    services = {}
    previous = None
    for role in start_order(plan):
        service = _gear_service(plan, role, sim_labels)
        if previous:
            service["depends_on"] = {previous: {"condition": "service_healthy"}}
        previous = role["gear"]["service"]
        services[previous] = service
    audio = _local_audio(plan)
    if audio:
        services["audio"] = _audio_service(plan, audio[0], sim_labels)
    services["gateway"] = _gateway_service(plan, sorted(services),
                                           _source_labels(sources.get("gateway")))
    return {"services": services}


def _source_labels(digest: str | None) -> dict:
    return {"lobes.fleet.gateway-source": digest} if digest else {}


def schedules_by_priority(role: dict) -> bool:
    """A generate gear runs vLLM's priority scheduling policy, so the gateway sends each
    request's class as its `priority` (the gateway holds a gear's overflow in its own queue,
    but a pooled gear also queues what other boxes place on it)."""
    return bool(role["gear"]) and role_spec(role["role"]).task == GENERATE


def vllm_args(plan: dict, role: dict, host: str = "0.0.0.0", port: int = GEAR_PORT,
              gpu: bool = True) -> list:
    """The vLLM flags a gear runs with (after `vllm serve <checkpoint>`): one command line for
    the GPU image and the CPU build, which leaves out the GPU's own flags (the memory
    utilization, speculative decoding)."""
    gear = role["gear"]
    spec = role_spec(role["role"])
    args = ["--host", host, "--port", str(port),
            "--served-model-name", gear["served_name"],
            "--max-model-len", str(gear["context"])]
    if gpu:
        args += ["--gpu-memory-utilization", _number(gear["gpu_memory_utilization"])]
    args += ["--max-num-seqs", str(gear["max_active"])]
    if schedules_by_priority(role):
        args += ["--scheduling-policy", "priority"]
    if gear["quantization"]:
        args += ["--quantization", gear["quantization"]]
    if gear["tool_parser"]:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", gear["tool_parser"]]
    if gpu and gear["mtp"]:
        args += ["--speculative-config", json.dumps(
            {"method": "mtp", "num_speculative_tokens": gear["num_speculative_tokens"]})]
    overrides = json.loads(spec.hf_overrides) if spec.hf_overrides else {}
    if gear["yarn_factor"]:
        overrides["rope_scaling"] = {"rope_type": "yarn", "factor": gear["yarn_factor"],
                                     "original_max_position_embeddings": gear["native_context"]}
    if overrides:
        args += ["--hf-overrides", json.dumps(overrides, sort_keys=True)]
    return args + list(spec.vllm_args)


def _logwrap(service: str, command: list) -> list:
    """The container's entrypoint: command with its output also appended to the box's log."""
    return ["python3", "-m", "lobes_supervisor.logwrap", f"{LOG_MOUNT}/{service}.log", "--",
            *command]


def _python_env(extra: dict | None = None) -> dict:
    return {"PYTHONPATH": GATEWAY_SOURCE_MOUNT, "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1", **(extra or {})}


def _mounts(plan: dict, *extra: str) -> list:
    """The gateway source (logwrap, the simulator, the gateway), the log directory, and a fake
    /proc when the box has one."""
    fake_proc = [f"{plan['proc_root']}:{plan['proc_root']}"] if plan["proc_root"] else []
    return [f"./gateway:{GATEWAY_SOURCE_MOUNT}:ro", f"./state/log:{LOG_MOUNT}", *fake_proc,
            *extra]


def _http_probe(port: int) -> dict:
    """A healthcheck on /health by the image's python3 (the python images have no curl)."""
    probe = ("import http.client as h; c = h.HTTPConnection('127.0.0.1', "
             f"{port}, timeout=3); c.request('GET', '/health'); "
             "exit(c.getresponse().status != 200)")
    return {"test": ["CMD", "python3", "-c", probe], "interval": "10s", "timeout": "5s",
            "retries": 3}


def _gear_service(plan: dict, role: dict, labels: dict) -> dict:
    if role["gear"]["engine"] == SIM:
        return _sim_container(plan, role["gear"]["service"], sim_gear_args(plan, role), labels)
    return _vllm_service(plan, role)


def pinned_model_dir(model_dir: str, gear: dict) -> str | None:
    """Where a gear's pinned hub checkpoint lies under `model_dir` (`<org>/<name>/<revision>`,
    as playbooks/models.yml places it); None for an unpinned one, which vLLM fetches itself."""
    revision = gear.get("pinned_revision")
    return f"{model_dir}/{gear['checkpoint']}/{revision}" if revision else None


def _vllm_service(plan: dict, role: dict) -> dict:
    service = role["gear"]["service"]
    hf_cache = f"{plan['gears']['hf_cache']}:/root/.cache/huggingface"
    local = pinned_model_dir(MODELS_MOUNT, role["gear"])
    # A pinned checkpoint is loaded from the box's own copy, offline: no hub at start.
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"} if local else {}
    models = [f"{plan['gears']['model_dir']}:{MODELS_MOUNT}:ro"] if local else []
    return {
        "image": plan["gears"]["image"],
        "restart": "unless-stopped",
        "runtime": "nvidia",
        "ipc": "host",
        "entrypoint": _logwrap(service, ["vllm", "serve"]),
        "command": [local or role["gear"]["checkpoint"], *vllm_args(plan, role)],
        "environment": _python_env({"HF_HOME": "/root/.cache/huggingface", **offline}),
        "volumes": _mounts(plan, hf_cache, *models),
        "healthcheck": {
            "test": ["CMD", "curl", "-fsS", f"http://127.0.0.1:{GEAR_PORT}/health"],
            "interval": "30s", "timeout": "5s", "retries": 3,
            # A 27B gear takes about 7 minutes from start to /health on a Spark.
            "start_period": "15m",
        },
    }


def _sim_container(plan: dict, service: str, args: list, labels: dict) -> dict:
    """lobes_sim in place of the vLLM image, on the same port and service name."""
    return _labelled(labels, {
        "image": plan["gears"]["sim_image"],
        "restart": "unless-stopped",
        "user": NOBODY,
        "working_dir": GATEWAY_SOURCE_MOUNT,
        "entrypoint": _logwrap(service, ["python3", "-m", "lobes_sim"]),
        "command": ["--host", "0.0.0.0", "--port", str(GEAR_PORT), *args],
        "environment": _python_env(),
        "volumes": _mounts(plan),
        "healthcheck": _http_probe(GEAR_PORT),
    })


def _labelled(labels: dict, service: dict) -> dict:
    return {**service, "labels": dict(labels)} if labels else service


def _audio_service(plan: dict, role: dict, labels: dict) -> dict:
    if role["gear"]["engine"] == SIM:
        return _sim_container(plan, "audio", sim_audio_args(plan, role), labels)
    return {
        "image": plan["gears"]["audio_image"],
        "restart": "unless-stopped",
        "runtime": "nvidia",
        "environment": {"HF_HOME": "/root/.cache/huggingface"},
        "volumes": [f"{plan['gears']['hf_cache']}:/root/.cache/huggingface"],
    }


def source_digests(directory: str) -> dict | None:
    """Per kind of container ("gateway", "sim"), a short digest of the deployed source it runs
    (its INPUTS); None when the source is not there."""
    if not os.path.isdir(os.path.join(directory, "lobes_gateway")):
        return None
    return {kind: _inputs_digest(directory, paths) for kind, paths in INPUTS.items()}


def _inputs_digest(directory: str, paths: tuple) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(f"{path}:{tree_digest(os.path.join(directory, path))}".encode())
    return digest.hexdigest()[:16]


def _gateway_service(plan: dict, backends: list, labels: dict) -> dict:
    gateway = plan["gateway"]
    port = gateway["port"]
    service = {
        # The collection's own gateway source, mounted read-only: no separate pin to drift.
        "image": plan["gears"]["gateway_image"],
        "restart": "unless-stopped",
        "user": NOBODY,
        "working_dir": GATEWAY_SOURCE_MOUNT,
        "entrypoint": _logwrap("gateway", ["python3", "-m", "lobes_gateway"]),
        "env_file": [".env"],
        "environment": _python_env(),
        "volumes": _mounts(plan),
        "ports": [f"{_bracketed(gateway['host'])}:{port}:{port}"],
        "healthcheck": _http_probe(port),
    }
    if backends:
        service["depends_on"] = backends
    return _labelled(labels, service)


def _bracketed(address: str) -> str:
    """An address as a compose port mapping writes it: IPv6 in brackets."""
    return f"[{address}]" if ":" in address else address


_KEY = re.compile(r"^[A-Za-z0-9_.-]+\Z")


def to_yaml(value, indent: int = 0) -> str:
    """A small YAML emitter for dicts, lists, strings, numbers and booleans: the boxes need
    no YAML library. Strings are JSON-quoted, which YAML reads as double-quoted scalars."""
    return "\n".join(_yaml_lines(value, indent)) + "\n"


def _yaml_scalar(value) -> str:
    """A scalar as compose.yaml carries it: JSON-quoted strings (YAML's double-quoted form,
    every control character escaped) with '$' doubled, so Compose never interpolates one."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if value is None:
        return "null"
    return json.dumps(str(value).replace("$", "$$"))


def _yaml_lines(value, indent: int) -> list:
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if not _KEY.match(str(key)):
                raise RenderError(f"compose key {key!r} is not a plain name")
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml_lines(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_yaml_empty(item)}")
        return lines
    if isinstance(value, list):
        lines = []
        for item in value:
            if isinstance(item, (dict, list)) and item:
                nested = _yaml_lines(item, indent + 2)
                lines.append(f"{pad}- {nested[0].lstrip()}")
                lines.extend(nested[1:])
            else:
                lines.append(f"{pad}- {_yaml_empty(item)}")
        return lines
    return [pad + _yaml_scalar(value)]


def _yaml_empty(value) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _yaml_scalar(value)


# ---------------------------------------------------------------- services.json

def render_services(plan: dict, gateway_dir: str = "gateway") -> dict:
    """The process runtime's services: one gear per local role, lobes_sim or vLLM's CPU build
    (largest first, each after the one before is healthy), then the gateway.

    Paths are relative to the directory that holds services.json (the supervisor runs each
    service there), so PYTHONPATH=gateway finds the deployed gateway/ source."""
    python = plan["gears"]["python"]
    env = {"PYTHONPATH": gateway_dir}
    services = []
    for role in start_order(plan):
        cpu = role["gear"]["engine"] == VLLM_CPU
        service = (_cpu_engine_service(plan, role, env) if cpu
                   else _sim_service(plan, role, python, env, gateway_dir))
        service["health"] = process_health_url(role)
        service["health_timeout_s"] = CPU_ENGINE_HEALTH_TIMEOUT_S if cpu else SIM_HEALTH_TIMEOUT_S
        if services:
            service["after"] = [services[-1]["name"]]
        services.append(service)
    audio = _local_audio(plan)
    if audio:
        services.append(_sim_audio_service(plan, audio[0], python, env, gateway_dir))
    services.append({
        "name": "gateway",
        "argv": [python, "-m", "lobes_gateway"],
        "cwd": ".",
        "env": dict(env),
        "env_file": ".env",
        "pidfile": "gateway.pid",
        "log": "gateway.log",
        "health": gateway_health_url(plan),
        "health_timeout_s": GATEWAY_HEALTH_TIMEOUT_S,
        "watch": [f"{gateway_dir}/{path}" for path in INPUTS["gateway"]],
    })
    return {"version": 1, "host": plan["host"], "services": services}


def engine_venv(plan: dict) -> str:
    """Where the box's pinned CPU engine build is installed."""
    build = plan["gears"]["engine_build"]
    return f"{plan['gears']['engine_dir']}/{build['key']}/venv"


def cpu_engine_argv(plan: dict, role: dict) -> list:
    """vLLM's CPU build serving a gear: the GPU gear's command line less its GPU flags, on the
    loopback, run eagerly (compiling the model first costs a minute and a cache directory)."""
    gear = role["gear"]
    model_dir = plan["gears"]["model_dir"]
    model = pinned_model_dir(model_dir, gear) or f"{model_dir}/{gear['checkpoint']}"
    return [f"{engine_venv(plan)}/bin/python", "-m", "vllm.entrypoints.openai.api_server",
            "--model", model,
            *vllm_args(plan, role, host="127.0.0.1", port=gear["port"], gpu=False),
            "--enforce-eager"]


def cpu_engine_env(plan: dict, role: dict) -> dict:
    """The CPU engine's environment: its KV cache size, no hub, nothing sent off the box."""
    return {**CPU_ENGINE_ENV, "HF_HOME": plan["gears"]["hf_cache"],
            "VLLM_CPU_KVCACHE_SPACE": _number(role["gear"]["kv_cache_gib"])}


def _cpu_engine_service(plan: dict, role: dict, env: dict) -> dict:
    name = gear_service_name(plan, role)
    return {
        "name": name,
        "role": role["role"],
        "argv": cpu_engine_argv(plan, role),
        "cwd": ".",
        # The gateway source stays on the path: a systemd unit's health wait runs from it.
        "env": {**env, **cpu_engine_env(plan, role)},
        "pidfile": f"{name}.pid",
        "log": f"{name}.log",
    }


def _sim_argv(python: str, port: int) -> list:
    return [python, "-m", "lobes_sim", "--host", "127.0.0.1", "--port", str(port)]


def sim_gear_args(plan: dict, role: dict) -> list:
    """lobes_sim's flags for a gear (after --host and --port), in either runtime. With a fake
    /proc the gear holds its memory share there while it runs."""
    gear = role["gear"]
    args = ["--profile", gear["sim_profile"], "--served-name", gear["served_name"],
            "--max-model-len", str(gear["context"]), "--max-num-seqs", str(gear["max_active"]),
            "--time-scale", _number(plan["gears"]["sim_time_scale"])]
    if schedules_by_priority(role):
        args += ["--scheduling-policy", "priority"]
    if gear["quantization"]:
        args += ["--quantization", gear["quantization"]]
    if plan["proc_root"]:
        args += ["--proc-root", plan["proc_root"], "--hold-memory-gib", _number(gear["memory_gib"])]
    return args


def sim_audio_args(plan: dict, role: dict) -> list:
    """lobes_sim's flags for the audio bridge (after --host and --port)."""
    return ["--profile", role["gear"]["sim_profile"],
            "--time-scale", _number(plan["gears"]["sim_time_scale"])]


def _sim_service(plan: dict, role: dict, python: str, env: dict, gateway_dir: str) -> dict:
    argv = _sim_argv(python, role["gear"]["port"]) + sim_gear_args(plan, role)
    return _sim_entry(gear_service_name(plan, role), role["role"], argv, env, gateway_dir)


def _sim_audio_service(plan: dict, role: dict, python: str, env: dict,
                       gateway_dir: str) -> dict:
    argv = _sim_argv(python, role["gear"]["port"]) + sim_audio_args(plan, role)
    return _sim_entry("gear-audio", "audio", argv, env, gateway_dir)


def _sim_entry(name: str, role: str, argv: list, env: dict, gateway_dir: str) -> dict:
    return {
        "name": name,
        "role": role,
        "argv": argv,
        "cwd": ".",
        "env": dict(env),
        "pidfile": f"{name}.pid",
        "log": f"{name}.log",
        "watch": [f"{gateway_dir}/{path}" for path in INPUTS["sim"]],
    }
