"""Admission benchmark: priority classes and fair share at the gateway vs FIFO in vLLM's queue.

One spark-cortex gear (2 slots, no preemption) behind a real gateway with named keys, twice:
FIFO today (no PRIMARY_MAX_ACTIVE: every request goes straight to the gear and waits in its own
queue) and admission (PRIMARY_MAX_ACTIVE=2: the gateway holds requests while both slots run).

  priority  a batch key floods 40 requests of 512 tokens at once; an interactive key sends one
            16-token request every 2 s (seed time) while the flood runs. Reference: one batch
            request's duration with both slots busy plus the interactive request's own idle
            latency; without preemption an interactive request waits at worst for one slot.
            Batch throughput is the flood's tokens over the run's span, until every request
            of the run is answered: FIFO serves the trickle after the flood and admission
            during it, so only that window holds the same work in both modes (the flood's
            own span is reported too).
  fairness  two batch keys, one sending 4x the other's rate (both above what the gear serves):
            the tokens each key got served while both were backlogged.
  pooled    the priority run on a pool of two spark-cortex replicas (peer gateways, 2 slots
            each) behind a pooling gateway. The pool's queue is always on, so FIFO here sends
            the interactive requests with the flood's key: one key, one class, served in
            arrival order as vLLM's own queues would.

Times are the simulator's seed time (wall seconds x time-scale).

    PYTHONPATH=gateway python3 bench/admission_bench.py [--time-scale 10] [--write-docs]

--write-docs rewrites the admission-bench section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import docs_section

DOCS_TITLE = "## Admission: priority and fair share (`bench/admission_bench.py`)"
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "gateway")]

from tests.support.gateway_proc import start_gateway  # noqa: E402
from tests.support.sim_proc import start_sim  # noqa: E402

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
KEYS = {"person": "bench-person", "agents": "bench-agents", "heavy": "bench-heavy",
        "light": "bench-light"}
# Each key may have its whole flood in flight (GATEWAY_MAX_INFLIGHT_PER_KEY is 32).
CLIENT_KEYS = ",".join(f"{name}={key}:{'interactive' if name == 'person' else 'batch'}:100"
                       for name, key in KEYS.items())
FLOOD, FLOOD_TOKENS, SHORT_TOKENS, EVERY_S, SHORT_COUNT = 40, 512, 16, 2.0, 30
FAIR_TOKENS, FAIR_LIGHT, LIGHT_EVERY_S = 128, 12, 2.5  # light sends 1 per 2.5 s, heavy 4x


@dataclass(frozen=True)
class Answer:
    """One completed request: whose, its tokens, and when it was sent and done (wall)."""

    key: str
    tokens: int
    sent: float
    done: float


class Client:
    """Requests to one gateway from threads; every answer kept."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: list[Answer] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def ask(self, key: str, tokens: int, sent_as: str | None = None) -> Answer:
        """One request marked `key`, sent with `sent_as`'s key (by default `key`'s own)."""
        body = json.dumps({"model": "main", "max_tokens": tokens, "ignore_eos": True,
                           "messages": [{"role": "user", "content": f"{key} asks"}]})
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
        sent = time.monotonic()
        connection.request("POST", "/v1/chat/completions", body,
                           {"Content-Type": "application/json",
                            "Authorization": f"Bearer {KEYS[sent_as or key]}"})
        response = connection.getresponse()
        payload = response.read()
        connection.close()
        if response.status != 200:
            raise RuntimeError(f"{key}: HTTP {response.status} {payload[:200]!r}")
        answer = Answer(key, json.loads(payload)["usage"]["completion_tokens"], sent,
                        time.monotonic())
        with self._lock:
            self.answers.append(answer)
        return answer

    def send(self, key: str, tokens: int, sent_as: str | None = None) -> None:
        thread = threading.Thread(target=self.ask, args=(key, tokens, sent_as))
        thread.start()
        self._threads.append(thread)

    def join(self) -> list[Answer]:
        for thread in self._threads:
            thread.join()
        return self.answers

    def of(self, key: str) -> list[Answer]:
        return [a for a in self.answers if a.key == key]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def reference_s(port: int, scale: float) -> tuple[float, float]:
    """One batch request's duration with both slots busy, and a short request's idle latency."""
    client = Client(port)
    client.send("agents", FLOOD_TOKENS)
    client.send("agents", FLOOD_TOKENS)
    pair = client.join()
    idle = Client(port).ask("person", SHORT_TOKENS)
    return (max(a.done - a.sent for a in pair) * scale, (idle.done - idle.sent) * scale)


