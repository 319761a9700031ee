"""The HTTP server under the REST API and the translation page: aiohttp's.

aiohttp parses every request (its C parser is llhttp, Node.js's: it refuses
conflicting or malformed Content-Length, Content-Length beside
Transfer-Encoding and the like with 400, which this server writes as
TF Serving's JSON error). This module puts what a server reachable by anyone
needs around it, and hands each whole request to `answer` on a fixed pool of
`threads` worker threads:

- At most `max_connections` connections are open at once (being read,
  waiting for a worker, or answered), and at most `max_connections_per_client`
  from one client address. One more is answered 503 at once; over TLS it is
  closed at once, before any handshake.
- A request's headers must arrive within `header_seconds` of the connection
  (a TLS handshake included) and its body within `body_seconds` of the
  headers; otherwise 408 and the connection is closed.
- A body needs a Content-Length within the limit. A larger one gets 413 from
  the headers alone (before "100 Continue"); a chunked one gets 411. A refused
  body is read and dropped for a few seconds after the answer (aiohttp's
  lingering close), so a client still sending it reads the answer.
- One request per connection, answered and closed, so an idle keep-alive
  connection holds no slot; a client that does not read its answer within
  `reply_seconds` is cut off.

Waiting clients cost a socket and a few kB, never a thread: every
connection is read on one asyncio loop, on a thread of its own.

Why aiohttp rather than uvicorn with starlette: it is the parser and the
server in one package, and it runs on an event loop this module owns in a
thread, beside the gRPC server and the model in the same process. Its
low-level `web.Server` is the asyncio protocol of a connection, so the
connection limits and the header deadline sit in front of it with public
asyncio calls. uvicorn wants to own the process's loop and signals, and
would add starlette and h11 or httptools for the same requests.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import json
import socket
import threading
import urllib.parse

from absl import logging
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError

from nmt_tf.serving.page import PAGE_HEADERS

SERVER_NAME = "nmt_tf.serve"
# The methods answered (PUT, DELETE, PATCH and OPTIONS by the REST API's "Malformed request"); another is 501.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
_UNSUPPORTED = "Unsupported method: this server answers GET, HEAD and POST"
# Seconds a refused body is read and dropped after its answer, before the connection closes.
_LINGER_SECONDS = 5.0
# Seconds a connection refused over the limits is read (and dropped) after its 503.
_REFUSED_LINGER_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class RestSettings:
    """Where the REST API listens and what its clients may hold (nmt_tf.serve's
    --rest_* flags; ServerConfig gives them to nmt_tf.serving.server.start)."""
    port: int = 0                       # 0: a free port (then RestServer.port)
    host: str = "0.0.0.0"
    threads: int = 8                    # workers answering requests
    max_message_mb: float = 32.0        # the largest request body
    max_batch_size: int = 1024          # the most sentences of one request
    page: bool = True                   # the translation page at /
    max_connections: int = 64
    max_connections_per_client: int | None = None      # None: as max_connections
    header_seconds: float = 30.0
    body_seconds: float = 120.0
    reply_seconds: float = 120.0        # for the client to read its answer (then the connection is cut)
    allowed_hosts: tuple[str, ...] = ()  # the Host names answered (empty: any); see RestServer._misdirected

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_message_mb * 1024 * 1024)


def error_json(message: str) -> bytes:
    """TF Serving's REST error body: {"error": message}."""
    return json.dumps({"error": message}).encode()


