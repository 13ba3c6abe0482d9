"""A tiny http.client wrapper for tests of gateways: exact status, headers and body.

Nothing raises on an error status; header names are lower-cased.
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class Reply:
    """One HTTP answer as it came: status, lower-cased headers, body bytes."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        """The body parsed as JSON."""
        return json.loads(self.body)

    @property
    def error(self) -> dict:
        """The OpenAI-shaped error object of the body."""
        return self.json()["error"]


def call(url: str, method: str, path: str, body: bytes | dict | None = None,
         headers: dict[str, str] | None = None, timeout: float = 30.0) -> Reply:
    """One request on a fresh connection; a dict body is sent as JSON."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    all_headers = {"Content-Type": "application/json"} if isinstance(body, dict) else {}
    all_headers.update(headers or {})
    try:
        conn.request(method, path, body=data, headers=all_headers)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def chat(url: str, payload: dict | None = None, headers: dict[str, str] | None = None, *,
         timeout: float = 30.0) -> Reply:
    """POST a chat completion: one "hello" message and max_tokens 8 unless `payload` says else."""
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, **(payload or {})}
    return call(url, "POST", "/v1/chat/completions", body, headers, timeout=timeout)


def sse_events(body: bytes) -> list[str]:
    """The data payloads of an SSE body, in order."""
    return [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]


def raw_exchange(url: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes on a fresh socket and read until the server closes or times out."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)


def wired(sim, prefix: str = "PRIMARY", served: str = "sim-instant") -> dict[str, str]:
    """The env that wires `sim` (an instant-profile simulator by default) as a role's backend."""
    return {f"{prefix}_BASE_URL": sim.url, f"{prefix}_SERVED_NAME": served}
