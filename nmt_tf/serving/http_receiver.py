"""Reads HTTP requests whole, for many connections at once, on one thread.

nmt_tf.serving.rest answers a request on one of a few worker threads. Had a worker
read the request itself, a client that sends its headers one line every few
seconds (or connects and sends nothing) would hold that worker for as long
as it likes, and a handful of such clients would stop the REST API for
everyone. So the `Receiver` reads every connection's request without
blocking (one selector loop) and hands a connection to a worker only when
the worker can answer without waiting for the client:

- the headers are complete and the body (by its Content-Length) too; or
- the headers alone decide the answer (chunked encoding: 411; a missing,
  malformed, conflicting or too large Content-Length: 400 or 413);
- the headers are over `max_header_bytes` (the handler answers 431).

A request must arrive within deadlines counted from the connection
(`header_seconds`) and from the end of its headers (`body_seconds`);
otherwise the client gets 408 and the connection is closed. With "Expect:
100-continue" and a body the server will take, the receiver sends the
"100 Continue" itself. What it has read is given to the worker's handler
with the connection (`Prefetched`); the handler reads it as if from the
socket, then the socket itself (a refused body is drained from there).
"""

from __future__ import annotations

import io
import json
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

_HEADER_END = (b"\r\n\r\n", b"\n\n")


@dataclass
class _Pending:
    sock: socket.socket
    address: tuple
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    needed: int | None = None          # bytes of headers + body, once the headers are read
    continued: bool = False            # "100 Continue" sent
    handshaking: bool = False          # a TLS connection before its handshake is done


@dataclass
class Prefetched:
    data: bytearray                     # what the receiver read of the request (not copied)
    continued: bool                     # it answered "Expect: 100-continue"


def _header_end(data: bytearray) -> int | None:
    """Index just past the blank line that ends the headers, or None."""
    ends = [data.find(mark) + len(mark) for mark in _HEADER_END if data.find(mark) >= 0]
    return min(ends) if ends else None


def _framing(headers: bytes) -> tuple[int | None, bool]:
    """(Content-Length, Expect: 100-continue) of a header block; Content-Length
    None when the handler must decide from the headers alone (chunked, missing
    with other framing, malformed or conflicting values)."""
    lengths, chunked, expect = set(), False, False
    for line in headers.split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            lengths.add(value)
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"expect":
            expect = value.lower() == b"100-continue"
    if chunked or len(lengths) > 1:
        return None, expect
    value = lengths.pop() if lengths else b"0"
    return (int(value) if value.isdigit() else None), expect


