"""The mesh plan: every box's declarations resolved against the catalog, the hardware and
its peers, and rejected before anything is deployed when the mesh cannot work.

plan_mesh(hostvars_by_host) -> {"boxes": {host: box plan}, "hosts": [...]}; the box plan
shape is documented in docs/inventory.md and in mesh_plan's RETURN. It carries no secrets:
keys stay in hostvars and reach render through its no_log `secrets` option.
"""

from __future__ import annotations

from dataclasses import replace

from ansible_collections.lobes.fleet.plugins.module_utils.contract import (
    AUDIO_TASKS,
    GENERATE,
    OFF,
    POOL,
    PROXY,
    REFER,
    ROLES,
    SERVE,
    SIM_PROFILES,
    TCP_PORTS,
    OriginError,
    canonical_origin,
    role_index,
    role_spec,
)
from ansible_collections.lobes.fleet.plugins.module_utils.engines import (
    CPU_ENGINE_BASE_GIB,
    DEFAULT_CPU_KV_CACHE_GIB,
    SIM,
    VLLM,
    VLLM_CPU,
    VLLM_CPU_BUILD,
)
from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetError, FleetErrors
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import (
    HardwareProfile,
    hardware_profile,
    planned_hardware,
)
from ansible_collections.lobes.fleet.plugins.module_utils.inventory import (
    BoxDecl,
    RoleDecl,
    read_box,
)
from ansible_collections.lobes.fleet.plugins.module_utils.schema import closest

PLAN_VERSION = 1
DEFAULT_SPECULATIVE_TOKENS = 2


def plan_mesh(hostvars_by_host: dict) -> dict:
    """Validate the whole mesh and return each box's resolved plan; raise FleetErrors.

    Every refusal of every host is collected. A box or role with a refused value is left out
    of the checks that involve it (its peers', the budget, the ports), so what is reported is
    each mistake, never the errors it would cause further on."""
    boxes, errors = _read_boxes(hostvars_by_host)
    sound = {host: box for host, box in boxes.items() if not box.damaged}
    local, unresolved = {}, set()
    for host, box in sound.items():
        local[host] = _resolve_local_roles(box, errors, unresolved)
    skipped = unresolved | {(host, role) for host, box in boxes.items()
                            for role in box.damaged_roles}
    errors.extend(_check_origins(sound))
    errors.extend(_check_monitoring_host(boxes))
    for host, box in sound.items():
        errors.extend(_check_ports(box, local[host]))
        errors.extend(_check_model_names(box, local[host]))
    errors.extend(_check_budgets(sound, local))
    cycles = _check_proxy_cycles(sound, skipped)
    errors.extend(cycles)
    if not cycles:
        for box in sound.values():
            errors.extend(_check_peers(box, boxes, local, skipped))
    if errors:
        raise FleetErrors(errors)
    return {
        "version": PLAN_VERSION,
        "hosts": sorted(boxes),
        "boxes": {host: _box_plan(box, boxes, local) for host, box in sorted(boxes.items())},
    }


def _read_boxes(hostvars_by_host: dict) -> tuple:
    boxes, errors = {}, []
    for host, hostvars in sorted(hostvars_by_host.items()):
        boxes[host], refusals = read_box(host, dict(hostvars or {}))
        errors.extend(refusals)
    return boxes, errors


def box_hardware(box: BoxDecl) -> HardwareProfile:
    """The box's hardware profile, with the inventory's headroom override applied."""
    profile = hardware_profile(box.hardware)
    if box.headroom_gib is None:
        return profile
    return replace(profile, headroom_gib=box.headroom_gib)


# ---------------------------------------------------------------- local gears

