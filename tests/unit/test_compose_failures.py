"""lobes.fleet.compose_failures' reading of `docker compose ps`: which services are not up.

The rows are Compose 2.26.1's (scripts/engine.sh's pin), recorded from a real project whose
middle service crash-loops: a healthy service, the crashing one, one waiting on it. The module
against a real engine runs in the default molecule scenario (a gear that cannot start).
"""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.lobes.fleet.plugins.modules import compose_failures

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "compose"
RECORDED = FIXTURES / "ps-crash-loop.jsonl"
# The same kind of project caught in the moment after a restart: running, Health still empty.
RESTARTED = FIXTURES / "ps-restarted-in-crash-loop.jsonl"


def test_a_crash_loop_is_not_up_and_the_service_waiting_on_it_was_not_started():
    down, not_started = compose_failures.not_up(compose_failures.ps_rows(RECORDED.read_text()))

    assert [(row["Service"], row["State"]) for row in down] == [("crash", "restarting")]
    assert not_started == ["after"]


def test_a_crash_loop_caught_just_after_a_restart_is_still_not_up():
    rows = compose_failures.ps_rows(RESTARTED.read_text())

    down, not_started = compose_failures.not_up(rows)

    assert [(row["Service"], compose_failures.health(row)) for row in down] == [
        ("bad", "starting")]
    assert not_started == ["after"]


def test_health_is_read_from_the_status_only_when_the_field_is_empty():
    def row(health, status):
        return {"Service": "gear", "State": "running", "Health": health, "Status": status}

    assert compose_failures.health(row("", "Up 2 seconds (unhealthy)")) == "unhealthy"
    assert compose_failures.health(row("", "Up 2 minutes")) == ""
    assert compose_failures.health(row("healthy", "Up 2 minutes (healthy)")) == "healthy"


def test_the_array_form_of_older_compose_reads_the_same():
    rows = compose_failures.ps_rows(RECORDED.read_text())

    assert compose_failures.ps_rows(json.dumps(rows)) == rows


def test_unhealthy_and_still_starting_services_are_not_up():
    rows = [{"Service": "vllm-senses", "State": "running", "Health": "unhealthy"},
            {"Service": "vllm-cortex", "State": "running", "Health": "starting"},
            {"Service": "gateway", "State": "running", "Health": "healthy"},
            {"Service": "audio", "State": "running", "Health": ""}]

    down, not_started = compose_failures.not_up(rows)

    assert [row["Service"] for row in down] == ["vllm-cortex", "vllm-senses"]
    assert not_started == []


def test_the_summary_names_each_service_its_state_and_its_logs_end():
    failures = [{"service": "vllm-senses", "state": "restarting",
                 "status": "Restarting (2) 1 second ago", "health": "starting",
                 "log": "/srv/lobes/state/log/vllm-senses.log",
                 "tail": "error: argument --profile: invalid choice: 'no-such-profile'"},
                {"service": "gateway", "state": "exited", "status": "Exited (2)", "health": "",
                 "log": "/srv/lobes/state/log/gateway.log", "tail": ""}]

    summary = compose_failures.summarise(failures, ["vllm-embedder"])

    assert summary.splitlines() == [
        "vllm-senses: restarting (Restarting (2) 1 second ago), health starting; its log "
        "/srv/lobes/state/log/vllm-senses.log ends:",
        "error: argument --profile: invalid choice: 'no-such-profile'",
        "gateway: exited (Exited (2)); its log /srv/lobes/state/log/gateway.log is empty or "
        "missing",
        "not started (waiting on the above): vllm-embedder"]
    assert compose_failures.summarise([], []) == "every container of the project is up"
