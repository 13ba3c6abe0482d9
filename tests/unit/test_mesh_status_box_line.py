"""status.yml's line per box: pressure, and each gear's tokens and engine version."""

from __future__ import annotations

from ansible_collections.lobes.fleet.plugins.modules.mesh_status import box_line


def status(**backend) -> dict:
    return {"pressure": {"mode": "normal", "pressure": {}},
            "backends": [{"name": "cortex", "metrics": {"prompt_tokens_total": 12.0,
                                                        "generation_tokens_total": 3.0},
                          **backend}]}


def test_a_gear_line_names_the_engine_version_it_reports():
    line = box_line("spark", status(engine_version="0.32.0"))
    assert line.endswith("tokens: cortex 12 prompt / 3 generated (engine 0.32.0)")


def test_a_gear_that_reports_no_version_is_shown_without_one():
    line = box_line("spark", status(engine_version=None))
    assert line.endswith("tokens: cortex 12 prompt / 3 generated")
