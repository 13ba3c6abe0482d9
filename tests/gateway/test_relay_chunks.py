"""The event-stream pass-through's backpressure, end to end (its chunk framing:
test_chunked.py)."""

from __future__ import annotations

import asyncio
import socket
import time

from lobes_gateway.app.relay import _ChunkPipe
from lobes_gateway.transport.channel import Channel
from lobes_gateway.transport.upstream import BodyTimeouts, Connection, Origin

from tests.support.sse import Streamed, stream_chat


def test_a_client_that_stops_reading_gets_the_whole_stream_once_it_reads_again(
        sim_factory, gateway_factory):
    """The pass-through pauses its upstream while the client's unsent bytes are over the
    high-water mark and resumes once they drain: nothing is dropped or reordered."""
    sim = sim_factory("instant", served_name="sim-a")
    gateway = gateway_factory({"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": "sim-a",
                               "PRIMARY_MAX_MODEL_LEN": "131072"})
    ask = {"model": "cortex", "messages": [{"role": "user", "content": "go on"}],
           "max_tokens": 40000, "ignore_eos": True}
    napped: list[bool] = []

    def nap_once(_streamed: Streamed) -> None:
        if not napped:  # the stream fills every buffer on its way meanwhile
            napped.append(True)
            time.sleep(1.5)

    streamed = stream_chat(gateway.url, ask, after_event=nap_once)
    assert streamed.done and streamed.content_events == ask["max_tokens"]
    reference = stream_chat(sim.url, {**ask, "model": "sim-a"})
    assert streamed.text == reference.text


def test_the_chunk_pipe_pauses_its_upstream_while_the_client_is_over_its_high_water_mark():
    """Real sockets: a client that reads nothing fills its transport past the high-water mark;
    the pipe then stops reading its upstream (no frame per chunk asks the buffer's size: the
    client channel's write_paused says it), and reads it again once the client drained."""

    async def scenario() -> tuple[bool, bool, bool, int]:
        loop = asyncio.get_running_loop()
        client_end, caller = socket.socketpair()
        upstream_end, gear = socket.socketpair()
        for end in (client_end, caller):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        client = (await loop.create_connection(Channel, sock=client_end))[1]
        upstream = (await loop.create_connection(Channel, sock=upstream_end))[1]
        conn = Connection(Origin("127.0.0.1", 9), upstream)
        pipe = _ChunkPipe(client.write, client, conn, conn.abort, BodyTimeouts(30.0, 600.0))
        pipe.attach(conn)
        chunk = b"%x\r\n%s\r\n" % (1000, b"x" * 1000)
        gear.setblocking(False)
        # 400 KB toward a caller reading nothing: more than the pipe reads before it pauses
        # and the sockets hold, so the gear is still sending when it pauses.
        sending = asyncio.ensure_future(loop.sock_sendall(gear, chunk * 400))
        paused = await asyncio.wait_for(pipe.wait(), 5)  # None: paused for the client
        reading_while_full = upstream.transport.is_reading()
        caller.setblocking(False)
        received = 0
        while client.write_paused:  # the caller reads: the client drains below its low mark
            try:
                received += len(await asyncio.wait_for(loop.sock_recv(caller, 65536), 5))
            except asyncio.TimeoutError:
                break
        pipe.resume()
        reading_again = upstream.transport.is_reading()
        sending.cancel()
        for end in (caller, gear):
            end.close()
        client.abort()
        upstream.abort()
        return paused is None and pipe.paused is False, reading_while_full, reading_again, \
            received

    resumed, reading_while_full, reading_again, received = asyncio.run(scenario())
    assert not reading_while_full
    assert resumed and reading_again
    assert received > 0


def test_a_diverted_socket_that_closes_reads_as_ended_once_taken_back():
    """Real sockets: while diverted, the receiver is the socket's protocol (its bytes and its
    loss reach it, the channel buffers nothing); a socket that closed meanwhile is ended for
    the channel that takes it back: a read answers at once instead of waiting for a callback
    that will never come, and the connection is not pooled again."""

    class Receiver(asyncio.Protocol):
        def __init__(self) -> None:
            self.data = b""
            self.lost = asyncio.get_running_loop().create_future()

        def data_received(self, data: bytes) -> None:
            self.data += data

        def connection_lost(self, exc: Exception | None) -> None:
            self.lost.set_result(True)

    async def scenario() -> tuple[bytes, bytes, int, bool, bytes]:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        channel = (await loop.create_connection(Channel, sock=ours))[1]
        receiver = Receiver()
        held = channel.divert(receiver)
        theirs.sendall(b"after the divert")
        theirs.close()
        await asyncio.wait_for(receiver.lost, 5)
        buffered = channel.pending()
        channel.divert(None)
        read = await asyncio.wait_for(channel.read(100), 5)
        return held, receiver.data, buffered, channel.reusable(), read

    held, received, buffered, reusable, read = asyncio.run(scenario())
    assert held == b"" and received == b"after the divert" and buffered == 0
    assert not reusable and read == b""
