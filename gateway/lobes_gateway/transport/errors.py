"""OpenAI-shaped error bodies and the status each one travels with."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ApiError:
    """An error the gateway answers itself: status, OpenAI error type/code, message, headers."""

    status: int
    type: str
    code: str
    message: str
    headers: tuple[tuple[str, str], ...] = ()
    # Members of the error object a program can act on, e.g. a referral's hosted_by.
    fields: tuple[tuple[str, str], ...] = ()
    # The request field the error is about (OpenAI's error.param), None when none is.
    param: str | None = None

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param,
                 "code": self.code, **dict(self.fields)}
        return json.dumps({"error": error}).encode()


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, "invalid_request_error", "invalid_request", message, param=param)


def uri_too_long(limit: int) -> ApiError:
    return ApiError(414, "invalid_request_error", "uri_too_long",
                    f"the request target exceeds {limit} bytes; send a shorter path")


def version_not_supported(version: str) -> ApiError:
    return ApiError(505, "invalid_request_error", "http_version_not_supported",
                    f"{version[:16]} is not supported; speak HTTP/1.1")


def unsupported_media_type(coding: str) -> ApiError:
    return ApiError(415, "invalid_request_error", "unsupported_media_type",
                    f"Content-Encoding {coding[:32]!r} is not supported; send the JSON body "
                    "uncompressed")


def context_length_exceeded(role: str, prompt_tokens: int, max_tokens: int | None,
                            largest_window: int) -> ApiError:
    """No ready replica of a pool serves a window the request fits (vLLM's code for it)."""
    answer = f" + max_tokens {max_tokens}" if max_tokens is not None else ""
    asked = f"~{prompt_tokens} prompt tokens{answer}"
    return ApiError(400, "invalid_request_error", "context_length_exceeded",
                    f"the largest window a ready replica of the {role} pool serves is "
                    f"{largest_window} tokens and the request needs {asked}; shorten the "
                    "prompt or lower max_tokens")


def invalid_json(detail: str) -> ApiError:
    return ApiError(400, "invalid_request_error", "invalid_json",
                    f"request body is not valid JSON ({detail}); send a JSON object")


def invalid_api_key() -> ApiError:
    return ApiError(401, "invalid_api_key", "invalid_api_key",
                    "missing or invalid API key; send Authorization: Bearer <this gateway's key>",
                    (("WWW-Authenticate", "Bearer"),))


def not_found(path: str) -> ApiError:
    return ApiError(404, "invalid_request_error", "not_found",
                    f"no route for {path}; see /v1/models and the gateway documentation")


def no_gear_metrics(role: str, gears: list[str]) -> ApiError:
    here = ", ".join(gears) if gears else "none"
    return ApiError(404, "invalid_request_error", "not_found",
                    f"no gear of role {role!r} runs on this box; its gears' metrics are at "
                    f"/metrics/gears/<role> for: {here}")


def method_not_allowed(method: str, path: str, allowed: str) -> ApiError:
    return ApiError(405, "invalid_request_error", "method_not_allowed",
                    f"{method} is not allowed on {path}; use {allowed}",
                    (("Allow", allowed),))


def role_infeasible(role: str, hosted_by: str | None) -> ApiError:
    if hosted_by:
        message = (f"role {role} is not feasible on this box; it is hosted by {hosted_by}: "
                   "send the request there (error.hosted_by)")
        return ApiError(404, "role_infeasible", "role_infeasible", message,
                        fields=(("hosted_by", hosted_by),))
    message = f"role {role} is not feasible on this box and no peer is declared for it"
    return ApiError(404, "role_infeasible", "role_infeasible", message)


def peer_declined(role: str, peer: str) -> ApiError:
    return ApiError(404, "role_infeasible", "role_infeasible",
                    f"role {role} was proxied to {peer}, which declined it as infeasible too; "
                    "fix the peer declaration of this box")


def not_implemented(what: str) -> ApiError:
    return ApiError(501, "invalid_request_error", "not_implemented",
                    f"this gateway does not implement {what}")


def upstream_interrupted() -> ApiError:
    return ApiError(502, "upstream_unavailable", "upstream_interrupted",
                    "the backend closed the connection before its answer was complete; "
                    "retry the request")


def request_timeout() -> ApiError:
    return ApiError(408, "invalid_request_error", "request_timeout",
                    "the request did not arrive in time; send headers and body promptly")


def head_too_large(limit: int, what: str = "request line and headers") -> ApiError:
    return ApiError(431, "invalid_request_error", "request_header_fields_too_large",
                    f"{what} exceed {limit} bytes; send fewer or shorter headers")


def payload_too_large(limit: int) -> ApiError:
    return ApiError(413, "invalid_request_error", "payload_too_large",
                    f"request body exceeds {limit} bytes (GATEWAY_MAX_BODY_BYTES); send less")


def upgrade_required() -> ApiError:
    return ApiError(426, "invalid_request_error", "upgrade_required",
                    "/v1/realtime is a WebSocket; send GET with Upgrade: websocket",
                    (("Upgrade", "websocket"),))


_SHED_CAUSES = {"busy": "swap or IO pressure", "memory": "low available memory"}


def server_busy(retry_after: int, tier: str, reason: str = "busy") -> ApiError:
    """429 for a shed tier; reason is busy (swap, iowait) or memory (MemAvailable, PSI)."""
    return ApiError(429, "server_busy", "busy",
                    f"the box is under {_SHED_CAUSES[reason]} and sheds the {tier} tier; "
                    f"retry after {retry_after}s, request model=minor, "
                    "or send X-Lobes-Override: true",
                    (("Retry-After", str(retry_after)), ("X-Lobes-Tier-Reason", reason)))


def every_replica_busy(who: str, named: str, retry_after: int) -> ApiError:
    """429 when every replica tried answered 429 (shedding under pressure, or at a limit)."""
    return ApiError(429, "server_busy", "busy",
                    f"{who} is busy ({named}); retry after {retry_after}s, or request "
                    "model=minor", (("Retry-After", str(retry_after)),))


def rate_limited(limit: int, source: str = "GATEWAY_MAX_INFLIGHT_PER_KEY") -> ApiError:
    """429 for a key at its in-flight limit; `source` names the setting that limits it."""
    return ApiError(429, "rate_limit_exceeded", "rate_limit_exceeded",
                    f"this key already has {limit} requests in flight "
                    f"({source}); wait for one to finish",
                    (("Retry-After", "1"),))


def deadline_unmeetable(role: str, deadline_s: float, expected_s: float | None,
                        retry_after: int) -> ApiError:
    """429 for a request that would not start before its X-Lobes-Deadline-S; never started."""
    expected = ("" if expected_s is None
                else f" (the queue expects it to start in {expected_s:.1f}s)")
    return ApiError(429, "rate_limit_exceeded", "deadline_unmeetable",
                    f"the {role} gear cannot start this request within its deadline of "
                    f"{deadline_s:g}s{expected}; retry after {retry_after}s, raise "
                    "X-Lobes-Deadline-S, or send it with a stronger X-Lobes-Priority key",
                    (("Retry-After", str(retry_after)),))


def invalid_admission_header(header: str, value: str, fix: str) -> ApiError:
    """400 for an X-Lobes-Priority or X-Lobes-Deadline-S the gateway cannot read."""
    return ApiError(400, "invalid_request_error", "invalid_header",
                    f"{header}: {value[:64]!r} is not valid; {fix}")


def upstream_unavailable(role: str) -> ApiError:
    return ApiError(502, "upstream_unavailable", "upstream_unavailable",
                    f"every backend for role {role} is down; check the gears on this box")


def backend_unavailable(what: str, retry_after: int) -> ApiError:
    return ApiError(503, "backend_unavailable", "backend_unavailable",
                    f"{what} is unavailable; retry after {retry_after}s",
                    (("Retry-After", str(retry_after)),))


def not_wired(role: str, variable: str) -> ApiError:
    return ApiError(503, "backend_unavailable", "backend_not_wired",
                    f"role {role} has no backend on this box; set {variable}",
                    (("Retry-After", "5"),))


def proxy_loop(role: str, arrived_from: str, next_hop: str) -> ApiError:
    return ApiError(508, "proxy_loop", "proxy_loop",
                    f"role {role} arrived already proxied (X-Lobes-Proxied: {arrived_from}) and "
                    f"would be proxied again to {next_hop}; proxying is single-hop, "
                    "fix the peer declarations so the role is served where it lands")
