"""Request-body checks every endpoint shares, failing the way vLLM does."""

from __future__ import annotations

from typing import Any

from . import errors
from .httpio import Request
from .state import SimState


def request_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or vLLM's 400."""
    try:
        body = request.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.validation_error("body", "json_invalid",
                                      f"JSON decode error: {exc}") from exc
    if not isinstance(body, dict):
        raise errors.validation_error("body", "model_attributes_type", "Input should be a "
                                      "valid dictionary or object to extract fields from")
    return body


def checked_model(state: SimState, body: dict[str, Any]) -> str:
    """The served name the request addresses; an unknown model is vLLM's 404."""
    model = body.get("model") or state.profile.served_name
    if model != state.profile.served_name:
        raise errors.unknown_model(str(model), state.profile.served_name)
    return model


def int_field(body: dict[str, Any], name: str, default: int) -> int:
    """A non-negative integer field of the body, or vLLM's 400 naming it."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise errors.bad_request(f"'{name}' must be a non-negative integer, got {value!r}.", name)
    return value