def _resolve_local_roles(box: BoxDecl, errors: list, unresolved: set) -> dict:
    """role -> served-here parameters for every role the box declares feasible; a role whose
    gear cannot be resolved joins `unresolved` as (host, role)."""
    resolved = {}
    hardware = box_hardware(box)
    for decl in box.roles:
        if not decl.feasible or decl.role in box.damaged_roles:
            continue
        try:
            resolved[decl.role] = _resolve_gear(box, hardware, decl)
        except FleetError as error:
            errors.append(error)
            unresolved.add((box.host, decl.role))
    return resolved


def _resolve_gear(box: BoxDecl, hardware: HardwareProfile, decl: RoleDecl) -> dict:
    spec = role_spec(decl.role)
    if decl.peer_field in ("referral", "proxy", "owners"):
        raise FleetError(box.host, decl.role, decl.peer_field,
                         "a role served here takes no referral, proxy or owners; set "
                         "feasible: false to hand it to the peer")
    engine = gear_engine(box, hardware, decl)
    if spec.is_audio:
        return _resolve_audio(box, decl, engine)
    checkpoint = decl.checkpoint or spec.checkpoint
    custom = checkpoint != spec.checkpoint
    context = decl.context or spec.context
    native = decl.native_context or (None if custom else spec.native_window) or context
    _check_window(box, decl, context, native)
    if engine == VLLM_CPU:
        kv_cache = _kv_cache(decl)
        memory = CPU_ENGINE_BASE_GIB + kv_cache
        # Its share of the box's memory, as a GPU gear's utilization: the budget and the start
        # order weigh every gear alike.
        util = round(memory / hardware.memory_gib, 4)
        mtp = _no_mtp_on_cpu(box, decl)
    else:
        kv_cache = None
        util = _utilization(box, decl, spec.gpu_memory_utilization)
        mtp = _mtp(box, hardware, decl, spec.mtp_checkpoint and not custom)
    max_active = decl.max_active if decl.max_active is not None else spec.max_active
    sim_profile = _sim_profile(box, decl, engine)
    speculative = (DEFAULT_SPECULATIVE_TOKENS if decl.num_speculative_tokens is None
                   else decl.num_speculative_tokens)
    return {
        "checkpoint": checkpoint,
        "revision": _revision(decl, spec, custom),
        "served_name": decl.served_name or checkpoint,
        "context": context,
        "native_context": native,
        "yarn_factor": decl.yarn_factor if context > native else None,
        "gpu_memory_utilization": util,
        "max_active": max_active,
        "mtp": mtp,
        "num_speculative_tokens": speculative if mtp else None,
        "tool_parser": decl.tool_parser or spec.tool_parser,
        "quantization": decl.quantization or (None if custom else spec.quantization),
        "sim_profile": sim_profile,
        "engine": engine,
        "kv_cache_gib": kv_cache,
        # The gear's share of the box's one memory pool (the memory gate, sims).
        "memory_gib": round(util * hardware.memory_gib, 2),
    }


def _kv_cache(decl: RoleDecl) -> int:
    """A CPU gear's KV cache in whole GiB (the schema bounds a declared one)."""
    return decl.kv_cache_gib if decl.kv_cache_gib is not None else DEFAULT_CPU_KV_CACHE_GIB


def _no_mtp_on_cpu(box: BoxDecl, decl: RoleDecl) -> bool:
    if decl.mtp:
        raise FleetError(box.host, decl.role, "mtp", "vLLM's CPU build runs no speculative "
                         "decoding; set mtp: false")
    if decl.gpu_memory_utilization is not None:
        raise FleetError(box.host, decl.role, "gpu_memory_utilization",
                         "vLLM's CPU build has no GPU share; size its KV cache with "
                         "kv_cache_gib instead")
    return False