def priority_run(port: int, scale: float, trickle_key: str = "person") -> dict[str, float]:
    """The flood and the interactive trickle (sent with `trickle_key`, marked `person`)."""
    client = Client(port)
    for _n in range(FLOOD):
        client.send("agents", FLOOD_TOKENS)
    for _n in range(SHORT_COUNT):
        time.sleep(EVERY_S / scale)
        client.send("person", SHORT_TOKENS, trickle_key)
    client.join()
    return {"p95": p95([(a.done - a.sent) * scale for a in client.of("person")]),
            "batch_tok_s": tok_per_s(client.of("agents"), scale, client.answers),
            "flood_tok_s": tok_per_s(client.of("agents"), scale),
            "total_tok_s": tok_per_s(client.answers, scale)}


def tok_per_s(answers: list[Answer], scale: float,
              window: list[Answer] | None = None) -> float:
    """Tokens of `answers` per second of seed time, over the span from the first request of
    `window` (by default the answers themselves) sent to its last one done."""
    spanned = window or answers
    span = max(a.done for a in spanned) - min(a.sent for a in spanned)
    return sum(a.tokens for a in answers) / span / scale


def fairness_run(port: int, scale: float) -> float:
    """heavy / light tokens served while both were backlogged (until light's last arrival)."""
    client = Client(port)
    for tick in range(FAIR_LIGHT * 4):
        if tick % 4 == 0:
            client.send("light", FAIR_TOKENS)
        client.send("heavy", FAIR_TOKENS)
        time.sleep(LIGHT_EVERY_S / 4 / scale)
    window_end = time.monotonic()
    client.join()
    served = {key: sum(a.tokens for a in client.of(key) if a.done <= window_end)
              for key in ("heavy", "light")}
    return served["heavy"] / max(1, served["light"])


def run_mode(admission: bool, scale: float) -> dict[str, float]:
    env = {"GATEWAY_API_KEY": "bench-box", "GATEWAY_CLIENT_KEYS": CLIENT_KEYS,
           "PRIMARY_SERVED_NAME": SERVED, "PRIMARY_MAX_MODEL_LEN": "262144"}
    if admission:
        env["PRIMARY_MAX_ACTIVE"] = "2"
    with ExitStack() as stack:
        sim = stack.enter_context(start_sim("spark-cortex", time_scale=scale))
        gateway = stack.enter_context(start_gateway({**env, "PRIMARY_BASE_URL": sim.url}))
        batch_s, idle_s = reference_s(gateway.port, scale)
        result = {"batch_s": batch_s, "idle_s": idle_s, **priority_run(gateway.port, scale)}
        result["fair_ratio"] = fairness_run(gateway.port, scale)
        return result


def pooled_run(admission: bool, scale: float) -> dict[str, float]:
    """The priority run through a pooling gateway in front of two spark-cortex replicas."""
    peer = {"PRIMARY_SERVED_NAME": SERVED, "PRIMARY_MAX_MODEL_LEN": "262144",
            "PRIMARY_MAX_ACTIVE": "2"}
    rate = f"{48.9 * scale:g}"  # the replicas' declared priors, wall tok/s
    with ExitStack() as stack:
        replicas = [stack.enter_context(start_gateway(
            {**peer, "PRIMARY_BASE_URL": stack.enter_context(
                start_sim("spark-cortex", time_scale=scale)).url})) for _n in range(2)]
        pooler = stack.enter_context(start_gateway({
            "GATEWAY_API_KEY": "bench-box", "GATEWAY_CLIENT_KEYS": CLIENT_KEYS,
            "PRIMARY_FEASIBLE": "false", "PRIMARY_ROUTE": "pool", "PRIMARY_MAX_ACTIVE": "2",
            "PRIMARY_PEER_ORIGINS": ",".join(r.url for r in replicas),
            "PRIMARY_PEER_API_KEYS": ",", "PRIMARY_PEER_RATES": f"{rate},{rate}"}))
        wait_ready(pooler.port)
        batch_s, idle_s = reference_s(pooler.port, scale)
        run = priority_run(pooler.port, scale, "person" if admission else "agents")
        return {"batch_s": batch_s, "idle_s": idle_s, **run}


