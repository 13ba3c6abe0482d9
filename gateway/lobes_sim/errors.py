"""Error bodies as vLLM's OpenAI server writes them: {"error": {message, type, param, code}}."""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}

# What xgrammar reports when a strict tool schema uses a feature it cannot compile.
GRAMMAR_COMPILE_FAILURE = (
    "The provided JSON schema contains features not supported by xgrammar."
)


class ApiError(Exception):
    """A request vLLM would refuse; carries the status and the body to send."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param)


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    err_type = _TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def unknown_model(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", param="model")


def over_window(max_model_len: int, prompt_tokens: int, max_tokens: int | None) -> ApiError:
    """The 400 for a prompt (plus the requested output) longer than max_model_len."""
    if max_tokens is None or prompt_tokens >= max_model_len:
        return ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_tokens} input tokens. Please reduce the length of the input "
            "messages.",
        )
    return ApiError(
        400,
        f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
        f"maximum context length is {max_model_len} tokens and your request has "
        f"{prompt_tokens} input tokens ({max_tokens} > {max_model_len} - {prompt_tokens}).",
        param="max_tokens",
    )


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)
