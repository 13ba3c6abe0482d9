"""The deployed mesh as the seed replays see it, and what they do to it.

The scenario's verify playbook writes LOBES_MESH_FILE: the mesh plan (lobes.fleet.mesh_plan over
the scenario's inventory) and, per box, its container, network, address, inbound key, deploy
directory and Python. Traffic goes only to these containers' addresses.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.client import Reply, call, chat
from tests.support.wait import http_ok, wait_until

# The gateway's peer prober (docs/gateway.md: GATEWAY_PROBE_INTERVAL_S, GATEWAY_PROBE_TIMEOUT_S
# defaults; the tailnet inventory tunes neither): a peer that goes away is seen by the first
# probe pass after it, which gives up on it after the probe timeout.
PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 3.0
ONE_PROBE_INTERVAL_S = PROBE_INTERVAL_S + PROBE_TIMEOUT_S
# A restarted gateway probes its backends once before it listens.
GATEWAY_START_S = 30.0

# Reads a gear's request recorder inside its box: the admin port is the one the simulator
# printed last in its log ("... admin PORT"), listening on the box's loopback.
_RECORDER_SCRIPT = """
import re, sys, urllib.request
port = re.findall(r" admin (\\d+)", open(sys.argv[1]).read())[-1]
print(urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/requests").read().decode())
"""


@dataclass(frozen=True)
class Box:
    """One deployed box: its plan, its gateway's origin and key, its container."""

    name: str
    plan: dict[str, Any]
    container: str
    network: str
    address: str
    api_key: str | None
    deploy_dir: str
    python: str

    @property
    def origin(self) -> str:
        return self.plan["origin"]

    @property
    def auth(self) -> dict[str, str]:
        """The header a caller of this box presents (none when the box runs no gate)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def capabilities(self) -> dict[str, Any]:
        reply = call(self.origin, "GET", "/capabilities", timeout=5.0)
        assert reply.status == 200, reply
        return reply.json()

    def advertised(self, role: str) -> dict[str, Any]:
        return self.capabilities()["roles"][role]

    def docker_exec(self, *argv: str) -> str:
        return docker("exec", self.container, *argv)

    def supervisor(self, command: str, service: str) -> None:
        """lobes_supervisor on the box, as lobes.fleet.supervise runs it."""
        self.docker_exec(
            "env", f"PYTHONPATH={self.deploy_dir}/gateway", self.python, "-m",
            "lobes_supervisor", "--state-dir", f"{self.deploy_dir}/state",
            "--services", f"{self.deploy_dir}/services.json", command, service,
        )

    def gear_requests(self, role: str) -> list[dict[str, Any]]:
        """What this box's gear for `role` received, oldest first (the simulator's recorder)."""
        log = f"{self.deploy_dir}/state/log/gear-{role}.log"
        return json.loads(self.docker_exec(self.python, "-c", _RECORDER_SCRIPT, log))["requests"]


@dataclass(frozen=True)
class Mesh:
    boxes: dict[str, Box]
    fleet_key: str
    monitoring_host: str | None

    def __getitem__(self, name: str) -> Box:
        return self.boxes[name]

    def by_origin(self, origin: str) -> Box:
        return next(box for box in self.boxes.values() if box.origin == origin)


def load_mesh(path: Path) -> Mesh:
    described = json.loads(path.read_text())
    boxes = {
        name: Box(name=name, plan=described["plan"]["boxes"][name], **fields)
        for name, fields in described["boxes"].items()
    }
    return Mesh(boxes=boxes, fleet_key=described["fleet_key"],
                monitoring_host=described["monitoring_host"])


def mesh_file() -> Path:
    return Path(os.environ["LOBES_MESH_FILE"])


def docker(*argv: str) -> str:
    done = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, f"docker {' '.join(argv)}: {done.stderr.strip()}"
    return done.stdout


def burst(origin: str, count: int, payload: dict[str, Any],
          headers: dict[str, str]) -> tuple[list[Reply], float]:
    """`count` concurrent chat completions; the replies and the burst's wall-clock seconds."""
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=count) as pool:
        replies = list(pool.map(lambda _: chat(origin, payload, headers), range(count)))
    return replies, time.monotonic() - started


