"""Pooling gears: POST /v1/embeddings (embedder), /v1/rerank and /v1/score (reranker).

Each input is one prefill-only sequence in the engine, so pooling requests queue for slots and
take time the way generate requests do.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any

from . import errors
from .engine import ABORT, Sequence
from .httpio import Connection, Request, stop_watching
from .state import ClientGone, SimState
from .textgen import (
    count_prompt_tokens,
    count_text_tokens,
    embedding,
    pack_base64_floats,
    relevance,
)
from .validation import checked_model, request_json


async def run_prefill(state: SimState, conn: Connection, token_counts: list[int]) -> None:
    """Push one prefill-only sequence per input through the engine and wait for all of them."""
    window = state.profile.max_model_len
    for tokens in token_counts:
        if tokens > window:
            raise errors.ApiError(
                400,
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested {tokens} tokens in the input. Please reduce the length of the input.",
            )
    sequences = [Sequence(tokens, 0, natural=0) for tokens in token_counts]
    abort_all = state.engine.submit_all(sequences)
    watcher = asyncio.create_task(conn.watch_disconnect(abort_all))
    try:
        for sequence in sequences:
            while not sequence.finished:
                await sequence.progress()
            if sequence.finish_reason == ABORT:
                raise ClientGone
    finally:
        await stop_watching(watcher)


def _usage(prompt_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }


def _embedding_inputs(value: Any) -> list[Any]:
    """The inputs of an embeddings request: texts, or token-id lists."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, int) for item in value):
            return [value]
        if all(isinstance(item, str | list) for item in value):
            return value
    raise errors.bad_request("'input' must be a string, a list of strings or token ids.", "input")


def _dimensions(state: SimState, body: dict[str, Any]) -> int:
    full = state.profile.embed_dim
    asked = body.get("dimensions")
    if asked is None:
        return full
    if isinstance(asked, bool) or not isinstance(asked, int) or not 1 <= asked <= full:
        raise errors.bad_request(f"dimensions must be between 1 and {full}.", "dimensions")
    return asked


def _vector(state: SimState, item: Any, dim: int) -> list[float]:
    # Matryoshka models truncate then renormalise: a prefix of the full vector, rescaled.
    full = embedding(repr(item), state.profile.embed_dim, state.seed)[:dim]
    norm = sum(v * v for v in full) ** 0.5 or 1.0
    return [v / norm for v in full]


async def handle_embeddings(state: SimState, conn: Connection, request: Request) -> None:
    body = request_json(request)
    model = checked_model(state, body)
    inputs = _embedding_inputs(body.get("input"))
    dim = _dimensions(state, body)
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise errors.bad_request("encoding_format must be 'float' or 'base64'.", "encoding_format")
    counts = [count_prompt_tokens(item) for item in inputs]
    await run_prefill(state, conn, counts)
    data = []
    for index, item in enumerate(inputs):
        vector = _vector(state, item, dim)
        value: Any = vector
        if encoding == "base64":
            value = base64.b64encode(pack_base64_floats(vector)).decode()
        data.append({"index": index, "object": "embedding", "embedding": value})
    await conn.send_json(200, _listing("embd", model, data, counts), request.keep_alive)


def _listing(id_prefix: str, model: str, data: list[dict], counts: list[int]) -> dict:
    """vLLM's list envelope of a pooling answer (embeddings, score)."""
    return {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": _usage(sum(counts)),
    }


def _texts(value: Any, name: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        texts = [item.get("text") if isinstance(item, dict) else item for item in value]
        if all(isinstance(text, str) for text in texts):
            return texts
    raise errors.bad_request(f"'{name}' must be a string or a non-empty list of strings.", name)


def _pairs(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The (text_1, text_2) pairs of a /v1/score request: one-to-many or pairwise."""
    firsts = _texts(body.get("text_1"), "text_1")
    seconds = _texts(body.get("text_2"), "text_2")
    if len(firsts) == 1:
        return [(firsts[0], second) for second in seconds]
    if len(firsts) != len(seconds):
        raise errors.bad_request("text_1 and text_2 must have the same length.", "text_2")
    return list(zip(firsts, seconds, strict=True))


async def handle_score(state: SimState, conn: Connection, request: Request) -> None:
    body = request_json(request)
    model = checked_model(state, body)
    pairs = _pairs(body)
    counts = [count_text_tokens(a) + count_text_tokens(b) for a, b in pairs]
    await run_prefill(state, conn, counts)
    data = [
        {"index": index, "object": "score", "score": relevance(first, second)}
        for index, (first, second) in enumerate(pairs)
    ]
    await conn.send_json(200, _listing("score", model, data, counts), request.keep_alive)


async def handle_rerank(state: SimState, conn: Connection, request: Request) -> None:
    body = request_json(request)
    model = checked_model(state, body)
    query = body.get("query")
    if not isinstance(query, str):
        raise errors.bad_request("'query' must be a string.", "query")
    documents = _texts(body.get("documents"), "documents")
    counts = [count_text_tokens(query) + count_text_tokens(doc) for doc in documents]
    await run_prefill(state, conn, counts)
    results = [
        {"index": index, "document": {"text": doc}, "relevance_score": relevance(query, doc)}
        for index, doc in enumerate(documents)
    ]
    results.sort(key=lambda result: result["relevance_score"], reverse=True)
    top_n = body.get("top_n")
    if isinstance(top_n, int) and top_n > 0:
        results = results[:top_n]
    await conn.send_json(200, {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model,
        "usage": {"total_tokens": sum(counts)},
        "results": results,
    }, request.keep_alive)


EMBED_ROUTES = {("POST", "/v1/embeddings"): handle_embeddings}
SCORE_ROUTES = {
    ("POST", "/v1/rerank"): handle_rerank,
    ("POST", "/rerank"): handle_rerank,
    ("POST", "/v2/rerank"): handle_rerank,
    ("POST", "/v1/score"): handle_score,
    ("POST", "/score"): handle_score,
}
