"""The relay's answer handed to mitmproxy in-process instead of through the loopback socket.

mitmproxy reads the relay's answer from a socket in its own process.  Every
frame through that socket costs a `send`, a `recv` and a wake-up in the kernel,
plus asyncio's transport work at both ends: at concurrency 50 that was about a
tenth of plain mitmdump's whole CPU per stream (issue 6: 1.31x → 1.20x of
plain).  So the relay connection still carries the request, and still ends
when mitmproxy or the relay ends it, but the answer's bytes are fed straight
to the `asyncio.StreamReader` mitmproxy reads that very connection with.
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
"""

from __future__ import annotations

import asyncio

from ..upstreams.body import Body

# while mitmproxy is not reading: how soon to look again, then less and less often
# (a client that stopped reading for good must not keep the loop busy)
FIRST_LOOK_S = 0.005
LAST_LOOK_S = 0.1


class DirectLine:
    __slots__ = ("_reader", "_transport", "_producer", "_holding", "_poll", "_wait", "_cut")

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.Transport) -> None:
        self._reader = reader
        self._transport = transport  # mitmproxy's end of the relay connection
        self._producer: Body | None = None
        self._holding = False
        self._poll: asyncio.TimerHandle | None = None
        self._wait = FIRST_LOOK_S
        self._cut = False

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

    def _look_again(self) -> None:
        self._poll = None
        if self._transport.is_reading() or self._transport.is_closing():
            self._holding = False
            if self._producer is not None:
                self._producer.hold(False)
            return
        self._wait = min(self._wait * 2, LAST_LOOK_S)
        self._poll = asyncio.get_running_loop().call_later(self._wait, self._look_again)