def gear_engine(box: BoxDecl, hardware: HardwareProfile, decl: RoleDecl) -> str:
    """vllm, vllm-cpu or sim: the role's engine, else the box's, else vllm only where compose
    has a GPU.

    Compose runs the vLLM image or the simulator's; the process runtime runs vLLM's CPU build
    (a venv of its own on the box) or the simulator."""
    field = "engine" if decl.engine else "fleet_gear_engine"
    role = decl.role if decl.engine else None
    engine = decl.engine or box.gear_engine
    if engine is None:
        return VLLM if box.runtime == "compose" and hardware.has_gpu else SIM
    if engine == VLLM and box.runtime != "compose":
        raise FleetError(box.host, role, field, "the process runtime runs vLLM's CPU build "
                         "or simulated gears; use engine vllm-cpu or sim, or fleet_runtime: "
                         "compose")
    if engine == VLLM and not hardware.has_gpu:
        raise FleetError(box.host, role, field, f"hardware {box.hardware} has no GPU to run "
                         "vLLM; use engine vllm-cpu (process runtime) or sim")
    if engine == VLLM_CPU and box.runtime != "process":
        raise FleetError(box.host, role, field, "vLLM's CPU build runs under the process "
                         "runtime; set fleet_runtime: process")
    if engine == VLLM_CPU and role_spec(decl.role).is_audio:
        raise FleetError(box.host, role, field, "vLLM's CPU build serves no audio lane; use "
                         "engine sim for it")
    return engine


def _resolve_audio(box: BoxDecl, decl: RoleDecl, engine: str) -> dict:
    if engine == "vllm" and not box.audio_image:
        raise FleetError(box.host, decl.role, "fleet_audio_image",
                         "is required to serve an audio lane under compose (the realtime "
                         "bridge image), or run it simulated with engine: sim")
    spec = role_spec(decl.role)
    checkpoint = decl.checkpoint or spec.checkpoint
    return {"checkpoint": checkpoint,
            "revision": _revision(decl, spec, checkpoint != spec.checkpoint),
            "sim_profile": _sim_profile(box, decl, engine), "engine": engine}


def _revision(decl: RoleDecl, spec, custom: bool) -> str | None:
    """The declared revision, else the catalog's for its own checkpoint; None: unpinned here
    (the lock file may pin it)."""
    return decl.revision or (None if custom else spec.revision)


def _sim_profile(box: BoxDecl, decl: RoleDecl, engine: str) -> str:
    """The gear's lobes_sim profile: declared or the role's; a simulated gear's profile serves
    the role's task (an embedder profile cannot stand in for cortex)."""
    profile = decl.sim_profile or _default_sim_profile(box, decl.role)
    task = role_spec(decl.role).task
    served = SIM_PROFILES[profile]
    if engine == "sim" and served != task and not {served, task} <= AUDIO_TASKS:
        fitting = [name for name, kind in SIM_PROFILES.items()
                   if kind == task or {kind, task} <= AUDIO_TASKS]
        raise FleetError(box.host, decl.role, "sim_profile",
                         f"{profile!r} simulates a {served} gear, not a {task} one",
                         allowed=", ".join(fitting))
    return profile


def _check_window(box: BoxDecl, decl: RoleDecl, context: int, native: int) -> None:
    if context <= native:
        return
    if decl.yarn_factor is None:
        raise FleetError(box.host, decl.role, "context",
                         f"{context} exceeds the checkpoint's native window {native}; lower it "
                         f"or declare yarn_factor >= {context / native:g}")
    if context > native * decl.yarn_factor:
        raise FleetError(box.host, decl.role, "context",
                         f"{context} exceeds the YaRN window {native} x {decl.yarn_factor:g} = "
                         f"{int(native * decl.yarn_factor)}; raise yarn_factor to "
                         f"{context / native:g}")


def _utilization(box: BoxDecl, decl: RoleDecl, default: float | None) -> float:
    util = decl.gpu_memory_utilization if decl.gpu_memory_utilization is not None else default
    if util is None:
        raise FleetError(box.host, decl.role, "gpu_memory_utilization",
                         "is unmeasured in the catalog; declare the value measured on this box")
    return util


