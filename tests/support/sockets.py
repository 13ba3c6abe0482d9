"""Sockets for tests of how a protocol reads: a connected TCP pair on 127.0.0.1 with bytes
already waiting, so a read may take as much as it asks for."""

from __future__ import annotations

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
