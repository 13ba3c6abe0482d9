"""The audio bridge stand-in: transcriptions, speech, and the /v1/realtime WebSocket tunnel."""

from __future__ import annotations

import base64
import hashlib
import json
import struct

from . import errors
from .httpio import Connection, Request
from .pooling import run_prefill
from .state import ClientGone, SimState
from .textgen import TokenStream
from .validation import request_json

WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
# 16 kHz mono 16-bit audio: 32,000 bytes a second, about two spoken words.
BYTES_PER_WORD = 16_000
SPEECH_RATE_HZ = 24_000
SPEECH_SECONDS_PER_CHAR = 0.06


def uploaded_file_size(request: Request) -> int:
    """Size of the multipart ``file`` part (the whole body when it is not multipart)."""
    content_type = request.headers.get("content-type", "")
    _, _, boundary = content_type.partition("boundary=")
    boundary = boundary.split(";", 1)[0].strip().strip('"')
    if not boundary:
        return len(request.body)
    for part in request.body.split(b"--" + boundary.encode()):
        head, sep, content = part.partition(b"\r\n\r\n")
        if sep and b'name="file"' in head:
            return len(content.removesuffix(b"\r\n"))
    return len(request.body)


def transcript(size: int) -> str:
    """The deterministic 'transcript' of an upload of ``size`` bytes."""
    return TokenStream(size).text(1 + size // BYTES_PER_WORD).strip()


def wav_bytes(seconds: float) -> bytes:
    """A mono 16-bit PCM WAV file of silence lasting ``seconds``."""
    frames = int(seconds * SPEECH_RATE_HZ)
    data = b"\x00\x00" * frames
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
    header += struct.pack("<IHHIIHH", 16, 1, 1, SPEECH_RATE_HZ, SPEECH_RATE_HZ * 2, 2, 16)
    return header + b"data" + struct.pack("<I", len(data)) + data


async def handle_transcription(state: SimState, conn: Connection, request: Request) -> None:
    size = uploaded_file_size(request)
    await run_prefill(state, conn, [0])
    text = transcript(size)
    if b'name="response_format"\r\n\r\ntext' in request.body:
        await conn.send_bytes(200, text.encode(), "text/plain; charset=utf-8", request.keep_alive)
        return
    await conn.send_json(200, {"text": text}, request.keep_alive)


async def handle_speech(state: SimState, conn: Connection, request: Request) -> None:
    body = request_json(request)
    text = body.get("input")
    if not isinstance(text, str) or not text:
        raise errors.bad_request("'input' must be a non-empty string.", "input")
    await run_prefill(state, conn, [0])
    audio = wav_bytes(len(text) * SPEECH_SECONDS_PER_CHAR)
    await conn.send_bytes(200, audio, "audio/wav", request.keep_alive)


def websocket_accept(key: str) -> str:
    """Sec-WebSocket-Accept for a client's Sec-WebSocket-Key (RFC 6455 section 4.2.2)."""
    return base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest()).decode()


async def handle_realtime(state: SimState, conn: Connection, request: Request) -> None:
    """101 Switching Protocols, then echo every byte back until the client closes."""
    key = request.headers.get("sec-websocket-key")
    if "websocket" not in request.headers.get("upgrade", "").lower() or not key:
        body = json.dumps({"detail": "Upgrade Required: send Upgrade: websocket"}).encode()
        await conn.send_bytes(426, body, "application/json", request.keep_alive,
                              {"upgrade": "websocket"})
        return
    # Echoed as vLLM's --enable-request-id-headers does.
    request_id = request.headers.get("x-request-id")
    echoed = f"X-Request-Id: {request_id}\r\n" if request_id else ""
    conn.writer.write(
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {websocket_accept(key)}\r\n{echoed}\r\n"
        ).encode()
    )
    await conn.writer.drain()
    while data := await conn.raw_read():
        conn.writer.write(data)
        await conn.writer.drain()
    raise ClientGone


AUDIO_ROUTES = {
    ("POST", "/v1/audio/transcriptions"): handle_transcription,
    ("POST", "/v1/audio/speech"): handle_speech,
    ("GET", "/v1/realtime"): handle_realtime,
}
