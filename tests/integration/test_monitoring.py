"""The monitoring role against a copy of inventories/local with the monitoring box = localhost:
a real Prometheus (Debian's) scraping the running local mesh, the shipped dashboard's queries
answered from it after traffic, and down.yml stopping it.

The box's inbound gate is on (the scrape needs no key) and one client key may have one request
in flight, so holding a stream open both shows in the in-flight series and sheds a second
request: every dashboard panel then has something to show. Ports and state are the test's own.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support.client import chat
from tests.support.ports import free_block
from tests.support.tools import not_installed
from tests.support.wait import wait_until

from .conftest import ROOT, supervisor
from .test_playbooks import LocalMesh, _alive, _ok

DASHBOARD = ROOT / "roles" / "monitoring" / "files" / "lobes-fleet-dashboard.json"
KEY = "monitoring-test-inbound-key"
# The dashboard's variables as Grafana fills them: every box, a rate window of 15 scrapes.
VARIABLES = {"$__rate_interval": "15s", "$box": ".*"}

pytestmark = pytest.mark.skipif(not (shutil.which("promtool") and shutil.which("prometheus")),
                                reason=not_installed("Prometheus", "prometheus"))


class Monitored(LocalMesh):
    """The local mesh with Prometheus on localhost, scraping every second."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.prometheus = f"http://127.0.0.1:{free_block(1)}"
        self.edit(fleet_monitoring_host="localhost",
                  fleet_monitoring_listen_address=self.prometheus.removeprefix("http://"),
                  fleet_monitoring_scrape_interval="1s",
                  fleet_gateway_api_key=KEY,
                  fleet_gateway_tuning={"GATEWAY_MAX_INFLIGHT_PER_KEY": 1})

    def api(self, path: str, **params: str) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.prometheus}/api/v1/{path}{query}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def prometheus_pid(self) -> int:
        rows = supervisor(self.deploy_dir / "monitoring" / "state", "status")["status"]
        return next(row["child_pid"] for row in rows if row["name"] == "prometheus")


@pytest.fixture
def monitored(tmp_path: Path):
    deployed = Monitored(tmp_path)
    yield deployed
    deployed.playbook("down.yml")


def _healthy(monitored: Monitored) -> set:
    """(job, scrape URL) of the targets of box localhost whose last scrape succeeded."""
    targets = monitored.api("targets")["activeTargets"]
    return {(t["labels"]["job"], t["scrapeUrl"]) for t in targets
            if t["health"] == "up" and t["labels"]["box"] == "localhost"}


def _scalar(monitored: Monitored, expr: str) -> float:
    """The one value of an instant query, 0 while it has none."""
    result = monitored.api("query", query=expr)["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def _expand(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def _values(monitored: Monitored, expr: str, start: float) -> list[float]:
    """The finite values of a dashboard query over the test's traffic, one point a second."""
    data = monitored.api("query_range", query=_expand(expr), start=f"{start:.3f}",
                         end=f"{time.time():.3f}", step="1")
    values = (float(value) for series in data["result"] for _moment, value in series["values"])
    return [value for value in values if math.isfinite(value)]


def _traffic(monitored: Monitored, url: str) -> None:
    """Chats and a stream; then a long stream held open until Prometheus has scraped it in
    flight, while a second request on the same key is shed (429: one in flight per key)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    for model in ("main", "main", "multimodal"):
        assert chat(url, {"model": model}, auth, timeout=60).status == 200
    assert chat(url, {"model": "main", "stream": True}, auth, timeout=60).status == 200
    held = http.client.HTTPConnection(urllib.parse.urlsplit(url).hostname,
                                      urllib.parse.urlsplit(url).port, timeout=60)
    body = {"model": "main", "stream": True, "ignore_eos": True, "max_tokens": 4000,
            "messages": [{"role": "user", "content": "count"}]}
    held.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json", **auth})
    stream = held.getresponse()
    assert stream.status == 200
    assert stream.readline()
    # Shed twice, a scrape apart: rate() counts an increase only from a sample before it.
    shed_total = 'sum(lobes_gateway_shed_requests_total{reason="key_in_flight_limit"})'
    for count in (1, 2):
        shed = chat(url, {"model": "main"}, auth, timeout=60)
        assert shed.status == 429 and shed.error["code"] == "rate_limit_exceeded"
        wait_until(lambda count=count: _scalar(monitored, shed_total) >= count,
                   message=f"{count} shed requests scraped", timeout=30, interval=0.5)
    in_flight = 'lobes_gateway_in_flight_requests{role="cortex"}'
    wait_until(lambda: monitored.api("query", query=in_flight)["result"],
               message="the held stream scraped in flight", timeout=30, interval=0.5)
    stream.read()
    held.close()


@pytest.mark.slow
def test_monitoring_converges_scrapes_the_mesh_answers_the_dashboard(monitored: Monitored) -> None:
    # 0. --check on a clean machine: the plan is checked, nothing is written or started.
    assert _ok(monitored.playbook("site.yml", "--check", "--diff"))["changed"] > 0
    assert not monitored.deploy_dir.exists()

    # 1. site.yml deploys the mesh, then Prometheus; a second run changes and restarts nothing.
    assert _ok(monitored.playbook("site.yml"))["changed"] > 0
    pid = monitored.prometheus_pid()
    assert _ok(monitored.playbook("site.yml"))["changed"] == 0
    assert monitored.prometheus_pid() == pid and _alive(pid)

    # 2. It scrapes the gateway and, through it, every gear of the box (cortex, senses,
    # embedder, reranker); each target answers.
    gateway = f"http://127.0.0.1:{monitored.port}"
    expected = {("lobes-gear", f"{gateway}/metrics/gears/{role}")
                for role in ("cortex", "senses", "embedder", "reranker")}
    expected.add(("lobes-gateway", f"{gateway}/metrics"))
    wait_until(lambda: _healthy(monitored) == expected, message="every target up", timeout=30,
               interval=0.5)
    version = monitored.get("/health")["version"]
    build = monitored.api("query", query="lobes_gateway_build_info")["result"]
    assert [series["metric"]["version"] for series in build] == [version]

    # 3. The shipped rules are loaded and evaluate without error.
    groups = monitored.api("rules")["groups"]
    assert [(g["name"], rule["health"]) for g in groups for rule in g["rules"]] == \
        [("lobes-fleet", "ok")] * 7

    # 4. After traffic, every dashboard query has data, and the shedding alert is pending.
    start = time.time()
    _traffic(monitored, gateway)
    queries = _dashboard_queries()
    wait_until(lambda: [q for q in queries if not _values(monitored, q, start)] == [],
               message="data for every dashboard query", timeout=30, interval=1)
    assert max(_values(monitored, queries[0], start)) > 0  # throughput: tokens were counted
    alerts = wait_until(lambda: monitored.api("alerts")["alerts"], message="an alert",
                        timeout=30, interval=0.5)
    assert [(a["labels"]["alertname"], a["labels"]["reason"], a["state"]) for a in alerts] == \
        [("LobesSustainedShedding", "key_in_flight_limit", "pending")]

    # 5. down.yml stops Prometheus with the mesh; its data stays.
    assert _ok(monitored.playbook("down.yml"))["changed"] > 0
    assert not _alive(pid)
    with pytest.raises(OSError):
        monitored.api("targets")
    assert any(re.fullmatch(r"[0-9A-Z]{26}|wal", p.name)
               for p in (monitored.deploy_dir / "monitoring" / "data").iterdir())