def _mtp(box: BoxDecl, hardware: HardwareProfile, decl: RoleDecl, checkpoint_mtp: bool) -> bool:
    if decl.mtp is None:
        return checkpoint_mtp and hardware.mtp_kernel
    if decl.mtp and not hardware.mtp_kernel:
        raise FleetError(box.host, decl.role, "mtp",
                         f"{hardware.name} ({hardware.arch}) has no MTP kernel for this "
                         "checkpoint; set mtp: false")
    return decl.mtp


def _default_sim_profile(box: BoxDecl, role: str) -> str:
    if role == "cortex" and box.hardware == "thor":
        return "thor-cortex"
    return role_spec(role).sim_profile


# ---------------------------------------------------------------- mesh checks

def budget(box: BoxDecl, local: dict) -> dict:
    """The sum of the gears' utilization fractions, each of the whole memory, against the
    usable memory less the headroom."""
    hardware = box_hardware(box)
    gears = {role: gear["gpu_memory_utilization"] for role, gear in local.items()
             if "gpu_memory_utilization" in gear}
    utilization = round(sum(gears.values()), 4)
    reserved = round(utilization * hardware.memory_gib, 2)
    return {
        "gears": gears,
        "utilization": utilization,
        "reserved_gib": reserved,
        "headroom_gib": hardware.headroom_gib,
        "usable_gib": hardware.usable_gib,
        "max_utilization": round(hardware.max_utilization, 4),
        "fits": reserved + hardware.headroom_gib <= hardware.usable_gib,
    }


def memory_gated(plan: dict, fake_proc: bool) -> bool:
    """Whether every gear of a box's plan holds its share of the box's memory: on a box with a
    GPU, or where the gears hold their shares in a fake /proc (tests)."""
    return bool(planned_hardware(plan).get("has_gpu")) or fake_proc


def holds_memory(gear: dict, gated: bool) -> bool:
    """Whether a gear's share is its box's memory: every gear where memory_gated, else only a
    gear on vLLM's CPU build (simulated gears on a box without a GPU hold none of it)."""
    return gated or gear["engine"] == VLLM_CPU


def _check_budgets(boxes: dict, local: dict) -> list:
    errors = []
    for host, box in boxes.items():
        summary = budget(box, local[host])
        if summary["fits"]:
            continue
        parts = " + ".join(f"{role} {util:g}" for role, util in summary["gears"].items())
        errors.append(FleetError(
            host, ",".join(summary["gears"]), "gpu_memory_utilization",
            f"budget over usable memory: {parts} = {summary['utilization']:g} x "
            f"{box_hardware(box).memory_gib:g} GiB = {summary['reserved_gib']:g} GiB, plus "
            f"{summary['headroom_gib']:g} GiB headroom, exceeds {summary['usable_gib']:g} GiB "
            f"usable (at most {summary['max_utilization']:g} in total); lower a gear's "
            "utilization or drop a role"))
    return errors


def _check_origins(boxes: dict) -> list:
    """No two boxes share an origin, however it is spelt (case, an explicit :80)."""
    seen, errors = {}, []
    for host, box in sorted(boxes.items()):
        try:
            origin = canonical_origin(box.origin)
        except OriginError as exc:  # a derived origin: ansible_host and the port are read
            errors.append(FleetError(host, None, "fleet_origin", exc.problem, allowed=exc.fix))
            continue
        if origin in seen:
            errors.append(FleetError(host, None, "fleet_origin",
                                     f"{box.origin} is also {seen[origin]}'s origin"))
        seen.setdefault(origin, host)
    return errors


def _check_monitoring_host(boxes: dict) -> list:
    """fleet_monitoring_host names a host of the inventory (reported once per name)."""
    errors, named = [], {}
    for host, box in sorted(boxes.items()):
        if box.monitoring_host and box.monitoring_host not in boxes:
            named.setdefault(box.monitoring_host, host)
    for name, host in named.items():
        errors.append(FleetError(host, None, "fleet_monitoring_host",
                                 f"{name!r} is not a host of this inventory; name the box that "
                                 "runs Prometheus", suggestion=closest(name, boxes)))
    return errors


