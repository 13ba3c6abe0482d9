"""How much one read of a socket asks for, on the gateway's own channel and on a protocol it
diverts the socket to (a relayed stream's pipe)."""

from __future__ import annotations

import asyncio

from lobes_gateway.transport.channel import READ_SIZE, Channel

from tests.support.sockets import SizedReads, waiting_tcp_pair

# Sent before the channel reads at all, so a read may take as much as it asks for.
WRITTEN = 3 * READ_SIZE


class SizedChannel(Channel):
    """A channel that notes the size of each read its socket hands it."""

    __slots__ = ("sizes",)

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def data_received(self, data: bytes) -> None:
        self.sizes.append(len(data))
        super().data_received(data)


def test_a_socket_is_read_at_most_read_size_at_a_time_by_its_channel_and_a_diverted_pipe():
    """asyncio's own 256 KiB a read would take the waiting bytes in one; each read of
    that size is an mmap, mremap and munmap of its own (channel.py, READ_SIZE)."""

    async def scenario() -> tuple[list[int], bytes, list[int]]:
        loop = asyncio.get_running_loop()
        ours, theirs = waiting_tcp_pair(b"x" * WRITTEN)
        channel = (await loop.create_connection(SizedChannel, sock=ours))[1]
        whole = await asyncio.wait_for(channel.readexactly(WRITTEN), 5)
        receiver = SizedReads()
        channel.divert(receiver)
        theirs.sendall(b"y" * WRITTEN)
        diverted = await receiver.until(WRITTEN)
        theirs.close()
        channel.close()
        return channel.sizes, whole, diverted

    channel_reads, whole, diverted_reads = asyncio.run(scenario())
    assert whole == b"x" * WRITTEN
    assert max(channel_reads) == READ_SIZE and sum(channel_reads) == WRITTEN
    assert max(diverted_reads) <= READ_SIZE and sum(diverted_reads) == WRITTEN