def wait_ready(port: int) -> None:
    """Until the pooling gateway's probes found its replicas ready."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/capabilities")
        role = json.loads(connection.getresponse().read())["roles"]["cortex"]
        connection.close()
        if role.get("ready") and len(role.get("replicas", [])) == 2:
            return
        time.sleep(0.1)
    raise RuntimeError("the pool's replicas did not become ready")


def pooled_table(fifo: dict[str, float], queued: dict[str, float]) -> list[str]:
    reference = queued["batch_s"] + queued["idle_s"]
    return [
        "",
        "**pooled**: the same flood and trickle through a pooling gateway in front of two "
        "`spark-cortex` replicas (peer gateways, 2 slots each). The pool's queue is always on: "
        "FIFO sends the interactive requests with the flood's key (one key, one class: arrival "
        "order, as vLLM's own queues would serve them).",
        "",
        "| | FIFO (arrival order) | admission (classes) | goal |",
        "|---|---:|---:|---|",
        f"| interactive p95 latency during the flood | {fifo['p95']:.1f} s | "
        f"{queued['p95']:.1f} s | <= 1.2 x {reference:.1f} s (one batch request "
        f"{queued['batch_s']:.1f} s + idle {queued['idle_s']:.2f} s): "
        f"{queued['p95'] / reference:.2f} x |",
        f"| interactive p95, FIFO / admission | | {fifo['p95'] / queued['p95']:.1f} x | "
        ">= 10 x |",
        f"| batch throughput: the flood's tokens over the run | {fifo['batch_tok_s']:.1f} tok/s"
        f" | {queued['batch_tok_s']:.1f} tok/s | {queued['batch_tok_s'] / fifo['batch_tok_s']:.3f}"
        " x FIFO |",
        f"| the flood's tokens over the flood's own span | {fifo['flood_tok_s']:.1f} tok/s | "
        f"{queued['flood_tok_s']:.1f} tok/s | {queued['flood_tok_s'] / fifo['flood_tok_s']:.3f}"
        " x FIFO |",
    ]


def table(fifo: dict[str, float], queued: dict[str, float], scale: float) -> list[str]:
    reference = queued["batch_s"] + queued["idle_s"]
    return [
        f"Run `python3 bench/admission_bench.py --write-docs` on {platform.machine()} / "
        f"{platform.python_version()}, {date.today().isoformat()}: one `spark-cortex` gear "
        f"(2 slots) at time-scale {scale:g} behind a real gateway, seconds in seed time. FIFO is "
        "today's path (no `PRIMARY_MAX_ACTIVE`: the gear's own queue); admission sets "
        "`PRIMARY_MAX_ACTIVE=2`.",
        "",
        "| | FIFO (vLLM queue) | admission (gateway queue) | goal |",
        "|---|---:|---:|---|",
        f"| interactive p95 latency during a {FLOOD} x {FLOOD_TOKENS}-token batch flood | "
        f"{fifo['p95']:.1f} s | {queued['p95']:.1f} s | <= 1.2 x {reference:.1f} s "
        f"(one batch request {queued['batch_s']:.1f} s + idle {queued['idle_s']:.2f} s): "
        f"{queued['p95'] / reference:.2f} x |",
        f"| interactive p95, FIFO / admission | | {fifo['p95'] / queued['p95']:.1f} x | >= 10 x |",
        f"| batch throughput: the flood's tokens over the run (until flood and trickle are "
        f"all answered) | {fifo['batch_tok_s']:.1f} tok/s | {queued['batch_tok_s']:.1f} tok/s "
        f"| >= 0.97 x FIFO: {queued['batch_tok_s'] / fifo['batch_tok_s']:.3f} x |",
        f"| the flood's tokens over the flood's own span (FIFO serves the trickle after it) | "
        f"{fifo['flood_tok_s']:.1f} tok/s | {queued['flood_tok_s']:.1f} tok/s | "
        f"{queued['flood_tok_s'] / fifo['flood_tok_s']:.3f} x FIFO |",
        f"| the gear's throughput, flood and interactive requests together | "
        f"{fifo['total_tok_s']:.1f} tok/s | {queued['total_tok_s']:.1f} tok/s | "
        f"{queued['total_tok_s'] / fifo['total_tok_s']:.3f} x FIFO |",
        f"| served tokens, 4x-rate key / 1x key, both backlogged | {fifo['fair_ratio']:.2f} | "
        f"{queued['fair_ratio']:.2f} | within 10% of 1 |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    fifo = run_mode(False, args.time_scale)
    queued = run_mode(True, args.time_scale)
    pooled_fifo = pooled_run(False, args.time_scale)
    pooled = pooled_run(True, args.time_scale)
    section = table(fifo, queued, args.time_scale) + pooled_table(pooled_fifo, pooled)
    print("\n".join(section))
    print(json.dumps({"fifo": fifo, "admission": queued, "pooled_fifo": pooled_fifo,
                      "pooled": pooled}, indent=1))
    if args.write_docs:
        docs_section.write_section("admission-bench", "\n".join(section), title=DOCS_TITLE)


if __name__ == "__main__":
    main()
