"""What both admission queues (a gear's and a pool's) show of the same held requests."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

from .metrics import Scrape
from .wait import wait_until

DEPTH = "lobes_gateway_admission_queue_depth"


def assert_two_agents_and_one_person_queued(status: dict, scrape: Scrape, role: str) -> None:
    """/status and /metrics show two `agents` requests (batch) and one `person` request
    (interactive) waiting for `role`, counted by class and by key name."""
    assert status["queued"] == {"interactive": 1, "standard": 0, "batch": 2}
    assert status["queued_by_client"] == {"agents": 2, "person": 1}
    assert scrape.value(DEPTH, role=role, **{"class": "batch"}) == 2
    assert scrape.value(DEPTH, role=role, **{"class": "interactive"}) == 1
    assert scrape.value(f"{DEPTH}_by_client", role=role, client="agents") == 2


def leave_while_queued(port: int, model: str, key: str,
                       queued_by_client: Callable[[], dict]) -> None:
    """Send a chat request with `key` on a raw socket, wait until the queue holds it (by the
    key's name, `evals`), close the socket, and wait until the queue has dropped it."""
    body = json.dumps({"model": model, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "gone"}]}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head.encode() + body)
        wait_until(lambda: queued_by_client() == {"evals": 1}, timeout=10, interval=0.02,
                   message="the request to wait")
    wait_until(lambda: queued_by_client() == {}, timeout=10, interval=0.02,
               message="the queue to drop the request whose client left")