def error_reply(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP response with TF Serving's JSON error body, closing the connection."""
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nServer: nmt_tf.serve\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class Receiver:
    """The selector loop; `add` a connection, `deliver(sock, address,
    Prefetched)` is called (on the loop's thread) when a request is ready, and
    `closed(sock)` when the receiver closed a connection itself (the client
    left, or a deadline passed)."""

    def __init__(self, deliver, closed, max_body_bytes: int, header_seconds: float = 30.0,
                 body_seconds: float = 120.0, max_header_bytes: int = 1 << 16):
        self.deliver, self.closed, self.max_body_bytes = deliver, closed, max_body_bytes
        self.header_seconds, self.body_seconds, self.max_header_bytes = header_seconds, body_seconds, max_header_bytes
        self._selector = selectors.DefaultSelector()
        self._new: list[_Pending] | None = []      # None once stopped
        self._lock = threading.Lock()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rest-api-receiver")
        self._thread.start()

    def add(self, sock: socket.socket, address) -> None:
        """A new connection; an ssl.SSLSocket wrapped with
        do_handshake_on_connect=False has its handshake done here, without
        blocking, within the header deadline."""
        sock.setblocking(False)
        item = _Pending(sock, address, time.monotonic() + self.header_seconds,
                        handshaking=isinstance(sock, ssl.SSLSocket))
        with self._lock:
            stopped = self._new is None
            if not stopped:
                self._new.append(item)
        if stopped:                # nobody would ever read it
            self._end(item)
        else:
            self._wake()

    def _end(self, item: _Pending, reply: bytes | None = None) -> None:
        """Closes a connection the receiver holds (after `reply`, if any) and reports it closed."""
        try:
            if reply:
                item.sock.send(reply)           # small: fits the socket buffer, or is cut
            item.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        item.sock.close()
        self.closed(item.sock)

    def _wake(self):
        try:
            self._wake_write.send(b"\0")
        except OSError:       # the buffer is full: the loop is awake anyway
            pass

    def stop(self) -> None:
        self._closing.set()
        self._wake()
        self._thread.join(timeout=5)

    def _loop(self):
        pending: dict[int, _Pending] = {}
        while not self._closing.is_set():
            with self._lock:
                new, self._new = self._new, []
            for item in new:
                pending[item.sock.fileno()] = item
                self._selector.register(item.sock, selectors.EVENT_READ, item)
            for key, _ in self._selector.select(timeout=0.25):
                if key.data is None:
                    try:
                        self._wake_read.recv(4096)
                    except OSError:
                        pass
                    continue
                self._read(key.data, pending)
            now = time.monotonic()
            for item in [p for p in pending.values() if p.deadline < now]:
                what = "headers" if item.needed is None else "body"
                seconds = self.header_seconds if item.needed is None else self.body_seconds
                self._close(item, pending, error_reply(408, "Request Timeout",
                                                       f"Request Timeout: the request {what} took more than "
                                                       f"{seconds:g} s"))
        with self._lock:          # connections added since the last turn, and none from now on
            new, self._new = self._new, None
        for item in new:
            self._end(item)
        for item in list(pending.values()):
            self._close(item, pending)
        self._selector.close()
        self._wake_read.close()
        self._wake_write.close()

    def _handshake(self, item: _Pending, pending: dict) -> bool:
        """Goes on with a TLS handshake; True once it is done."""
        try:
            item.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(item.sock, selectors.EVENT_READ, item)
            return False
        except ssl.SSLWantWriteError:
            self._selector.modify(item.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, item)
            return False
        except OSError:                 # not TLS, a refused certificate, or the client left
            self._close(item, pending)
            return False
        item.handshaking = False
        self._selector.modify(item.sock, selectors.EVENT_READ, item)
        return True

    def _read(self, item: _Pending, pending: dict) -> None:
        if item.handshaking and not self._handshake(item, pending):
            return
        try:
            chunk = item.sock.recv(1 << 16)
            # TLS: bytes already decrypted wait in the SSL object, not in the socket
            while isinstance(item.sock, ssl.SSLSocket) and item.sock.pending():
                chunk += item.sock.recv(item.sock.pending())
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            chunk = b""
        if not chunk:                   # the client closed (or reset) before its request was whole
            self._close(item, pending)
            return
        item.data += chunk
        if item.needed is None:
            end = _header_end(item.data)
            if end is None:
                if len(item.data) > self.max_header_bytes:
                    self._hand_over(item, pending)          # the handler answers "too long"
                return
            length, expect = _framing(bytes(item.data[:end]))
            if length is None or length > self.max_body_bytes:
                self._hand_over(item, pending)              # refused from the headers alone
                return
            item.needed, item.deadline = end + length, time.monotonic() + self.body_seconds
            if expect and length and len(item.data) < item.needed:
                try:
                    item.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
                    item.continued = True
                except OSError:
                    pass
        if len(item.data) >= item.needed:
            self._hand_over(item, pending)

    def _hand_over(self, item: _Pending, pending: dict) -> None:
        self._selector.unregister(item.sock)
        del pending[item.sock.fileno()]
        item.sock.setblocking(True)
        data, item.data = item.data, bytearray()
        self.deliver(item.sock, item.address, Prefetched(data, item.continued))

    def _close(self, item: _Pending, pending: dict, reply: bytes | None = None) -> None:
        self._selector.unregister(item.sock)
        del pending[item.sock.fileno()]
        self._end(item, reply)


class PrefetchedReader(io.RawIOBase):
    """What the receiver read, then the socket's own reader (for a handler's rfile)."""

    def __init__(self, data: bytearray, rest):
        self._data, self._rest = memoryview(data), rest

    def readable(self):
        return True

    def readinto(self, buffer) -> int:
        if self._data:
            n = min(len(buffer), len(self._data))
            buffer[:n] = self._data[:n]
            self._data = self._data[n:]
            return n
        chunk = self._rest.read1(len(buffer))
        buffer[:len(chunk)] = chunk
        return len(chunk)
