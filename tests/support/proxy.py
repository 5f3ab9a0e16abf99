"""A TCP proxy a test can cut: the network between a runner and the coordinator, made unreliable.

`blackhole()` keeps accepting connections and reading requests but never forwards or answers,
which is what a partition looks like to a client: its request times out with no answer, and it
cannot tell whether the coordinator got it.
"""

from __future__ import annotations

import selectors
import socket
import threading


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def blackhole(self) -> None:
        self._cut.set()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._stop.set()
        self._server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, upstream)
        selector.register(upstream, selectors.EVENT_READ, client)
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.1):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = source.recv(65536)
                    if not data:
                        return
                    if self._cut.is_set():
                        continue  # swallowed: neither side hears anything
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            selector.close()
            client.close()
            upstream.close()
