"""Fibers: a connection's coroutine stepped from socket callbacks (transport/fiber.py)."""

import asyncio

from lobes_gateway.transport.channel import Channel
from lobes_gateway.transport.fiber import Fiber


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

        server = await loop.create_server(lambda: Channel(lambda ch: Fiber(serve(ch)).step()),
                                          "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
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

        server = await loop.create_server(lambda: Channel(lambda ch: Fiber(serve(ch)).step()),
                                          "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HT")
        await writer.drain()
        writer.close()
        result = await asyncio.wait_for(outcome, 5)
        server.close()
        return result

    assert asyncio.run(scenario()) == b"GET / HT"
