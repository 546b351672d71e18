"""A loopback HTTP proxy that only tunnels: it records each CONNECT's head, answers
200 and then carries bytes both ways (what an upstream proxy does for https)."""

from __future__ import annotations

import socket
import threading
from typing import Self

WAIT_S = 10.0  # the bound on every read


class TunnelProxy:
    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._thread.join(WAIT_S)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(WAIT_S)
        with client:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                data = client.recv(4096)
                if not data:
                    return
                head += data
            self.heads.append(head)
            target = head.split(b" ", 2)[1].decode()
            host, _, port = target.rpartition(":")
            with socket.create_connection((host.strip("[]"), int(port)), timeout=WAIT_S) as upstream:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                carry = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
                carry.start()
                _pipe(client, upstream)
                carry.join(WAIT_S)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass
