"""The relay's answer handed to mitmproxy in-process instead of through the loopback socket.

mitmproxy reads the relay's answer from a socket in its own process.  Every
frame through that socket costs a `send`, a `recv` and a wake-up in the kernel,
plus asyncio's transport work at both ends, for every frame of every stream
(see docs/architecture.md, "Speed").  So the relay connection still carries
the request, and still ends when mitmproxy or the relay ends it, but the
answer's bytes are fed straight to the `asyncio.StreamReader` mitmproxy reads
that very connection with.
mitmproxy sees the same bytes in the same order; it just gets them sooner.

Why it is safe:
- One exchange's answer goes all one way, chosen before its first byte.
  mitmproxy never pipelines on a connection to a server: it sends the next
  request only once it has read the previous answer to its end, so whichever
  way that answer went, nothing of it is still on its way when the next one
  starts, and nothing can overtake anything.
- The reader's own flow control stays in charge.  Past twice its limit the
  reader pauses the transport it reads from (asyncio's rule, and mitmproxy
  opens the connection with asyncio's default limit); `write` sees that and
  holds the upstream answer until mitmproxy has read again.
- A cut still closes the relay connection: what was fed is in the reader
  already, ahead of the end mitmproxy then reads, as on the socket.
- mitmproxy closing the connection (its client left) is seen at once: writes
  stop, and the relay's task is cancelled as before.

`connect` refuses (and the socket is used) unless the reader and writer are
asyncio's own and belong to this connection: it reads mitmproxy's internals
(see relay/mitmproxy_reader.py), so anything unexpected falls back.

Straight to the client.  Even in-process, every relayed frame still costs
mitmproxy a task wake-up, its chunked reader, its layers and its writer: per
frame, most of what plain mitmdump spends on a frame, on top of Switchyard's own
reading of it.  Once mitmproxy has sent the client the head and every body byte
fed to it, the body's chunks go to the client's own transport instead, as the
very bytes mitmproxy would write (its HTTP/1 chunk framing is the relay's), and
mitmproxy is fed only the end, which it passes on and ends the flow with.
"Sent" is counted, not guessed from mitmproxy's reader: the Router's display
copy, the flow's stream callback, sees each body byte just before mitmproxy
writes it to the client, so the switch waits until it has seen as many as
were fed.  (An empty reader is not enough: mitmproxy's task may hold bytes it
has read while it waits to process them, and those would be overtaken.)  Only
where that is byte for byte the same (`ClientEnd`: a plain-TCP HTTP/1.1 client
with a chunked answer whose stream callback is still the Router's display copy,
see relay/mitmproxy_reader.py); the display copy gets each chunk, and
mitmproxy's inactivity watchdog each write, as if mitmproxy had passed it on.
The client's flow control takes over from mitmproxy's: past the transport's
high-water mark the answer is held until the client has taken it down to the
low one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NamedTuple

from ..upstreams.body import Body

# while mitmproxy is not reading: how soon to look again, then less and less often
# (a client that stopped reading for good must not keep the loop busy)
FIRST_LOOK_S = 0.005
LAST_LOOK_S = 0.1


class ClientEnd(NamedTuple):
    """Where a flow's body can go without mitmproxy (see above)."""

    transport: asyncio.Transport  # mitmproxy's transport to the client
    activity: Callable[[], None]  # mitmproxy's inactivity watchdog: the connection is in use
    display: Callable[[bytes], object]  # the flow's display copy (what mitmweb shows)


# given how many body bytes were fed to mitmproxy: the client's end, once mitmproxy has sent them all
FindClient = Callable[[int], "ClientEnd | None"]


class DirectLine:
    __slots__ = ("_reader", "_transport", "_producer", "_holding", "_poll", "_wait", "_cut", "client", "_low", "_high")

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.Transport) -> None:
        self._reader = reader
        self._transport = transport  # mitmproxy's end of the relay connection
        self._producer: Body | None = None
        self._holding = False
        self._poll: asyncio.TimerHandle | None = None
        self._wait = FIRST_LOOK_S
        self._cut = False
        self.client: ClientEnd | None = None  # once the body goes straight to the client
        self._low = self._high = 0  # the client transport's write-buffer limits

    @classmethod
    def connect(cls, streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
                ours: asyncio.Transport) -> "DirectLine | None":
        """A line to the reader of mitmproxy's end of `ours`, or None (use the socket)."""
        if streams is None:
            return None
        reader, writer = streams
        if not isinstance(reader, asyncio.StreamReader) or not isinstance(writer, asyncio.StreamWriter):
            return None
        theirs = writer.transport
        if not isinstance(theirs, asyncio.Transport):  # it must say whether mitmproxy is reading
            return None
        if (theirs.is_closing() or reader.at_eof() or reader.exception() is not None
                or ours.get_write_buffer_size()
                or writer.get_extra_info("sockname") != ours.get_extra_info("peername")
                or writer.get_extra_info("peername") != ours.get_extra_info("sockname")):
            return None
        return cls(reader, theirs)

    def write(self, data: bytes) -> None:
        if self._cut or self._transport.is_closing():
            return  # mitmproxy let go of the connection: its client left
        try:
            self._reader.feed_data(data)
        except AssertionError:  # the reader had ended (it asserts): nobody reads this any more
            self.cut()
            return
        if not self._holding and not self._transport.is_reading():
            self._hold()

    def reach_client(self, find: FindClient | None, fed: int) -> bool:
        """Whether the body can go straight to the client from now on (see above):
        only once mitmproxy has sent all `fed` body bytes on (some: then it has sent the
        head too), and is reading."""
        if not fed or find is None or self._cut or self._holding or self._transport.is_closing():
            return False
        client = find(fed)
        if client is None or client.transport.is_closing():
            return False
        self.client = client
        self._low, self._high = client.transport.get_write_buffer_limits()
        return True

    def to_client(self, data: bytes) -> None:
        """One chunk of the body, as mitmproxy would have written it."""
        client = self.client
        assert client is not None
        transport = client.transport
        if self._cut or transport.is_closing():
            return  # the client left: mitmproxy ends the flow and the relay connection
        transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        client.display(data)
        client.activity()
        if not self._holding and transport.get_write_buffer_size() > self._high:
            self._hold()

    def pace(self, producer: Body | None) -> None:
        """The answer to hold while mitmproxy is not reading."""
        if self._producer is not None and self._producer is not producer and self._holding:
            self._producer.hold(False)
        self._producer = producer
        if producer is not None and self._holding:
            producer.hold(True)

    def cut(self) -> None:
        """The answer is cut (the relay closes the connection): nothing more goes."""
        self._cut = True
        self.close()

    def close(self) -> None:
        """The exchange is over: stop watching (the connection itself goes on)."""
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        if self._holding and self._producer is not None:
            self._producer.hold(False)
        self._holding = False
        self._producer = None

    def _hold(self) -> None:
        self._holding = True
        if self._producer is not None:
            self._producer.hold(True)
        self._wait = FIRST_LOOK_S
        self._poll = asyncio.get_running_loop().call_later(self._wait, self._look_again)

    def _blocked(self) -> bool:
        """Whoever takes the answer now cannot take more yet."""
        client = self.client
        if client is not None:
            return not client.transport.is_closing() and client.transport.get_write_buffer_size() > self._low
        return not self._transport.is_reading()

    def _look_again(self) -> None:
        self._poll = None
        if not self._blocked() or self._transport.is_closing():
            self._holding = False
            if self._producer is not None:
                self._producer.hold(False)
            return
        self._wait = min(self._wait * 2, LAST_LOOK_S)
        self._poll = asyncio.get_running_loop().call_later(self._wait, self._look_again)