def _wanted_ports(box: BoxDecl, gears: dict) -> list:
    """(port, address, what listens, the field that sets the port) for every port the box
    listens on: the gateway, process-runtime gears (compose gears listen inside their
    containers) and Prometheus on the monitoring box."""
    wanted = [(box.gateway_port, box.gateway_host, "gateway", "fleet_gateway_port")]
    if box.runtime == "process":
        audio = [role for role in gears if role_spec(role).is_audio][:1]
        wanted += [(box.gear_port_base + role_index(role), "127.0.0.1",
                    "gear-audio" if role in audio else f"gear-{role}", "fleet_gear_port_base")
                   for role in sorted(gears, key=role_index)
                   if not role_spec(role).is_audio or role in audio]
    if box.monitoring_host == box.host and box.monitoring_listen:
        address, _colon, port = box.monitoring_listen.rpartition(":")
        wanted.append((int(port), address.strip("[]") or "0.0.0.0", "prometheus",
                       "fleet_monitoring_listen_address"))
    return wanted


def listening(box: BoxDecl, gears: dict) -> list:
    """The box's ports as the plan records them, for preflight: port, address, service and
    the inventory variable that sets the port."""
    return [{"port": port, "address": address, "service": service, "field": field}
            for port, address, service, field in _wanted_ports(box, gears)]


def _check_ports(box: BoxDecl, gears: dict) -> list:
    """Every port the box listens on is a TCP port, and no two of its services share one."""
    errors, taken, past = [], {}, {}
    for port, _address, service, field in _wanted_ports(box, gears):
        if port not in TCP_PORTS:
            past.setdefault(field, []).append(f"{service} on port {port}")
        elif port in taken:
            errors.append(FleetError(box.host, None, field, f"puts {service} on port {port}, "
                                     f"which {taken[port]} takes; move one of them"))
        else:
            taken[port] = service
    for field, placed in past.items():
        errors.append(FleetError(box.host, None, field, f"puts {' and '.join(placed)}, past "
                                 f"{TCP_PORTS[-1]}; lower it"))
    return errors


def gateway_model_names(box: BoxDecl, gears: dict) -> list:
    """The model names the box's gateway resolves, in the order it builds them at start:
    every generate role's name and catalog checkpoint, the served names of the generate gears
    served here, every catalog alias, then the inventory's aliases in the order rendered."""
    names = []
    for spec in ROLES:
        if spec.task == GENERATE:
            names += [spec.checkpoint, spec.name]
    names += [gear["served_name"] for role, gear in gears.items()
              if role_spec(role).task == GENERATE]
    names += [alias for spec in ROLES for alias in spec.aliases]
    return list(dict.fromkeys(names))


def _check_model_names(box: BoxDecl, gears: dict) -> list:
    """Each alias targets, and the default model is, a name the gateway resolves (it refuses
    to start otherwise)."""
    errors, names = [], gateway_model_names(box, gears)
    for alias, target in box.aliases:
        if target not in names:
            errors.append(FleetError(box.host, None, f"fleet_gateway_aliases.{alias}",
                                     f"targets {target!r}, which names no generate role here",
                                     allowed="a role name, tier alias or served name of this "
                                     "box", suggestion=closest(target, names)))
        names.append(alias)
    if box.default_model and box.default_model not in names:
        errors.append(FleetError(box.host, None, "fleet_default_model",
                                 f"{box.default_model!r} names no generate role here",
                                 allowed="a role name, tier alias or served name of this box",
                                 suggestion=closest(box.default_model, names)))
    return errors


def _proxy_targets(decl: RoleDecl) -> tuple:
    """Peers a box forwards this role to (a peer-only pool forwards to each member)."""
    if decl.feasible:
        return ()
    return (decl.proxy,) if decl.proxy else decl.pool


