"""Task lanes routed by path: embeddings, rerank/score, audio (verbatim), and /v1/realtime."""

import base64
import hashlib
import json
import os
import socket

import openai
import pytest

from tests.support.client import call, raw_exchange
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim


@pytest.fixture(scope="module")
def lanes():
    with start_sim("embedder", served_name="emb") as embed, \
            start_sim("reranker", served_name="rr") as rerank, start_sim("audio") as audio:
        env = {"EMBED_BASE_URL": embed.url, "EMBED_SERVED_NAME": "emb",
               "RERANK_BASE_URL": rerank.url, "RERANK_SERVED_NAME": "rr",
               "AUDIO_URL": audio.url}
        with start_gateway(env) as gateway:
            yield gateway, embed, rerank, audio


def last_post(sim) -> dict:
    return [r for r in sim.requests() if r["method"] == "POST"][-1]


def test_embeddings_route_by_path_with_model_rewrite(lanes):
    gateway, embed, *_ = lanes
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0)
    result = client.embeddings.create(model="main", input=["a", "b"])
    assert len(result.data) == 2 and result.model == "emb"
    assert json.loads(last_post(embed)["body"])["model"] == "emb"


@pytest.mark.parametrize(("path", "payload"), [
    ("/v1/rerank", {"query": "q", "documents": ["a", "b"]}),
    ("/v1/score", {"text_1": "q", "text_2": ["a", "b"]}),
])
def test_rerank_and_score_go_to_the_reranker(lanes, path, payload):
    gateway, _, rerank, _ = lanes
    reply = call(gateway.url, "POST", path, {"model": "whatever", **payload})
    assert reply.status == 200, reply.body
    recorded = last_post(rerank)
    assert recorded["path"] == path and json.loads(recorded["body"])["model"] == "rr"


def test_transcription_multipart_is_forwarded_verbatim(lanes):
    gateway, _, _, audio = lanes
    boundary = "lobesboundary"
    upload = os.urandom(40_000)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n").encode() + upload + \
        f"\r\n--{boundary}--\r\n".encode()
    reply = call(gateway.url, "POST", "/v1/audio/transcriptions", body,
                 {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert reply.status == 200 and reply.json()["text"]
    recorded = last_post(audio)
    assert recorded["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert recorded["headers"]["content-type"] == f"multipart/form-data; boundary={boundary}"


def test_speech_returns_audio_bytes(lanes):
    gateway, _, _, audio = lanes
    reply = call(gateway.url, "POST", "/v1/audio/speech", {"model": "tts", "input": "hello"})
    assert reply.status == 200
    assert reply.headers["content-type"] == "audio/wav" and reply.body.startswith(b"RIFF")
    assert json.loads(last_post(audio)["body"])["model"] == "tts"  # no rewrite on audio


def test_realtime_without_upgrade_is_426(lanes):
    reply = call(lanes[0].url, "GET", "/v1/realtime")
    assert reply.status == 426 and reply.error["code"] == "upgrade_required"


def test_realtime_tunnels_bytes_both_ways(lanes):
    gateway = lanes[0]
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall((f"GET /v1/realtime?model=x HTTP/1.1\r\nHost: g\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                      "X-Request-Id: rt-7\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        head, _, rest = head.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 ")
        accept = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        assert f"Sec-WebSocket-Accept: {accept}".encode() in head
        # The bridge echoes the id it was sent; the client sees the request's id once.
        assert [line for line in head.lower().split(b"\r\n")
                if line.startswith(b"x-request-id")] == [b"x-request-id: rt-7"]
        for payload in (b"\x81\x05hello", os.urandom(100_000)):
            sock.sendall(payload)
            echoed = rest
            while len(echoed) < len(payload):
                echoed += sock.recv(65536)
            assert echoed == payload
            rest = b""


def test_realtime_infeasible_stt_is_404_even_when_proxy_is_armed(gateway_factory, sim_factory):
    audio = sim_factory("audio")
    gateway = gateway_factory({"AUDIO_URL": audio.url, "STT_FEASIBLE": "false",
                               "STT_PEER_ORIGIN": "http://thor:8000", "STT_PEER_PROXY": "true"})
    reply = raw_exchange(gateway.url, b"GET /v1/realtime HTTP/1.1\r\nHost: g\r\n"
                         b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Key: x\r\n\r\n", timeout=0.5)
    assert reply.startswith(b"HTTP/1.1 404 ")
    assert b"role_infeasible" in reply and b"http://thor:8000" in reply
    assert audio.requests() == [] or all(r["path"] == "/health" for r in audio.requests())


def test_a_large_upload_passes_whole_by_length_and_chunked(lanes):
    gateway, _, _, audio = lanes
    upload = os.urandom(3 * 1024 * 1024)  # far above the socket's read high-water mark
    reply = call(gateway.url, "POST", "/v1/audio/transcriptions", upload,
                 {"Content-Type": "audio/wav"})
    assert reply.status == 200 and reply.json()["text"]
    assert last_post(audio)["body_sha256"] == hashlib.sha256(upload).hexdigest()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part)
                       for part in (upload[i:i + 100_000] for i in range(0, len(upload), 100_000)))
    head = (b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: audio/wav\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    answer = raw_exchange(gateway.url, head + chunked + b"0\r\n\r\n", timeout=10)
    assert answer.startswith(b"HTTP/1.1 200")
    assert last_post(audio)["body_sha256"] == hashlib.sha256(upload).hexdigest()


def test_a_large_answer_passes_whole(lanes):
    gateway, _, _, audio = lanes
    payload = {"model": "tts", "input": "x" * 400}  # about 1.2 MB of audio
    direct = call(audio.url, "POST", "/v1/audio/speech", payload)
    reply = call(gateway.url, "POST", "/v1/audio/speech", payload)
    assert reply.status == 200 and len(reply.body) > 1_000_000
    assert reply.body == direct.body
    assert reply.headers["content-length"] == str(len(direct.body))


def test_pipelined_requests_are_answered_in_order(lanes):
    gateway, _, _, _ = lanes
    first = json.dumps({"model": "emb", "input": "one"}).encode()
    second = json.dumps({"model": "emb", "input": ["two", "three"]}).encode()
    requests = b"".join(
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n%s\r\n" % (len(body), closing) + body
        for body, closing in ((first, b""), (second, b"Connection: close\r\n")))
    answer = raw_exchange(gateway.url, requests, timeout=10)
    heads = answer.split(b"HTTP/1.1 ")[1:]
    assert [h[:3] for h in heads] == [b"200", b"200"]
    bodies = [json.loads(h.split(b"\r\n\r\n", 1)[1]) for h in heads]
    assert [len(b["data"]) for b in bodies] == [1, 2]
