"""Fibers: a connection's coroutine stepped from socket callbacks (transport/fiber.py)."""

import asyncio

from lobes_gateway.transport.channel import Channel
from lobes_gateway.transport.fiber import Fiber


async def listening(on_connect) -> tuple[asyncio.AbstractServer, int]:
    """A server on 127.0.0.1 whose connections are Channels calling `on_connect`; its port."""
    server = await asyncio.get_running_loop().create_server(lambda: Channel(on_connect),
                                                            "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def in_fiber(serve):
    """An on_connect that serves each connection's Channel with `serve` as a fiber."""
    return lambda channel: Fiber(serve(channel)).step()


def test_a_fiber_reads_a_channel_and_awaits_other_futures():
    async def scenario():
        loop = asyncio.get_running_loop()
        seen: list[object] = []
        finished = loop.create_future()

        async def serve(channel: Channel) -> None:
            seen.append(asyncio.current_task())  # a fiber is not a Task
            seen.append(await channel.readuntil(b"\n", 1024))
            await asyncio.sleep(0)  # a bare yield
            await asyncio.sleep(0.01)  # a foreign future
            seen.append(await channel.readexactly(3))
            channel.write(b"done")
            finished.set_result(None)

        server, port = await listening(in_fiber(serve))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hello\n")
        await asyncio.sleep(0.05)
        writer.write(b"abc")
        await asyncio.wait_for(finished, 5)
        answer = await reader.readexactly(4)
        writer.close()
        server.close()
        return seen, answer

    seen, answer = asyncio.run(scenario())
    assert seen == [None, b"hello\n", b"abc"]
    assert answer == b"done"


def test_a_fiber_waiting_on_a_closed_channel_ends():
    async def scenario():
        loop = asyncio.get_running_loop()
        outcome = loop.create_future()

        async def serve(channel: Channel) -> None:
            try:
                await channel.readuntil(b"\r\n\r\n", 1024)
            except asyncio.IncompleteReadError as exc:
                outcome.set_result(exc.partial)

        server, port = await listening(in_fiber(serve))
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HT")
        await writer.drain()
        writer.close()
        result = await asyncio.wait_for(outcome, 5)
        server.close()
        return result

    assert asyncio.run(scenario()) == b"GET / HT"


def test_a_fibers_wait_is_held_by_its_channel_and_a_tasks_by_a_future():
    async def scenario():
        loop = asyncio.get_running_loop()
        channels: list[Channel] = []
        tasks: list[asyncio.Task] = []
        got: list[bytes] = []

        async def serve(channel: Channel) -> None:
            got.append(await channel.readuntil(b"\n", 1024))

        def accept(channel: Channel) -> None:
            channels.append(channel)
            if len(channels) == 1:
                in_fiber(serve)(channel)
            else:
                tasks.append(loop.create_task(serve(channel)))

        server, port = await listening(accept)
        writers = []
        for _client in range(2):
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"part")
            writers.append(writer)
            await asyncio.sleep(0.05)
        # The fiber's channel holds the fiber and no future; the Task waits on a future.
        held = [(c._fiber is not None, c._waiter is not None) for c in channels]
        for writer in writers:
            writer.write(b" two\n")
        await asyncio.sleep(0.05)
        for writer in writers:
            writer.close()
        server.close()
        return held, got

    held, got = asyncio.run(scenario())
    assert held == [(True, False), (False, True)]
    assert got == [b"part two\n", b"part two\n"]


def test_a_separator_split_across_segments_is_found():
    async def scenario():
        loop = asyncio.get_running_loop()
        got: list[bytes] = []
        finished = loop.create_future()

        async def serve(channel: Channel) -> None:
            got.append(await channel.readuntil(b"\r\n\r\n", 1024))
            got.append(await channel.readexactly(4))
            finished.set_result(None)

        server, port = await listening(in_fiber(serve))
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for segment in (b"GET / HTTP/1.1\r", b"\nHost: x\r\n", b"\r", b"\nbody"):
            writer.write(segment)
            await asyncio.sleep(0.02)  # each its own segment, read before the next comes
        await asyncio.wait_for(finished, 5)
        writer.close()
        server.close()
        return got

    assert asyncio.run(scenario()) == [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"body"]