def sustained_load(origin: str, payload: dict[str, Any], headers: dict[str, str],
                   concurrency: int, waves: int) -> list[Reply]:
    """Bursts of `concurrency` requests, one after the other, until every wave is sent or two
    boxes have answered; all the replies."""
    replies: list[Reply] = []
    for _wave in range(waves):
        replies += burst(origin, concurrency, payload, headers)[0]
        if len(served_by(replies)) > 1:
            break
    return replies


def served_by(replies: list[Reply]) -> Counter[str]:
    """How many answers each peer gave (X-Lobes-Proxied-By)."""
    return Counter(reply.headers.get("x-lobes-proxied-by", "") for reply in replies)


@contextmanager
def gateway_stopped(box: Box):
    """The box's gateway stopped by its supervisor; started again on the way out, and answering
    (its peers may still hold their last probe of it, taken before it stopped)."""
    box.supervisor("down", "gateway")
    try:
        yield
    finally:
        box.supervisor("up", "gateway")
        wait_until(lambda: http_ok(f"{box.origin}/capabilities"),
                   message=f"{box.name}'s gateway answering again", timeout=GATEWAY_START_S)


# A hostile box in a gateway's place, on its port: it advertises what it read of the real
# gateway's /capabilities, /v1/models and /status, each broken one way (a load of Infinity, a
# slot count of 10**100, another model listed), and answers every chat for another model.
_HOSTILE_SCRIPT = """
import http.server, json, sys
port, answers = int(sys.argv[1]), json.loads(sys.argv[2])
CHAT = json.dumps({"id": "x", "object": "chat.completion", "model": "another/model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "not yours"},
    "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 2,
    "total_tokens": 3}}).encode()
class Hostile(http.server.BaseHTTPRequestHandler):
    def _answer(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self._answer(answers.get(self.path.split("?")[0], "{}").encode())
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(CHAT)
    def log_message(self, *_args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", port), Hostile).serve_forever()
"""


def hostile_answers(box: Box) -> dict[str, str]:
    """What the hostile stand-in advertises: the box's own adverts, broken."""
    capabilities = box.capabilities()
    for entry in capabilities["roles"].values():
        entry["max_active"] = 10 ** 100
    models = call(box.origin, "GET", "/v1/models", headers=box.auth, timeout=5.0).json()
    for model in models["data"]:
        model["id"] = "another/model"
    status = call(box.origin, "GET", "/status", timeout=5.0).body.decode()
    return {"/capabilities": json.dumps(capabilities), "/v1/models": json.dumps(models),
            "/status": status.replace('"running": 0', '"running": Infinity')}


@contextmanager
def hostile(box: Box):
    """The box's gateway replaced, on its port, by a hostile stand-in (above); the gateway
    started again on the way out."""
    answers = hostile_answers(box)
    port = box.origin.rsplit(":", 1)[1]
    with gateway_stopped(box):
        box.docker_exec("sh", "-c", f"{box.python} -c {_quoted(_HOSTILE_SCRIPT)} {port} "
                        f"{_quoted(json.dumps(answers))} >/dev/null 2>&1 & echo $! "
                        f"> /tmp/lobes-hostile.pid")
        try:
            wait_until(lambda: http_ok(f"{box.origin}/capabilities"),
                       message=f"the hostile stand-in answering on {box.name}'s port")
            yield
        finally:
            box.docker_exec("sh", "-c", "kill $(cat /tmp/lobes-hostile.pid)")


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@contextmanager
def partitioned(box: Box):
    """The box cut off its network (a real partition); reconnected at its address after."""
    docker("network", "disconnect", box.network, box.container)
    try:
        yield
    finally:
        docker("network", "connect", "--ip", box.address, box.network, box.container)