def _check_proxy_cycles(boxes: dict, skipped: set) -> list:
    errors = []
    roles = sorted({decl.role for box in boxes.values() for decl in box.roles}, key=role_index)
    for role in roles:
        cycle = _find_cycle(boxes, role, skipped)
        if cycle:
            errors.append(FleetError(cycle[0], role, "proxy",
                                     "proxy cycle " + " -> ".join(cycle) + "; one box must "
                                     "serve the role (feasible: true)"))
    return errors


def _find_cycle(boxes: dict, role: str, skipped: set) -> list:
    def edges(host: str) -> tuple:
        box = boxes.get(host)
        decl = box.role(role) if box and (host, role) not in skipped else None
        # A box naming itself is reported by the peer checks, in plainer words.
        return tuple(peer for peer in _proxy_targets(decl) if peer != host) if decl else ()

    done: set = set()
    for start in sorted(boxes):
        stack, path = [(start, iter(edges(start)))], [start]
        while stack:
            host, targets = stack[-1]
            nxt = next(targets, None)
            if nxt is None:
                done.add(host)
                stack.pop()
                path.pop()
            elif nxt in path:
                return [*path[path.index(nxt):], nxt]
            elif nxt not in done and nxt in boxes:
                stack.append((nxt, iter(edges(nxt))))
                path.append(nxt)
    return []


def _check_peers(box: BoxDecl, boxes: dict, local: dict, skipped: set) -> list:
    errors = []
    for decl in box.roles:
        if (box.host, decl.role) in skipped:
            continue
        try:
            _check_role_peers(box, decl, boxes, local, skipped)
        except FleetError as error:
            errors.append(error)
    return errors


def _check_role_peers(box: BoxDecl, decl: RoleDecl, boxes: dict, local: dict,
                      skipped: set) -> None:
    checked = [_check_hosts_role(box, decl, field, peer, boxes, local, skipped)
               for field, peer in _named_peers(decl)]
    if not all(checked):
        return  # a peer with refusals of its own: nothing sound to check this role against
    if decl.owners:
        _check_owner_keys(box, decl, boxes)
    if decl.pool:
        _check_pool_agreement(box, decl, local)
    _check_rates(box, decl)
    if decl.stream_resume is not None and not decl.pool:
        raise FleetError(box.host, decl.role, "stream_resume", "applies to a pool only (a "
                         "stream continues on another replica); declare a pool or remove it")


def _named_peers(decl: RoleDecl) -> list:
    named = [("referral", decl.referral), ("proxy", decl.proxy)]
    named += [("pool", member) for member in decl.pool]
    named += [("owners", owner) for owner in decl.owners]
    return [(field, peer) for field, peer in named if peer]


def _check_owner_keys(box: BoxDecl, decl: RoleDecl, boxes: dict) -> None:
    """Owner forwarding travels under the fleet key: this box and every owner must hold it."""
    if not box.has_mesh_key:
        raise FleetError(box.host, decl.role, "owners", "forwarding to owners needs "
                         "fleet_mesh_key on this box (the key boxes use between themselves)")
    keyless = [owner for owner in decl.owners if not boxes[owner].has_mesh_key]
    if keyless:
        raise FleetError(box.host, decl.role, "owners", f"{', '.join(keyless)} has no "
                         "fleet_mesh_key, so it would refuse forwarded requests; set it there")


def _check_hosts_role(box, decl, field, peer, boxes, local, skipped) -> bool:
    """Whether the peer can be checked (False: it has refusals of its own); raises when it
    is not a peer that hosts the role."""
    if peer == box.host:
        raise FleetError(box.host, decl.role, field, "names this box itself; name a peer")
    if peer not in boxes:
        raise FleetError(box.host, decl.role, field,
                         f"{peer!r} is not a host of this inventory",
                         suggestion=closest(peer, [host for host in boxes if host != box.host]))
    if boxes[peer].damaged or (peer, decl.role) in skipped:
        return False
    if decl.role not in local[peer]:
        raise FleetError(box.host, decl.role, field,
                         f"{peer} does not host {decl.role} (not feasible there); name a box "
                         "that serves it")
    return True


