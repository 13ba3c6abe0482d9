"""A small asyncio HTTP/1.1 layer: parse requests, write JSON, bytes and chunked responses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from .state import ClientGone

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
READ_SIZE = 64 * 1024


class BadRequest(Exception):
    """The bytes on the wire are not a request we can parse."""


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"

    def json(self) -> Any:
        return json.loads(self.body or b"null")


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class Connection:
    """One client connection: a read buffer we own (so a disconnect watcher can share it)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        # The die_mid_body fault, armed per request: the next JSON answer is cut in half.
        self.cut_body = False
        self._buffer = bytearray()
        self._eof = False
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Nagle would hold each small SSE chunk for ~40 ms.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def _fill(self) -> bool:
        if self._eof:
            return False
        try:
            data = await self.reader.read(READ_SIZE)
        except ConnectionError:
            data = b""
        if not data:
            self._eof = True
            return False
        self._buffer += data
        return True

    async def read_request(self) -> Request | None:
        """The next request, or None when the client closed between requests."""
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise BadRequest("request head too large")
            if not await self._fill():
                if self._buffer:
                    raise BadRequest("connection closed inside a request head")
                return None
        head = bytes(self._buffer[:end]).decode("latin-1")
        del self._buffer[: end + 4]
        method, target, headers = _parse_head(head)
        if headers.get("expect", "").lower() == "100-continue":
            # curl waits a second for this before sending a large body.
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await self._read_body(headers)
        return Request(method, target, headers, body)

    async def _read_exact(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if not await self._fill():
                raise BadRequest("connection closed inside a request body")
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def _read_line(self) -> bytes:
        while (end := self._buffer.find(b"\r\n")) < 0:
            if not await self._fill():
                raise BadRequest("connection closed inside a chunked body")
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line

    async def _read_body(self, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await self._read_chunked()
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            raise BadRequest("invalid Content-Length") from exc
        if length < 0 or length > MAX_BODY_BYTES:
            raise BadRequest("Content-Length out of range")
        return await self._read_exact(length)

    async def _read_chunked(self) -> bytes:
        body = bytearray()
        while True:
            size_line = await self._read_line()
            try:
                size = int(size_line.split(b";", 1)[0], 16)
            except ValueError as exc:
                raise BadRequest("invalid chunk size") from exc
            if size == 0:
                while await self._read_line():
                    pass  # trailers, ignored
                return bytes(body)
            body += await self._read_exact(size)
            await self._read_exact(2)
            if len(body) > MAX_BODY_BYTES:
                raise BadRequest("chunked body too large")

    async def watch_disconnect(self, on_disconnect: Callable[[], None]) -> None:
        """Read ahead until the client closes, then call ``on_disconnect``; cancel when done."""
        while await self._fill():
            pass
        on_disconnect()

    async def raw_read(self) -> bytes:
        """Bytes for a tunnel: what is buffered first, then whatever the socket delivers."""
        if self._buffer:
            data = bytes(self._buffer)
            self._buffer.clear()
            return data
        if not await self._fill():
            return b""
        return await self.raw_read()

    # ---- responses -------------------------------------------------------------------------

    def _head(self, status: int, headers: dict[str, str]) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason_phrase(status)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send_bytes(
        self,
        status: int,
        body: bytes,
        content_type: str,
        keep_alive: bool = True,
        extra: dict[str, str] | None = None,
    ) -> None:
        headers = {
            "content-type": content_type,
            "content-length": str(len(body)),
            "connection": "keep-alive" if keep_alive else "close",
            **(extra or {}),
        }
        if self.cut_body:
            self.writer.write(self._head(status, headers) + body[:len(body) // 2])
            await self.writer.drain()
            self.drop()
            raise ClientGone
        self.writer.write(self._head(status, headers) + body)
        await self.writer.drain()

    async def send_json(self, status: int, payload: Any, keep_alive: bool = True) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        await self.send_bytes(status, body, "application/json", keep_alive)

    async def start_chunked(self, status: int, content_type: str, keep_alive: bool = True) -> None:
        headers = {
            "content-type": content_type,
            "transfer-encoding": "chunked",
            "cache-control": "no-cache",
            "connection": "keep-alive" if keep_alive else "close",
        }
        self.writer.write(self._head(status, headers))
        await self.writer.drain()

    def drop(self) -> None:
        """End the connection mid-response: flush what was written, then close (no last chunk)."""
        self.writer.transport.close()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def stop_watching(watcher: asyncio.Task[None]) -> None:
    """Cancel a disconnect watcher and wait until it no longer reads from the socket."""
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher


def _parse_head(head: str) -> tuple[str, str, dict[str, str]]:
    request_line, *header_lines = head.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"malformed request line {request_line!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(f"malformed header line {line!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return parts[0], parts[1], headers
