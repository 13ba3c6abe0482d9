"""A gear whose hub checkpoint is pinned starts from the box's own copy, offline: the lock's
revision reaches the plan (mesh_plan) and the rendered gear (compose and the CPU engine)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from ansible_collections.lobes.fleet.plugins.module_utils.contract import role_spec
from ansible_collections.lobes.fleet.plugins.module_utils.models import (
    FleetLock,
    dump_lock,
    with_model,
)
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.module_utils.render import cpu_engine_argv

from tests.unit.rendering import INVENTORIES, PLAYBOOK, ROOT

# A revision written by this test into its own copy of the inventory: test data, never an
# example inventory's (no revision there is made up).
REVISION = "0123456789abcdef0123456789abcdef01234567"
CORTEX = role_spec("cortex").checkpoint
SENSES = role_spec("senses").checkpoint


def render(tmp_path: Path) -> Path:
    """tailnet's inventory with cortex's checkpoint locked, planned and rendered."""
    source, vault = INVENTORIES["tailnet"]
    inventory = tmp_path / "inventory"
    shutil.copytree(source, inventory)
    lock = with_model(FleetLock(), CORTEX, REVISION, {"config.json": {
        "size": 2, "sha256": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"}})
    (inventory / "fleet.lock.yml").write_text(dump_lock(lock))
    out = tmp_path / "out"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
         str(PLAYBOOK), "-e", f"render_root={out}", "-e",
         f"ansible_python_interpreter={sys.executable}", "--vault-password-file", str(vault)],
        cwd=ROOT, env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
                       "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".collections"),
                       "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    return out


def test_a_locked_checkpoint_is_served_from_the_box_s_copy_offline(tmp_path):
    spark = yaml.safe_load((render(tmp_path) / "spark" / "compose.yaml").read_text())
    services = spark["services"]
    cortex = next(s for s in services.values() if s["command"][0].startswith("/models/"))
    assert cortex["command"][0] == f"/models/{CORTEX}/{REVISION}"
    assert any(volume.endswith(":/models:ro") for volume in cortex["volumes"])
    assert cortex["environment"]["HF_HUB_OFFLINE"] == "1"
    # senses is not locked: vLLM fetches it by name into the Hugging Face cache, as before.
    senses = next(s for s in services.values() if s["command"][0] == SENSES)
    assert "HF_HUB_OFFLINE" not in senses["environment"]
    assert not any(volume.endswith(":/models:ro") for volume in senses["volumes"])


def test_the_cpu_engine_loads_a_pinned_hub_checkpoint_from_the_model_dir():
    host_vars = yaml.safe_load((INVENTORIES["cpu-engine"][0] / "host_vars" / "gamma.yml")
                               .read_text())
    host_vars["fleet_roles"]["cortex"]["checkpoint"] = "acme/tiny-chat"
    box = plan_mesh({"gamma": host_vars})["boxes"]["gamma"]
    cortex = box["roles"]["cortex"]
    unpinned = cpu_engine_argv(box, cortex)
    cortex["gear"]["pinned_revision"] = REVISION
    pinned = cpu_engine_argv(box, cortex)
    model_dir = host_vars["fleet_model_dir"]
    assert unpinned[unpinned.index("--model") + 1] == f"{model_dir}/acme/tiny-chat"
    assert pinned[pinned.index("--model") + 1] == f"{model_dir}/acme/tiny-chat/{REVISION}"
