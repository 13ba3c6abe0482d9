"""The two listeners: the serving port (vLLM's surface, with faults) and the admin port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from . import errors
from .faults import parse_faults
from .generate import handle_generate
from .httpio import BadRequest, Connection, Request
from .state import ClientGone, SimState
from .views import metrics_text, models_listing

LISTEN_BACKLOG = 4096
log = logging.getLogger("lobes_sim")

Handler = Callable[[SimState, Connection, Request], Awaitable[None]]
NOT_FOUND = {"detail": "Not Found"}


async def _health(state: SimState, conn: Connection, request: Request) -> None:
    await conn.send_bytes(200, b"", "application/json", request.keep_alive)


async def _models(state: SimState, conn: Connection, request: Request) -> None:
    await conn.send_json(200, models_listing(state), request.keep_alive)


async def _metrics(state: SimState, conn: Connection, request: Request) -> None:
    body = metrics_text(state).encode()
    await conn.send_bytes(200, body, "text/plain; version=0.0.4; charset=utf-8", request.keep_alive)


async def _version(state: SimState, conn: Connection, request: Request) -> None:
    await conn.send_json(200, {"version": state.engine_version}, request.keep_alive)


async def _chat(state: SimState, conn: Connection, request: Request) -> None:
    await handle_generate(state, conn, request, chat=True)


async def _completions(state: SimState, conn: Connection, request: Request) -> None:
    await handle_generate(state, conn, request, chat=False)


class ServingRoutes:
    """Which (method, path) the serving port answers for the profile's task."""

    def __init__(self, routes: dict[tuple[str, str], Handler]) -> None:
        self.routes = routes

    def find(self, method: str, path: str) -> Handler | int:
        """The handler, or the status FastAPI would give (404 no route, 405 wrong method)."""
        handler = self.routes.get((method, path))
        if handler is not None:
            return handler
        if any(route_path == path for _, route_path in self.routes):
            return 405
        return 404


def serving_routes(task_routes: dict[tuple[str, str], Handler]) -> ServingRoutes:
    """The routes every vLLM server has, plus the task's own (generate, embed, score, audio)."""
    common: dict[tuple[str, str], Handler] = {
        ("GET", "/health"): _health,
        ("GET", "/v1/models"): _models,
        ("GET", "/metrics"): _metrics,
        ("GET", "/version"): _version,
        ("GET", "/ping"): _health,
    }
    return ServingRoutes({**common, **task_routes})


GENERATE_ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/v1/chat/completions"): _chat,
    ("POST", "/v1/completions"): _completions,
}


class ServingPort:
    """The vLLM-compatible listener; it can stop listening (refuse fault) and resume."""

    def __init__(self, state: SimState, routes: ServingRoutes, host: str, port: int) -> None:
        self.state = state
        self.routes = routes
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._idle: set[Connection] = set()

    async def apply_refuse(self, refuse: bool) -> None:
        """Listen, or stop listening and drop idle keep-alive connections (a dead server)."""
        if refuse and self._server is None and self.port == 0:
            # Asked to refuse from the start on "any free port": take one so it has a number.
            await self.apply_refuse(False)
        if refuse and self._server is not None:
            self._server.close()
            self._server = None
            for conn in list(self._idle):
                conn.writer.transport.close()
        elif not refuse and self._server is None:
            self._server = await asyncio.start_server(
                self._serve, self.host, self.port, backlog=LISTEN_BACKLOG, reuse_address=True
            )
            self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(reader, writer)
        try:
            while True:
                self._idle.add(conn)
                try:
                    request = await conn.read_request()
                finally:
                    self._idle.discard(conn)
                if request is None:
                    break
                keep = await self._answer(conn, request)
                if not keep or not request.keep_alive:
                    break
        except BadRequest as exc:
            with contextlib.suppress(ConnectionError, OSError):
                await conn.send_json(400, errors.error_body(400, str(exc)), keep_alive=False)
        except (ConnectionError, OSError):
            pass
        finally:
            await conn.close()

    async def _answer(self, conn: Connection, request: Request) -> bool:
        """Answer one request; False when the connection must close."""
        state = self.state
        state.recorder.record(request.method, request.target, request.headers, request.body)
        try:
            conn.cut_body = state.faults.die_mid_body and request.method == "POST"
            faulted = await self._answer_fault(conn, request)
            if faulted is not None:
                return faulted
            handler = self.routes.find(request.method, request.path)
            if isinstance(handler, int):
                detail = NOT_FOUND if handler == 404 else {"detail": "Method Not Allowed"}
                await conn.send_json(handler, detail, request.keep_alive)
                return True
            await handler(state, conn, request)
            return True
        except errors.ApiError as exc:
            await conn.send_json(exc.status, exc.body(), request.keep_alive)
            return True
        except ClientGone:
            return False
        except (ConnectionError, OSError):
            raise
        except Exception:
            # A simulator bug must still answer like a server, not drop the connection.
            log.exception("internal error answering %s %s", request.method, request.target)
            body = errors.error_body(500, "Internal simulator error; see its log.")
            await conn.send_json(500, body, keep_alive=False)
            return False

    async def _answer_fault(self, conn: Connection, request: Request) -> bool | None:
        """Play the active hang and 5xx faults; None when the request should be served."""
        faults = self.state.faults
        if faults.hang:
            await conn.watch_disconnect(lambda: None)
            return False
        if faults.hang_s:
            await asyncio.sleep(self.state.sim_seconds(faults.hang_s))
        if faults.error_status:
            message = "Simulated server fault (error_status); clear it: POST /admin/faults {}."
            body = errors.error_body(faults.error_status, message)
            await conn.send_json(faults.error_status, body, request.keep_alive)
            return True
        return None


class AdminPort:
    """GET/POST /admin/faults, GET/DELETE /admin/requests, GET /health on a separate port."""

    def __init__(self, state: SimState, serving: ServingPort, host: str, port: int) -> None:
        self.state = state
        self.serving = serving
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, backlog=256, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(reader, writer)
        try:
            while (request := await conn.read_request()) is not None:
                status, payload = await self._answer(request)
                await conn.send_json(status, payload, request.keep_alive)
                if not request.keep_alive:
                    break
        except (BadRequest, ConnectionError, OSError):
            pass
        finally:
            await conn.close()

    async def _answer(self, request: Request) -> tuple[int, object]:
        key = (request.method, request.path)
        if key == ("GET", "/health"):
            profile = self.state.profile
            return 200, {
                "status": "ok",
                "serving_port": self.serving.port,
                "profile": profile.name,
                "served_name": profile.served_name,
                "max_model_len": profile.max_model_len,
                "max_num_seqs": profile.max_num_seqs,
                "quantization": profile.quantization,
                "time_scale": self.state.time_scale,
            }
        if key == ("GET", "/admin/faults"):
            return 200, self.state.faults.as_json()
        if key == ("POST", "/admin/faults"):
            return await self._set_faults(request)
        if key == ("GET", "/admin/requests"):
            return 200, {"requests": self.state.recorder.entries()}
        if key == ("DELETE", "/admin/requests"):
            self.state.recorder.clear()
            return 200, {"requests": []}
        return 404, NOT_FOUND

    async def _set_faults(self, request: Request) -> tuple[int, object]:
        try:
            faults = parse_faults(json.loads(request.body or b"{}"))
        except ValueError as exc:
            return 400, errors.error_body(400, f"Bad fault set: {exc}")
        self.state.faults = faults
        await self.serving.apply_refuse(faults.refuse)
        if faults.engine_dead:
            self.state.shutdown.set()
        log.info("faults now %s", faults.as_json())
        return 200, faults.as_json()
