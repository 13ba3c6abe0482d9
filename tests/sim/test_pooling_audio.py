"""Embedder, reranker and audio-bridge profiles over HTTP, including the WebSocket echo."""

from __future__ import annotations

import base64
import hashlib
import math
import socket
import struct

import pytest

from tests.support.sim_proc import start_sim

from .client import post, request


@pytest.fixture(scope="module")
def embedder():
    with start_sim("embedder", time_scale=50) as sim:
        yield sim


@pytest.fixture(scope="module")
def reranker():
    with start_sim("reranker", time_scale=50) as sim:
        yield sim


@pytest.fixture(scope="module")
def audio():
    with start_sim("audio", time_scale=50) as sim:
        yield sim


def _embed(sim, **payload):
    return post(sim.url, "/v1/embeddings", payload)


def test_embeddings_have_the_declared_dimension_and_unit_norm(embedder):
    answer = _embed(embedder, input=["alpha", "beta"]).json()
    assert answer["object"] == "list"
    assert [d["index"] for d in answer["data"]] == [0, 1]
    for item in answer["data"]:
        assert item["object"] == "embedding"
        assert len(item["embedding"]) == 1024
        assert math.isclose(math.fsum(v * v for v in item["embedding"]), 1.0, rel_tol=1e-9)
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0


def test_embeddings_are_deterministic_per_text(embedder):
    first = _embed(embedder, input="same text").json()["data"][0]["embedding"]
    again = _embed(embedder, input=["other", "same text"]).json()["data"][1]["embedding"]
    other = _embed(embedder, input="other").json()["data"][0]["embedding"]
    assert first == again
    assert first != other


def test_embed_dim_flag_and_dimensions_field(sim_factory):
    sim = sim_factory("embedder", time_scale=50, extra_args=["--embed-dim", "64"])
    assert len(_embed(sim, input="x").json()["data"][0]["embedding"]) == 64
    short = _embed(sim, input="x", dimensions=16).json()["data"][0]["embedding"]
    assert len(short) == 16
    assert _embed(sim, input="x", dimensions=65).status == 400


def test_base64_embeddings_decode_to_the_float_vector(embedder):
    floats = _embed(embedder, input="vec").json()["data"][0]["embedding"]
    packed = _embed(embedder, input="vec", encoding_format="base64").json()["data"][0]
    decoded = struct.unpack("<1024f", base64.b64decode(packed["embedding"]))
    pairs = zip(decoded, floats, strict=True)
    assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in pairs)


def test_embedding_input_over_the_window_is_400(embedder):
    reply = _embed(embedder, input="w" * 40000)
    assert reply.status == 400
    assert "maximum context length is 8192 tokens" in reply.json()["error"]["message"]


def test_embedder_has_no_chat_route(embedder):
    assert post(embedder.url, "/v1/chat/completions", {"messages": []}).status == 404


def test_rerank_orders_by_relevance_with_vllms_shape(reranker):
    documents = ["bananas are yellow fruit", "the gateway routes requests to peers", "cats"]
    answer = post(reranker.url, "/v1/rerank", {
        "query": "how does the gateway route requests", "documents": documents, "top_n": 2,
    }).json()
    assert set(answer) == {"id", "model", "usage", "results"}
    assert answer["model"] == "Qwen/Qwen3-Reranker-0.6B"
    assert answer["usage"]["total_tokens"] > 0
    first, second = answer["results"]
    assert first["index"] == 1
    assert first["document"] == {"text": documents[1]}
    assert first["relevance_score"] > second["relevance_score"]


def test_score_pairs_one_to_many_with_vllms_shape(reranker):
    answer = post(reranker.url, "/v1/score", {
        "text_1": "red apples", "text_2": ["red apples taste sweet", "trains run late"],
    }).json()
    assert answer["object"] == "list"
    assert [d["object"] for d in answer["data"]] == ["score", "score"]
    assert [d["index"] for d in answer["data"]] == [0, 1]
    assert answer["data"][0]["score"] > answer["data"][1]["score"]
    assert 0 < answer["data"][1]["score"] < 1


def test_score_rejects_mismatched_lists(reranker):
    reply = post(reranker.url, "/v1/score", {"text_1": ["a", "b"], "text_2": ["c"]})
    assert reply.status == 400


def _multipart(payload: bytes) -> tuple[bytes, str]:
    boundary = "simboundary42"
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n"
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
        "Content-Type: audio/wav\r\n\r\n"
    ).encode() + payload + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def test_transcription_text_depends_only_on_the_upload_size(audio):
    def transcribe(payload: bytes) -> str:
        body, content_type = _multipart(payload)
        reply = request(audio.url, "POST", "/v1/audio/transcriptions", raw=body,
                        headers={"Content-Type": content_type})
        assert reply.status == 200
        return reply.json()["text"]

    small = transcribe(b"\x01" * 32000)
    assert small == transcribe(b"\x02" * 32000)
    larger = transcribe(b"\x01" * 96000)
    assert len(larger.split()) > len(small.split())


def test_speech_returns_a_wav_that_grows_with_the_input(audio):
    short = post(audio.url, "/v1/audio/speech", {"model": "tts", "input": "hi", "voice": "a"})
    long = post(audio.url, "/v1/audio/speech", {"model": "tts", "input": "hello " * 20})
    assert short.headers["content-type"] == "audio/wav"
    assert short.body[:4] == b"RIFF" and short.body[8:12] == b"WAVE"
    assert len(long.body) > len(short.body)


def _upgrade(port: int, key: str) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(
        (
            "GET /v1/realtime?model=x HTTP/1.1\r\nHost: sim\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1024)
    return sock, head


def test_realtime_upgrades_with_a_correct_accept_and_echoes_bytes(audio):
    key = base64.b64encode(b"0123456789abcdef").decode()
    sock, head = _upgrade(audio.port, key)
    with sock:
        expected = base64.b64encode(
            hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
        ).decode()
        assert head.startswith(b"HTTP/1.1 101 ")
        assert f"Sec-WebSocket-Accept: {expected}".encode() in head
        payload = bytes(range(256)) * 4
        sock.sendall(payload)
        echoed = b""
        while len(echoed) < len(payload):
            echoed += sock.recv(4096)
        assert echoed == payload


def test_realtime_without_upgrade_is_426(audio):
    assert request(audio.url, "GET", "/v1/realtime").status == 426


def test_audio_profile_answers_health(audio):
    assert request(audio.url, "GET", "/health").status == 200
