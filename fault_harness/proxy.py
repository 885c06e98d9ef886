"""A TCP proxy on 127.0.0.1 put between a client and a real server to break the network: the
fault harness's ``drop_commit_response`` (between the cluster and the REST catalog) and the object
storage tests (``tests/sinks/iceberg/test_object_storage_faults.py``, through ``tests.support.proxy``).

It does what a load balancer, a NAT or a flaky link does to a request, on demand:

- ``refuse()``: the port stops listening (connection refused) and open connections are cut, until
  ``resume()``; the port stays the same, so clients built before keep working after.
- ``drop_response(matches)`` (HTTP mode): the next request ``matches`` accepts is forwarded to the
  server, which handles it, and its response is thrown away: the client's connection is closed
  before a byte of it arrives (or, with ``answer=``, it gets that instead, say a gateway's 504).
  This is the case a commit protocol must survive: the change landed and the client cannot know.

In HTTP mode each request goes to the server on a connection of its own, so a dropped response
never leaves the server's connection half-read; every other byte is passed on untouched. The raw
mode only pipes bytes (for S3 clients, whose requests this proxy need not understand).
Standard library only, threads, no asyncio: the clients under test are synchronous. It lives in
the harness, not under ``tests/``, because the harness must not import the tests.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

#: ``(method, path, body)`` -> whether this request's response is to be dropped.
RequestMatcher = Callable[[str, str, bytes], bool]


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    dropped: bool


class Proxy:
    def __init__(self, target_host: str, target_port: int, *, http: bool = False) -> None:
        self.target = (target_host, target_port)
        self.http = http
        self.requests: list[SeenRequest] = []
        self._lock = threading.Lock()
        self._drop: list[tuple[RequestMatcher, bytes | None]] = []
        self._connections: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = 0

    # -- control --------------------------------------------------------------------------------

    def start(self) -> Proxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name=f"proxy-{self.port}").start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def refuse(self) -> None:
        """Stop listening and cut every open connection: clients get "connection refused"."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            connections, self._connections = set(self._connections), set()
        for sock in connections:
            _close(sock)

    def resume(self) -> None:
        if self._listener is None:
            self.start()

    def stop(self) -> None:
        self.refuse()

    def drop_response(self, matches: RequestMatcher, *, answer: bytes | None = None) -> None:
        """Forward the next request ``matches`` accepts, then close the client's connection unanswered,
        or send ``answer`` (a whole HTTP response) in place of the server's."""
        if not self.http:
            raise ValueError("dropping a response needs the HTTP mode")
        with self._lock:
            self._drop.append((matches, answer))

    def dropped(self) -> list[SeenRequest]:
        with self._lock:
            return [seen for seen in self.requests if seen.dropped]

    # -- plumbing -------------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # refused or stopped
            with self._lock:
                self._connections.add(client)
            handler = self._serve_http if self.http else self._serve_raw
            threading.Thread(target=handler, args=(client,), daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._connections.add(sock)

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._connections.discard(sock)
        for sock in socks:
            _close(sock)

    def _serve_raw(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            self._forget(client)
            return
        upstream.settimeout(None)
        self._track(upstream)
        done = threading.Event()

        def pipe(source: socket.socket, sink: socket.socket) -> None:
            try:
                while chunk := source.recv(65536):
                    sink.sendall(chunk)
            except OSError:
                pass
            finally:
                done.set()

        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
        pipe(client, upstream)
        done.wait()
        self._forget(client, upstream)

    def _serve_http(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        try:
            while True:
                request = _read_request(reader)
                if request is None:
                    return
                head, body = request
                method, path = _request_line(head)
                with self._lock:
                    rule = next((r for r in self._drop if r[0](method, path, body)), None)
                    if rule is not None:
                        self._drop.remove(rule)
                response = self._forward(_close_after(head) + body)
                with self._lock:
                    if rule is not None and response is None:
                        # The server never had it (down): not the lost response that was asked for,
                        # so the rule waits for the next such request.
                        self._drop.insert(0, rule)
                        rule = None
                    self.requests.append(SeenRequest(method, path, rule is not None))
                if rule is not None and rule[1] is not None:
                    client.sendall(rule[1])
                    return
                if rule is not None or response is None:
                    return  # the server handled it (or was unreachable): the client hears nothing
                client.sendall(response)
        except (OSError, ValueError):  # cut by refuse(), or a request this proxy cannot read
            return
        finally:
            reader.close()
            self._forget(client)

    def _forward(self, request: bytes) -> bytes | None:
        """The server's whole response (it closes the connection after it), or ``None`` unreachable."""
        try:
            upstream = socket.create_connection(self.target, timeout=30)
        except OSError:
            return None
        self._track(upstream)
        try:
            upstream.sendall(request)
            chunks = []
            while chunk := upstream.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)
        except OSError:
            return None
        finally:
            self._forget(upstream)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def _read_request(reader: BinaryIO) -> tuple[bytes, bytes] | None:
    """One HTTP/1.1 request: its head (through the blank line) and its body (``Content-Length``)."""
    lines: list[bytes] = []
    while True:
        line = reader.readline(65537)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            if not lines:
                continue  # stray CRLF between requests
            lines.append(line)
            break
        lines.append(line)
    head = b"".join(lines)
    length = 0
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
        if name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
            raise OSError("chunked request bodies are not supported by this proxy")
    body = reader.read(length) if length else b""
    return head, body


def _request_line(head: bytes) -> tuple[str, str]:
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    return (parts[0], parts[1]) if len(parts) >= 2 else ("", "")


def _close_after(head: bytes) -> bytes:
    """The head with ``Connection: close``: the server ends its response by closing."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    kept = [line for line in lines if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n"
