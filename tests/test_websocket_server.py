"""The client's WebSocket as the relay serves it (`ClientSocket`), on a transport
that records what is written: which close the client reads for each way the
upstream side ended."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from wsproto.frame_protocol import CloseReason, FrameProtocol, Opcode

from switchyard_core.relay.websocket_server import BROKE, ClientSocket


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        pass

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def close_read_by_the_client(code: int, reason: str) -> tuple[int, str]:
    transport = Recording()
    socket = ClientSocket("responses-ws", lambda message: None, lambda code, reason: None, lambda: None)
    socket.take_over(transport, "dGhlIHNhbXBsZSBub25jZQ==")
    socket.close(code, reason)
    head, _, frames = bytes(transport.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    reader = FrameProtocol(client=True, extensions=[])
    reader.receive_bytes(frames)
    (frame,) = list(reader.received_frames())
    assert frame.opcode is Opcode.CLOSE and transport.closed
    return frame.payload


@pytest.mark.parametrize(("code", "reason"), [(1000, ""), (1001, "going away"), (4000, "custom")])
def test_an_upstreams_close_reaches_the_client_with_its_code_and_reason(code: int, reason: str) -> None:
    assert close_read_by_the_client(code, reason) == (code, reason)


def test_an_upstreams_close_without_a_code_reaches_the_client_without_one_a_clean_end() -> None:
    assert close_read_by_the_client(1005, "") == (CloseReason.NO_STATUS_RCVD, "")


@pytest.mark.parametrize("code", [1006, 1015])
def test_a_broken_upstream_connection_reaches_the_client_as_1011_with_the_reason(code: int) -> None:
    assert close_read_by_the_client(code, "reset by peer") == (BROKE, "reset by peer")
