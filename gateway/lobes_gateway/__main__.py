"""Read the environment, build the gateway, serve: `python3 -m lobes_gateway`."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys

from lobes_contract import http_origin

from . import __version__
from .app.gateway import Gateway
from .policy.config import ConfigError, load_config

LISTEN_BACKLOG = 4096
# Young-generation collections every 700 allocations re-walk every in-flight request's objects;
# nearly all garbage here dies by reference count, so collect far less often.
GC_THRESHOLDS = (50_000, 20, 100)


async def serve(gateway: Gateway) -> None:
    """Listen until SIGTERM/SIGINT; the hot path is set up before gc.freeze()."""
    config = gateway.config
    # First: the samplers' first pass completes before the first request can arrive.
    await gateway.start_background()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(gateway.accept, config.host, config.port,
                                      backlog=LISTEN_BACKLOG, reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    print(f"lobes_gateway {__version__} listening on {http_origin(config.host, port)}",
          file=sys.stderr, flush=True)
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
    asyncio.run(serve(gateway))
    return 0


if __name__ == "__main__":
    sys.exit(main())