def _fingerprint(gear: dict) -> tuple:
    """What pool members must agree on; the window is each member's own (placement sends a
    request only where it fits)."""
    return gear["served_name"], gear["quantization"]


def _check_pool_agreement(box: BoxDecl, decl: RoleDecl, local: dict) -> None:
    members = [(peer, local[peer][decl.role]) for peer in decl.pool]
    if decl.feasible and decl.role in local[box.host]:
        members.insert(0, (box.host, local[box.host][decl.role]))
    reference_host, reference = members[0]
    for host, gear in members[1:]:
        if _fingerprint(gear) == _fingerprint(reference):
            continue
        ours, theirs = _fingerprint(reference), _fingerprint(gear)
        diffs = [f"{label} {reference_host}={ours[i]!r} vs {host}={theirs[i]!r}"
                 for i, label in enumerate(("served model", "quantization"))
                 if ours[i] != theirs[i]]
        raise FleetError(box.host, decl.role, "pool",
                         "pool members disagree: " + "; ".join(diffs)
                         + "; a pool needs one served id and quantization")


def _check_rates(box: BoxDecl, decl: RoleDecl) -> None:
    if not decl.rates:
        return
    rated = [pair[0] for pair in decl.rates]
    if not decl.pool:
        raise FleetError(box.host, decl.role, "rates", "rates are priors for pool members; "
                         "declare a pool")
    stray = [peer for peer in rated if peer not in decl.pool]
    missing = [peer for peer in decl.pool if peer not in rated]
    if stray or missing:
        raise FleetError(box.host, decl.role, "rates",
                         f"declare a rate for every pool member and no other (missing: "
                         f"{', '.join(missing) or '-'}; not in pool: {', '.join(stray) or '-'})")


# ---------------------------------------------------------------- the plan

def _box_plan(box: BoxDecl, boxes: dict, local: dict) -> dict:
    hardware = box_hardware(box)
    roles = {decl.role: _role_plan(box, decl, boxes, local) for decl in box.roles}
    return {
        "host": box.host,
        "hardware": hardware.as_dict(),
        "runtime": box.runtime,
        "origin": box.origin,
        "proc_root": box.proc_root,
        "gateway": {
            "host": box.gateway_host,
            "port": box.gateway_port,
            "auth": box.has_api_key,
            "fleet_key": box.has_mesh_key,
            "default_model": box.default_model or _default_model(
                roles, gateway_model_names(box, local[box.host])),
            "aliases": dict(box.aliases),
            "force_strict_tools": box.force_strict_tools,
            "private_status": box.private_status,
            "tuning": dict(box.tuning),
            "pool_policy": box.pool_policy,
            "client_keys": [{"name": k.name, "class": k.priority,
                             "inflight_limit": k.inflight_limit} for k in box.client_keys],
        },
        "gears": {
            "image": box.gear_image or hardware.gear_image,
            "port_base": box.gear_port_base,
            "sim_time_scale": box.sim_time_scale,
            "python": box.python,
            "hf_cache": box.hf_cache,
            "audio_image": box.audio_image,
            "gateway_image": box.gateway_image,
            "sim_image": box.sim_image or box.gateway_image,
            "engine_dir": box.engine_dir,
            "model_dir": box.model_dir,
            "images_from": box.images_from,
            "engine_build": _engine_build(local[box.host]),
            "require_pins": box.require_pins,
        },
        "budget": budget(box, local[box.host]),
        "ports": listening(box, local[box.host]),
        "roles": roles,
        "key_hosts": _key_hosts(roles),
    }


def _engine_build(local: dict) -> dict | None:
    """The pinned engine install the box's gears need (vLLM's CPU build), or None."""
    if not any(gear.get("engine") == VLLM_CPU for gear in local.values()):
        return None
    build = VLLM_CPU_BUILD
    return {"name": build.name, "version": build.version, "key": build.key,
            "requirements": list(build.requirements), "remove": list(build.remove),
            "pip": build.pip}


