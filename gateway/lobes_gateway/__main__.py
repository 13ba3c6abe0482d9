"""Read the environment, build the gateway, serve: `python3 -m lobes_gateway`."""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import signal
import sys

from lobes_contract import host_port, http_origin

from . import __version__
from .app.gateway import Gateway
from .policy.config import ConfigError, load_config
from .transport import loop as event_loop

LISTEN_BACKLOG = 4096
# Young-generation collections every 700 allocations re-walk every in-flight request's objects;
# nearly all garbage here dies by reference count, so collect far less often.
GC_THRESHOLDS = (50_000, 20, 100)


class ListenError(Exception):
    """The gateway cannot listen where its configuration says; the message names the fix."""


def listen_failure(host: str, port: int, exc: OSError) -> ListenError:
    """Why GATEWAY_HOST:GATEWAY_PORT cannot be listened on, and what to change."""
    if exc.errno == errno.EADDRINUSE:
        fix = ("another process holds the port: stop it, or set GATEWAY_PORT (the inventory's "
               "fleet_gateway_port) to a free one")
    elif exc.errno == errno.EACCES:
        fix = "ports below 1024 need privileges: set GATEWAY_PORT to 1024 or above"
    else:  # an unknown name or an address this box does not have
        fix = ("set GATEWAY_HOST (the inventory's fleet_gateway_host) to an address of this "
               "box, or 0.0.0.0 for all of them")
    # asyncio words a bind error with the address again; the system's words say it once.
    reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or str(exc)
    return ListenError(f"cannot listen on {host_port(host, port)} (GATEWAY_HOST, GATEWAY_PORT): "
                       f"{reason}; {fix}")


async def serve(gateway: Gateway) -> None:
    """Listen until SIGTERM/SIGINT; the hot path is set up before gc.freeze()."""
    config = gateway.config
    # First: the samplers' first pass completes before the first request can arrive.
    await gateway.start_background()
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(gateway.accept, config.host, config.port,
                                          backlog=LISTEN_BACKLOG, reuse_address=True)
    except OSError as exc:
        await gateway.close()
        raise listen_failure(config.host, config.port, exc) from None
    port = server.sockets[0].getsockname()[1]
    # The loop named: LeanLoop where it fits, else asyncio's (see transport/loop.py).
    print(f"lobes_gateway {__version__} listening on {http_origin(config.host, port)} "
          f"(event loop: {type(loop).__name__})", file=sys.stderr, flush=True)
    # Start-up objects live for the process: keep them out of every collection.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    await gateway.close()
    await server.wait_closed()


def main() -> int:
    try:
        config = load_config(os.environ)
        gateway = Gateway(config)
    except ConfigError as exc:
        print(f"lobes_gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        event_loop.run(serve(gateway))
    except ListenError as exc:
        print(f"lobes_gateway: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
