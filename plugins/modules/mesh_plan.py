#!/usr/bin/python
"""lobes.fleet.mesh_plan: validate the whole mesh and return every box's plan."""

from __future__ import annotations

DOCUMENTATION = r"""
module: mesh_plan
short_description: Validate a fleet inventory and resolve each box's plan
version_added: 0.1.0
description:
  - Reads the C(fleet_*) variables of every host and checks them against the inventory schema
    (C(plugins/module_utils/schema.py), docs/inventory.md), then that the mesh can work. It
    fails with every refusal of every host at once, each naming host, role and field, the
    value (masked when secret), what is allowed and, for a misspelt name, the closest valid
    one. A variable whose template does not resolve, or a vault value without its password,
    is refused like any other value, naming its host and variable.
  - Rejects a referral, proxy or pool member that does not host the role, a proxy cycle, pool
    members that disagree on served model, window or quantization, a memory budget over the
    box's usable memory, MTP on an arch without the kernel, and a context above the
    checkpoint's native window unless a covering C(yarn_factor) is declared.
  - Returns each box's resolved plan (documented under RV(plan)); the plan holds no secrets.
  - It is an action that runs on the controller; run it once (C(run_once)).
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.pure
options:
  hosts:
    description:
      - Inventory hostnames of the mesh's boxes.
      - Defaults to every host of the inventory, regardless of C(--limit) or C(serial), since a
        box's peers are part of its plan even when this run does not deploy them.
      - From each, the C(fleet_*) variables, C(ansible_host), C(group_names) and any variable
        named like a misspelt fleet variable are read. Keys (C(fleet_gateway_api_key),
        C(fleet_mesh_key), each C(fleet_client_keys) entry's C(key)) are checked for the
        characters a key may hold and never shown; the plan records only whether each is set,
        so no key value enters the plan, the arguments or the logs.
      - The full reference of the variables is docs/inventory.md.
    type: list
    elements: str
  lock_file:
    description:
      - The fleet's lock file (docs/operations.md, "How models reach the boxes"), read to pin
        each gear's checkpoint revision. Defaults to C(fleet.lock.yml) in the inventory's
        directory (C(inventory_dir)); no file there means nothing is locked yet.
      - A gear whose hub checkpoint has no revision (role C(revision), the catalog's, or the
        lock's) is a warning, or an error on a box with C(fleet_models_require_pins). A declared
        revision the lock contradicts, one checkpoint pinned at two revisions and a lock file
        that cannot be read are errors. Either way the plan fails before anything is deployed.
      - Its C(images) section pins each gear image named by tag to a digest (docs/operations.md,
        "How engine images are pinned"). An entry that contradicts another, or a hardware group
        whose boxes would run two images, is an error.
    type: path
notes:
  - The budget rule. The sum of a box's C(--gpu-memory-utilization) fractions
    times the device memory, plus the hardware headroom, must fit the usable memory.
"""

EXAMPLES = r"""
- name: Plan the mesh once, from every fleet host of the inventory
  lobes.fleet.mesh_plan:
  run_once: true
  register: mesh

- name: Plan a subset of the inventory
  lobes.fleet.mesh_plan:
    hosts: "{{ groups['fleet'] }}"
  run_once: true
  register: mesh

- name: Show what the orin serves, proxies and pools
  ansible.builtin.debug:
    var: mesh.plan.boxes.orin.roles
"""

RETURN = r"""
plan:
  description:
    - The mesh plan. C(boxes) maps each inventory hostname to its box plan.
    - "A box plan has: C(host); C(hardware) (name, arch, memory_gib, usable_gib, headroom_gib,
      mtp_kernel, gear_image, has_gpu, simulates: the hardware simulated gears are budgeted
      for, or null); C(runtime) (compose or process); C(origin);
      C(proc_root) (a fake /proc the box's simulated gears hold memory in, or null);
      C(gateway) (host, port, auth, fleet_key, default_model, aliases, force_strict_tools,
      private_status, tuning, client_keys (name, class, inflight_limit; never the key));
      C(gears) (image, port_base, sim_time_scale, python, hf_cache, audio_image,
      gateway_image, sim_image, engine_dir, model_dir, engine_build, require_pins);
      C(budget) (gears, utilization, reserved_gib, headroom_gib, usable_gib, max_utilization,
      fits); C(ports) (port, address, service, field: what the box listens on, for preflight);
      C(roles); C(key_hosts) (peers whose inbound key this box carries)."
    - "Each C(roles) entry has: role, prefix, task, feasible, mode (serve, pool, proxy,
      refer, owners or off), aliases, served_name, context, peers (host, origin, auth, rate),
      hosted_by, replicas, and C(gear) when served here (checkpoint, revision (declared or
      the catalog's; null when unpinned there), served_name, context,
      native_context, yarn_factor, gpu_memory_utilization, max_active, mtp,
      num_speculative_tokens, tool_parser, quantization, sim_profile, engine (vllm or sim),
      memory_gib (its share of the box's memory), port, service)."
  returned: success
  type: dict
  sample:
    version: 1
    hosts: [orin, spark, thor]
    boxes:
      orin:
        host: orin
        runtime: compose
        origin: http://orin.tail0be7e0.ts.net:8000
        key_hosts: [spark]
        roles:
          cortex:
            mode: pool
            feasible: false
            served_name: sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP
            context: 262144
            hosted_by: http://spark.tail0be7e0.ts.net:8001
            replicas: 2
pins:
  description:
    - Every gear that loads a hub checkpoint (simulated gears and C(lobes/) or path checkpoints
      load none from the hub), with its revision and where it comes from.
    - "Each has: host, role, checkpoint, revision (null when unpinned), source (declared,
      locked or unpinned), locked (the lock's revision, or null), required (the box sets
      C(fleet_models_require_pins))."
  returned: success
  type: list
  elements: dict
images:
  description:
    - Every gear container of a compose box (the process runtime runs no image), with the image
      it runs. Its plan's C(gears) image and the gear's C(image) name what it runs; the gear's
      C(image_state) says how.
    - "Each has: host, group (the hardware group), role, service, slot (C(image),
      C(audio_image) or C(sim_image)), ref (as declared), run (what compose runs) and state
      (C(digest): named by digest; C(locked): a tag the lock file pins, run as
      repository@digest; C(resolve): a tag to pull and lock on the next deploy), and copy:
      on a box with C(fleet_images_from=boxes), the pinned repository@digest it copies from
      another box (its gears then run the copy's local tag, C(repository:lobes-sha256-<hex>)),
      else empty."
  returned: success
  type: list
  elements: dict
lock_file:
  description: The lock file read (null when the inventory has no directory).
  returned: success
  type: str
"""

# The work happens on the controller, in plugins/action/mesh_plan.py.
