"""The picture of the mesh: one node per box, one edge per declared peer, coloured by what the
boxes' /capabilities say now."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.mesh_picture import mesh_dot
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.modules.mesh_status import box_line

from tests.support.tools import not_installed
from tests.unit.mesh import SPARK, THOR, seed_mesh


def edges(dot: str) -> dict:
    """(from, to, label) -> (style, colour) of every edge."""
    found = {}
    for match in re.finditer(r'"([^"]+)" -> "([^"]+)" \[label="([^"]+)", style=(\w+), '
                             r'color=([\w]+)', dot):
        source, target, label, style, colour = match.groups()
        found[source, target, label.split(" (")[0]] = (style, colour, label)
    return found


@pytest.fixture
def plan():
    return plan_mesh(seed_mesh())


def live_mesh(thor_ready: bool = True, thor_compatible: bool = True) -> dict:
    replicas = [{"origin": SPARK, "ready": True, "compatible": True},
                {"origin": THOR, "ready": thor_ready, "compatible": thor_compatible}]
    ready = {"roles": {"cortex": {"ready": True}, "senses": {"ready": True}}}
    return {"orin": {"roles": {"cortex": {"ready": True, "replicas": replicas}}},
            "spark": ready, "thor": {"roles": {"cortex": {"ready": thor_ready}}}}


def test_every_declared_peer_is_an_edge_in_the_style_of_its_mode(plan):
    found = edges(mesh_dot(plan, live_mesh()))
    assert found["orin", "spark", "cortex: pools"][:2] == ("bold", "forestgreen")
    assert found["orin", "thor", "cortex: pools"][:2] == ("bold", "forestgreen")
    assert found["orin", "spark", "senses: proxies"][:2] == ("solid", "forestgreen")
    assert found["thor", "spark", "senses: refers"][:2] == ("dashed", "forestgreen")
    assert len(found) == 4


def test_a_replica_out_of_the_pool_is_coloured_by_why(plan):
    incompatible = edges(mesh_dot(plan, live_mesh(thor_compatible=False)))
    assert incompatible["orin", "thor", "cortex: pools"][1:] == (
        "darkorange", "cortex: pools (not compatible)")
    down = edges(mesh_dot(plan, live_mesh(thor_ready=False)))
    assert down["orin", "thor", "cortex: pools"][1:] == ("red3", "cortex: pools (unreachable)")


def test_a_box_that_does_not_answer_is_drawn_unreachable(plan):
    live = {**live_mesh(), "spark": None}
    dot = mesh_dot(plan, live)
    assert '"spark" [label="spark (gb10)\\nserves: cortex, embedder, reranker, senses\\n' \
           'unreachable", color=red3];' in dot
    assert edges(dot)["orin", "spark", "senses: proxies"][1] == "red3"


@pytest.mark.parametrize("how", ["null", "absent"])
def test_a_box_whose_plan_names_no_hardware_is_drawn_as_unknown_hardware(plan, how):
    if how == "null":
        plan["boxes"]["spark"]["hardware"] = None
    else:
        del plan["boxes"]["spark"]["hardware"]
    assert '"spark" [label="spark (unknown hardware)\\nserves: ' in mesh_dot(plan, live_mesh())


@pytest.mark.skipif(shutil.which("dot") is None, reason=not_installed("Graphviz", "graphviz"))
def test_graphviz_draws_it(plan, tmp_path):
    (tmp_path / "mesh.dot").write_text(mesh_dot(plan, live_mesh()))
    drawn = subprocess.run(["dot", "-Tsvg", str(tmp_path / "mesh.dot")], capture_output=True,
                           text=True, timeout=60, check=False)
    assert drawn.returncode == 0, drawn.stderr
    assert "<svg" in drawn.stdout and "cortex: pools (ready)" in drawn.stdout


def test_the_box_line_names_pressure_readings_and_tokens():
    status = {"pressure": {"mode": "busy", "reason": "memory",
                           "pressure": {"swap_used_percent": 0.0, "iowait_percent": 1.5,
                                        "mem_available_percent": 3.2,
                                        "psi_memory_full_avg10": None}},
              "backends": [{"name": "cortex", "metrics": {"prompt_tokens_total": 1200.0,
                                                          "generation_tokens_total": 340.0}},
                           {"name": "senses", "metrics": None}]}
    assert box_line("spark", status) == (
        "spark: pressure busy (memory) (swap 0.0 %, iowait 1.5 %, MemAvailable 3.2 %, PSI -); "
        "tokens: cortex 1200 prompt / 340 generated")
    assert box_line("thor", None) == "thor: unreachable"
