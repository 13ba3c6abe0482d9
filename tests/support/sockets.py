"""Sockets for tests of how a protocol reads: a connected TCP pair on 127.0.0.1 with bytes
already waiting, so a read may take as much as it asks for."""

from __future__ import annotations

import asyncio
import socket

# Room for the waiting bytes: the kernel caps it at twice net.core.rmem_max / wmem_max.
BUFFER_BYTES = 1 << 20


def waiting_tcp_pair(unread: bytes) -> tuple[socket.socket, socket.socket]:
    """(ours, theirs): `unread` sent by theirs before ours reads anything. A send that does
    not fit the buffers fails within seconds instead of hanging."""
    listener = socket.socket()
    try:
        # Before listen(): an accepted socket takes its receive buffer from the listener.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        theirs = socket.socket()
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
        theirs.connect(listener.getsockname())
        ours, _address = listener.accept()
    finally:
        listener.close()
    theirs.settimeout(5)
    theirs.sendall(unread)
    return ours, theirs


class SizedReads(asyncio.Protocol):
    """A protocol that notes the size of each read its socket hands it."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def data_received(self, data: bytes) -> None:
        self.sizes.append(len(data))

    async def until(self, total: int) -> list[int]:
        """The sizes, once the reads add up to `total` bytes."""
        while sum(self.sizes) < total:
            await asyncio.sleep(0.01)
        return self.sizes
