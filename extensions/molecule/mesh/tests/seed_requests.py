"""The requests the replays send, shaped like the seeds' own."""

from __future__ import annotations

import uuid
from typing import Any

# Seed 000 asked for 160 tokens (answers of 154-155); a quarter of that keeps the replays short
# at the gears' real speed (time scale 1) with the same ratios between the boxes.
REPLY_TOKENS = 40


def cortex_request(tag: str | None = None) -> dict[str, Any]:
    """Seed 000's request (model cortex, temperature 0), REPLY_TOKENS long. `tag` goes into the
    prompt, to find the request in a recorder."""
    content = f"replay {tag}" if tag else "replay"
    return {"model": "cortex", "max_tokens": REPLY_TOKENS, "temperature": 0,
            "messages": [{"role": "user", "content": content}]}


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged(requests: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """The recorded requests whose body carries `tag`."""
    return [request for request in requests if tag in request["body"]]