def error_reply(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP response with TF Serving's JSON error body, closing the
    connection: the two answers written before any request is read (503 to a
    connection over the limits, 408 past the header deadline)."""
    body = error_json(message)
    return (f"HTTP/1.1 {status} {reason}\r\nServer: {SERVER_NAME}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def host_name(host: str) -> str:
    """A Host header's name without its port, lowercased ("[::1]:8501" -> "[::1]")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[:host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if ":" in host else host


def _response(status: int, payload: bytes, content_type: str = "application/json", headers=None) -> web.Response:
    response = web.Response(status=status, body=payload, headers={
        "Server": SERVER_NAME, "Content-Type": content_type, **(headers or {})})
    response.force_close()
    return response


async def _before_unread_body(request, response: web.Response) -> web.Response:
    """Sends the answer to a request whose body this server will not read,
    then (over plain TCP) ends its side of the connection, so that a client
    still sending learns at once that the answer is whole; aiohttp then reads
    and drops what the client still sends, for at most _LINGER_SECONDS."""
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:         # the client left: aiohttp drops the connection
        return response
    transport = request.transport
    if transport is not None and transport.can_write_eof() and not transport.is_closing():
        transport.write_eof()
    return response


class _JsonErrors(web.RequestHandler):
    """aiohttp's request handler, whose answer to a request it cannot parse is
    TF Serving's JSON error (aiohttp's own is text, logged with a traceback)."""

    def handle_error(self, request, status=500, exc=None, message=None):
        reason = (message or "").split("\n", 1)[0].rstrip(": ") or "the request could not be read"
        logging.debug(f"REST request from {request.remote} refused: {reason}")
        if isinstance(exc, BadHttpMethod):
            return _response(501, error_json(_UNSUPPORTED))
        if status == 500:
            return _response(500, error_json(f"{type(exc).__name__}: {exc}" if exc else "Internal Server Error"))
        return _response(status, error_json(f"Bad Request: {reason}"))


class _Connection(asyncio.Protocol):
    """One client connection: counted in (or refused) as it opens, then its
    TLS handshake, then aiohttp's request handler; counted out as it closes."""

    def __init__(self, server: RestServer):
        self.server = server
        self.client: str | None = None          # its address, while it is counted
        self.transport = None                   # the socket's
        self.http = None                        # aiohttp's handler, once admitted (over TLS: after the handshake)
        self.http_transport = None              # what it writes to (TLS: the handshake's)
        self.answering = False                  # its request's headers are in
        self.refusing = False                   # over the limits: answered 503, closing
        self._early: list = []                  # data (or EOF: None) from before the handler was made
        self._deadline = None

    def connection_made(self, transport):
        self.transport = transport
        client = (transport.get_extra_info("peername") or ("?",))[0]
        refused = self.server.admit(client)
        if refused is not None:
            if self.server.ssl_context is not None:
                transport.abort()
                return
            # Answered, then what the client sent is read and dropped until it closes or for at most
            # _REFUSED_LINGER_SECONDS: closed with its request unread, the socket would be reset and the
            # client might never read the answer.
            self.refusing = True
            transport.write(error_reply(503, "Service Unavailable", f"Service Unavailable: {refused}; try again"))
            transport.write_eof()
            self.server.loop.call_later(_REFUSED_LINGER_SECONDS, transport.close)
            return
        self.client = client
        self.server.connections.add(self)
        self._deadline = self.server.loop.call_later(self.server.settings.header_seconds, self._headers_late)
        if self.server.ssl_context is None:
            self._hand_to_http(transport)
        else:
            transport.pause_reading()
            self.server.loop.create_task(self._handshake())

    async def _handshake(self):
        try:
            secure = await self.server.loop.start_tls(self.transport, self, self.server.ssl_context, server_side=True,
                                                      ssl_handshake_timeout=self.server.settings.header_seconds)
        except Exception as e:         # not TLS, a refused certificate, the client left, or too slow
            logging.debug(f"REST TLS handshake with {self.client} failed: {type(e).__name__}: {e}")
            secure = None
        if secure is None:
            self.transport.abort()
            self._count_out()
            return
        self._hand_to_http(secure)

    def _hand_to_http(self, transport):
        self.http_transport = transport
        self.http = _JsonErrors(self.server.http, loop=self.server.loop, lingering_time=_LINGER_SECONDS)
        self.server.connection_of[self.http] = self
        self.http.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            if data is None:
                self.http.eof_received()
            else:
                self.http.data_received(data)

    def headers_in(self):
        """Its request is being answered: the header deadline no longer applies."""
        self.answering = True
        if self._deadline is not None:
            self._deadline.cancel()

    def answered(self):
        """Its answer is made: the client has reply_seconds to read it (a
        client that never reads a large answer would hold its slot for ever)."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.server.loop.call_later(self.server.settings.reply_seconds, self.transport.abort)

    def _headers_late(self):
        if self.answering:
            return
        if self.http_transport is None or self.http_transport.is_closing():     # still in its TLS handshake
            self.transport.abort()
            return
        seconds = self.server.settings.header_seconds
        self.http_transport.write(error_reply(
            408, "Request Timeout", f"Request Timeout: the request headers took more than {seconds:g} s"))
        self.http_transport.close()

    def data_received(self, data):
        if self.refusing:
            return
        if self.http is None:           # decrypted before start_tls returned
            self._early.append(data)
        else:
            self.http.data_received(data)

    def eof_received(self):
        if self.refusing:
            return False                # closes the connection
        if self.http is None:
            self._early.append(None)
            return None
        return self.http.eof_received()

    def pause_writing(self):
        if self.http is not None:
            self.http.pause_writing()

    def resume_writing(self):
        if self.http is not None:
            self.http.resume_writing()

    def connection_lost(self, exc):
        if self._deadline is not None:
            self._deadline.cancel()
        if self.http is not None:
            self.server.connection_of.pop(self.http, None)
            self.http.connection_lost(exc)
        self._count_out()

    def _count_out(self):
        if self.client is not None:
            self.server.connections.discard(self)
            self.server.release(self.client)
            self.client = None


class RestServer:
    """An HTTP server for `answer(method, path, body, client=address) ->
    (status, JSON body)`, the REST API's, and `page(method, path) -> (body,
    Content-Type) or None`, the translation page's; with an `ssl_context`
    (nmt_tf.serving.tls) it speaks HTTPS. It listens from construction (an
    OSError if it cannot) and serves from threads of its own; stop() ends it.
    The module's docstring says what it limits and why."""

    def __init__(self, settings: RestSettings, answer, page=None, ssl_context=None):
        self.settings, self.answer, self.page, self.ssl_context = settings, answer, page, ssl_context
        self.max_body_bytes = settings.max_body_bytes
        self.max_connections_per_client = settings.max_connections_per_client or settings.max_connections
        self.allowed_hosts = frozenset(host_name(h) for h in settings.allowed_hosts if h.strip())    # empty: any
        self._per_client: collections.Counter = collections.Counter()      # client address -> connections open
        self._connections = 0
        self.connections: set[_Connection] = set()      # those counted in
        self.connection_of: dict = {}          # aiohttp's handler -> its _Connection
        sock = self._listen(settings.host, settings.port)
        self.port = sock.getsockname()[1]
        self._workers = concurrent.futures.ThreadPoolExecutor(settings.threads, thread_name_prefix="rest-api")
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="rest-api-http")
        self._thread.start()
        self._stopped = False
        try:
            self._call(self._open(sock))
        except BaseException:
            sock.close()
            self.stop()
            raise

    @staticmethod
    def _listen(host: str, port: int) -> socket.socket:
        host = host.strip("[]")                 # "[::]" as gRPC's address is written, "::" as a socket's
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            # rebind at once after a restart (TIME_WAIT); a port another process listens on is still refused
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(socket.SOMAXCONN)
        except OSError:
            sock.close()
            raise
        return sock

    def _call(self, coroutine, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _open(self, sock):
        self.http = web.Server(self._handle)
        self._listener = await self.loop.create_server(lambda: _Connection(self), sock=sock)

    def admit(self, client: str) -> str | None:
        """Counts a new connection of `client` in, or says why it is refused."""
        if self._stopped:
            return "this server is stopping"
        if self._connections >= self.settings.max_connections:
            return (f"this server has {self.settings.max_connections} connections open, its limit "
                    "(--rest_max_connections)")
        if self._per_client[client] >= self.max_connections_per_client:
            return (f"this client address has {self.max_connections_per_client} connections open, this "
                    "server's limit per client (--rest_max_connections_per_client)")
        self._connections += 1
        self._per_client[client] += 1
        return None

    def release(self, client: str) -> None:
        self._connections -= 1
        self._per_client[client] -= 1
        if self._per_client[client] <= 0:
            del self._per_client[client]

    @property
    def open_connections(self) -> int:
        """Connections being read, waiting for a worker or answered."""
        return self._connections

    def _misdirected(self, request) -> bytes | None:
        """The error for a request this server will not answer whatever it
        asks: a Host that is not one of --rest_allowed_hosts (when given: a
        page of another site pointing its name at this server, DNS
        rebinding), or a request other than GET / HEAD sent by a page of
        another origin (its Origin header is not this Host: another site's
        page posting text/plain translations, which a browser sends without
        asking). Clients that are not browsers send no Origin."""
        host = (request.headers.get("Host") or "").strip()
        if self.allowed_hosts and host_name(host) not in self.allowed_hosts:
            return error_json(f"Forbidden: the Host {host[:100]!r} is not one of this server's names "
                              "(--rest_allowed_hosts)")
        origin = request.headers.get("Origin")
        if origin is not None and request.method not in ("GET", "HEAD"):
            if origin.strip() == "null" or urllib.parse.urlsplit(origin.strip()).netloc.lower() != host.lower():
                return error_json(f"Forbidden: a request from a page of another origin ({origin[:100]!r}); this "
                                  "server answers its own page and clients that are not browsers")
        return None

    def _refused_body(self, request) -> web.Response | None:
        """The answer to a body this server will not read, from its headers alone."""
        limit = self.max_body_bytes
        if "Transfer-Encoding" in request.headers:
            return _response(411, error_json("Length Required: send the request body with a Content-Length header "
                                             "(chunked transfer encoding is not accepted)"))
        declared = request.content_length or 0
        if declared > limit:
            return _response(413, error_json(
                f"Request Entity Too Large: the request body is {declared} bytes, more than this server's "
                f"limit of {limit} bytes (--max_message_mb={limit / 2**20:g})"))
        return None

    async def _read_body(self, request, length: int) -> bytearray | web.Response:
        """The body, read into one buffer of its length (no chunks joined), or
        the answer when the client took longer than body_seconds (408) or
        left before the end."""
        if length and request.headers.get("Expect", "").strip().lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = bytearray(length)
        view, done = memoryview(body), 0
        seconds = self.settings.body_seconds
        try:
            async with asyncio.timeout(seconds):
                while done < length:
                    chunk = await request.content.readany()
                    if not chunk:
                        return _response(400, error_json("Bad Request: the body ended before its Content-Length"))
                    view[done:done + len(chunk)] = chunk
                    done += len(chunk)
        except TimeoutError:
            return _response(408, error_json(f"Request Timeout: the body took more than {seconds:g} s"))
        except (ConnectionError, HttpProcessingError) as e:        # the client left, or sent a broken body
            return _response(400, error_json(f"Bad Request: the body could not be read ({e})"))
        return body

    async def _handle(self, request) -> web.Response:
        connection = self.connection_of.get(request.protocol)
        if connection is not None:
            connection.headers_in()
        client = connection.client if connection is not None else (request.remote or "")
        try:
            return await self._respond(request, client)
        except Exception as e:       # never let one request take the server down
            logging.exception("REST request failed")
            return _response(500, error_json(f"{type(e).__name__}: {e}"))
        finally:
            if connection is not None:
                connection.answered()

    async def _respond(self, request, client: str) -> web.Response:
        method = request.method
        if method not in _METHODS:
            return _response(501, error_json(f"{_UNSUPPORTED} ({method[:20]!r})"))
        refused = self._misdirected(request)
        refused = _response(403, refused) if refused is not None else self._refused_body(request)
        if refused is None:
            body = await self._read_body(request, request.content_length or 0)
            refused = body if isinstance(body, web.Response) else None
        if refused is not None:
            return await _before_unread_body(request, refused)
        path = request.raw_path.split("?", 1)[0].split("#", 1)[0]
        page = self.page(method, path) if self.page else None
        if page is not None:
            return _response(200, *page, headers=PAGE_HEADERS)
        status, payload = await self.loop.run_in_executor(
            self._workers, functools.partial(self.answer, method, path, body, client=client))
        return _response(status, payload)

    async def _close(self):
        self._listener.close()
        for connection in list(self.connections):
            connection.transport.abort()
        tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self):
        """Stops listening and closes every connection (a client learns at once that the server is gone)."""
        if self._stopped:
            return
        self._stopped = True
        if hasattr(self, "_listener"):
            try:
                self._call(self._close())
            except (concurrent.futures.TimeoutError, RuntimeError) as e:
                logging.warning(f"REST server did not close cleanly: {type(e).__name__}: {e}")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()
        self._workers.shutdown(wait=False)