def _default_model(roles: dict, names: list) -> str | None:
    """The primary's served id when the box reaches cortex at all, else the first generate
    role's; its role name where the gateway would not know the served id (a peer's own)."""
    generate = [plan for plan in roles.values()
                if plan["task"] == "generate" and plan["served_name"]
                and plan["mode"] not in (REFER, OFF)]
    chosen = next((plan for plan in generate if plan["role"] == "cortex"),
                  generate[0] if generate else None)
    if chosen is None:
        return None
    return chosen["served_name"] if chosen["served_name"] in names else chosen["role"]


def _role_plan(box: BoxDecl, decl: RoleDecl, boxes: dict, local: dict) -> dict:
    spec = role_spec(decl.role)
    plan = {
        "role": decl.role,
        "prefix": spec.prefix,
        "task": spec.task,
        "feasible": decl.feasible,
        "mode": _mode(decl),
        "aliases": list(spec.aliases),
        "gear": None,
        "served_name": None,
        "context": None,
        "peers": [_peer_plan(decl, peer, boxes) for peer in _plan_peers(decl)],
        "hosted_by": None,
        "replicas": 0,
        "stream_resume": bool(decl.pool) and decl.stream_resume is not False,
    }
    if decl.feasible:
        gear = dict(local[box.host][decl.role])
        gear["port"] = box.gear_port_base + role_index(decl.role)
        gear["service"] = f"vllm-{decl.role}" if not spec.is_audio else "audio"
        gear["rate"] = _declared_rate(box.host, decl.role, boxes)
        plan["gear"] = gear
        plan["served_name"] = gear.get("served_name")
        plan["context"] = gear.get("context")
    elif plan["peers"]:
        upstream = local[plan["peers"][0]["host"]][decl.role]
        plan["served_name"] = upstream.get("served_name")
        # A peer-only pool takes the longest request one of its members can (windows may differ).
        windows = [local[peer["host"]][decl.role].get("context") for peer in plan["peers"]]
        plan["context"] = max((w for w in windows if w), default=None)
        plan["hosted_by"] = plan["peers"][0]["origin"]
    if decl.pool:
        plan["replicas"] = len(decl.pool) + (1 if decl.feasible else 0)
    return plan


def _declared_rate(host: str, role: str, boxes: dict) -> float | None:
    """The single-stream tok/s other boxes declare for this host's gear of `role` (their
    pools' `rates`): the lowest when they differ, so a deadline is never judged on the most
    optimistic one; None when no box declares one."""
    rates = [rate for other in boxes.values() for decl in other.roles if decl.role == role
             for peer, rate in decl.rates if peer == host]
    return min(rates, default=None)


def _mode(decl: RoleDecl) -> str:
    """The role's route mode: pool (hosted or peer-only), serve, or what its peers declare."""
    if decl.pool:
        return POOL
    if decl.feasible:
        return SERVE
    return decl.peer_mode or OFF


def _plan_peers(decl: RoleDecl) -> tuple:
    if decl.pool or decl.owners:
        return decl.pool or decl.owners
    return tuple(peer for peer in (decl.referral, decl.proxy) if peer)


def _peer_plan(decl: RoleDecl, peer: str, boxes: dict) -> dict:
    rates = dict(decl.rates)
    return {
        "host": peer,
        "origin": boxes[peer].origin,
        "auth": boxes[peer].has_api_key,
        "rate": rates.get(peer),
    }


def _key_hosts(roles: dict) -> list:
    """Peers whose inbound key this box must carry (proxied or pooled roles only)."""
    hosts = []
    for plan in roles.values():
        if plan["mode"] not in (PROXY, POOL):
            continue
        for peer in plan["peers"]:
            if peer["auth"] and peer["host"] not in hosts:
                hosts.append(peer["host"])
    return sorted(hosts)
