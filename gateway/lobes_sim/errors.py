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


# What vLLM's API server says when its engine core is gone: in-band on a stream, as a 500
# otherwise.
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class ApiError(Exception):
    """A request vLLM would refuse; carries the status and the body to send."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type: str | None = None  # the status's own type unless set

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.type)


def error_body(status: int, message: str, param: str | None = None,
               err_type: str | None = None) -> dict[str, Any]:
    err_type = err_type or _TYPES.get(
        status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def engine_dead() -> ApiError:
    return ApiError(500, ENGINE_DEAD)


def unknown_model(model: str, served: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist. Valid aliases: {served}.",
                    param="model")


def prompt_over_window(max_model_len: int, prompt_tokens: int) -> ApiError:
    """vLLM's 400 for a prompt that leaves no room for output: it reads at most one token past
    the window, so it reports "at least" that many."""
    seen = min(prompt_tokens, max_model_len + 1)
    return ApiError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains at least {seen} input tokens, which exceeds this limit even without any "
        f"output tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={seen})",
        param="input_tokens",
    )


def max_tokens_over_window(max_model_len: int, max_tokens: int) -> ApiError:
    """vLLM's 400 for max_tokens past the window itself (below it, the output is cut at the
    window's end instead)."""
    return ApiError(
        400,
        f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. Please "
        f"request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
        param="max_tokens",
    )


def validation_error(loc: str, kind: str, message: str) -> ApiError:
    """A request vLLM's schema refuses (pydantic): type "Bad Request", param the field's
    location."""
    error = ApiError(400, f"1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', "
                          f"'msg': '{message}'}}", param=loc)
    error.type = "Bad Request"
    return error


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)
