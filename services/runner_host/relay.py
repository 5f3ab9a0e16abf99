"""A TCP relay on the host end of a child's veth, so a child in its own namespace can reach the
API and the effect gateway (which usually listen on the host's loopback, out of its reach).

The child is given `http://<host end>:<relay port>` instead of the real URL; every connection it
opens there is relayed, byte for byte, to the real address. The relay lives on the host side of
the link, so severing the link cuts the child off from these too (QUA-1), and the relay is the
only way out: the namespace has no other route anywhere.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import socketserver
import threading
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Relay"]

log = logging.getLogger("tenure.runner_host")
_CHUNK = 65536
_CONNECT_TIMEOUT_S = 10.0


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    upstream: tuple[str, int]


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        client: socket.socket = self.request
        try:
            upstream = socket.create_connection(self.server.upstream, timeout=_CONNECT_TIMEOUT_S)
        except OSError as exc:
            log.warning("relay to %s:%d refused a connection: %s", *self.server.upstream, exc)
            return
        upstream.settimeout(None)
        with upstream, selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ, upstream)
            selector.register(upstream, selectors.EVENT_READ, client)
            open_ends = 2
            while open_ends:
                for key, _ in selector.select():
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    target: socket.socket = key.data
                    try:
                        data = source.recv(_CHUNK)
                    except OSError:
                        data = b""
                    if data:
                        try:
                            target.sendall(data)
                            continue
                        except OSError:
                            return
                    # One side finished: pass the half-close on, stop reading that side.
                    selector.unregister(source)
                    open_ends -= 1
                    with contextlib.suppress(OSError):
                        target.shutdown(socket.SHUT_WR)


class Relay:
    """Relays `bind_host:<free port>` to the host and port of `upstream_url`."""

    def __init__(self, bind_host: str, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        if parts.hostname is None:
            raise ValueError(f"relay: {upstream_url!r} names no host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._parts = parts
        self._server = _Server((bind_host, 0), _Handler)
        self._server.upstream = (parts.hostname, port)
        self.bind_host = bind_host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="tenure-relay", daemon=True
        )

    @property
    def url(self) -> str:
        """`upstream_url` with its host and port replaced by this relay's."""
        return urlunsplit(self._parts._replace(netloc=f"{self.bind_host}:{self.port}"))

    def start(self) -> Relay:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
