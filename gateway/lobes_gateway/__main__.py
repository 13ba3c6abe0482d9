"""Read the environment, build the gateway, serve: `python3 -m lobes_gateway`."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys

from . import __version__
from .app import Gateway
from .config import ConfigError, load_config
from .http import MAX_HEAD_BYTES

LISTEN_BACKLOG = 4096
# Young-generation collections every 700 allocations re-walk every in-flight request's objects;
# nearly all garbage here dies by reference count, so collect far less often.
GC_THRESHOLDS = (50_000, 20, 100)


async def serve(gateway: Gateway) -> None:
    """Listen until SIGTERM/SIGINT; the hot path is set up before gc.freeze()."""
    config = gateway.config
    # First: the samplers' first pass completes before the first request can arrive.
    await gateway.start_background()
    server = await asyncio.start_server(gateway.serve_connection, config.host, config.port,
                                        backlog=LISTEN_BACKLOG, reuse_address=True,
                                        limit=MAX_HEAD_BYTES)
    port = server.sockets[0].getsockname()[1]
    print(f"lobes_gateway {__version__} listening on http://{config.host}:{port}",
          file=sys.stderr, flush=True)
    # Start-up objects live for the process: keep them out of every collection.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    gateway.close()


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
