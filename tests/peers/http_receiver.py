"""A real webhook receiver for the tests and the benchmark: HTTP/1.1 (keep-alive) or HTTPS on loopback.

It is the other end of the webhook sink, written only with the standard library (plus
``cryptography`` for test certificates) and sharing no code with :mod:`bridge.sinks.webhook`, so it
is an independent check of what goes over the wire:

* every request is recorded with its raw request target (path and query exactly as sent, or the
  absolute URL when it was sent to a proxy), headers, body and arrival times;
* answers are scripted: a queue of :class:`Answer` for the next requests (a status with headers and
  body, a delay beyond the client's timeout, a connection closed without an answer), then a default;
* :meth:`HttpReceiver.stop` also closes kept-alive connections, so "the receiver is down" really is,
  and :meth:`HttpReceiver.start` can bind the same port again;
* :func:`verify_signature` checks the sink's HMAC scheme the way a consumer would (the same code as
  the snippet in docs/sink-webhook.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Answer:
    """How the receiver answers one request."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (beyond the client's timeout: it gives up)
    drop: bool = False  # close the connection without sending a byte


@dataclass(frozen=True)
class Received:
    method: str
    target: str  # the request target exactly as sent: "/path?query", or "http://host/path" via a proxy
    headers: dict[str, str]  # lower-case names
    body: bytes
    arrived: float  # time.time() when the request was read completely
    arrived_mono: float
    answer: Answer

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a handler sleeping through a "slow" answer must not block stop()
    receiver: HttpReceiver

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a failed TLS handshake or a client gone: the test sees it on the client side

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        self.receiver._track(sock)
        return sock, addr


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real webhook endpoint
    server: _Server

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            try:
                self.request.do_handshake()
            except (OSError, ssl.SSLError):
                self.request.close()
                raise
        super().setup()

    def handle(self) -> None:
        with contextlib.suppress(OSError, ssl.SSLError):  # the client went away: nothing to answer
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        receiver = self.server.receiver
        answer = receiver._next_answer()
        receiver._record(
            Received(
                self.command,
                self.path,
                {k.lower(): v for k, v in self.headers.items()},
                body,
                time.time(),
                time.monotonic(),
                answer,
            )
        )
        if answer.delay:
            time.sleep(answer.delay)
        if answer.drop:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)
        self.wfile.flush()


class HttpReceiver:
    """A scripted HTTP(S) server on 127.0.0.1; ``port=0`` picks a free port, kept across restarts."""

    def __init__(
        self,
        port: int = 0,
        *,
        tls: TlsFiles | None = None,
        default: Answer | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.default = default or Answer(202)
        self.received: list[Received] = []
        self._answers: list[Answer] = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._socks: set[socket.socket] = set()
        #: TCP connections accepted so far (across restarts): shows whether a client reuses one.
        self.connections = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def start(self) -> HttpReceiver:
        server = _Server((self.host, self.port), _Handler)
        server.receiver = self
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.tls.cert, self.tls.key)
            # Handshake in the handler thread (see _Handler.setup), not in the accept loop.
            server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every open connection: clients see the receiver down."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            socks, self._socks = self._socks, set()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> HttpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- script ------------------------------------------------------------------------------------

    def queue(self, *answers: Answer) -> None:
        """The next requests get these answers, in order; then :attr:`default` again."""
        with self._lock:
            self._answers.extend(answers)

    def _next_answer(self) -> Answer:
        with self._lock:
            return self._answers.pop(0) if self._answers else self.default

    def _record(self, req: Received) -> None:
        with self._cond:
            self.received.append(req)
            self._cond.notify_all()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.add(sock)
            self.connections += 1

    # -- observation -------------------------------------------------------------------------------

    def requests(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.received if path is None or r.path == path]

    def wait_for(
        self, predicate: Callable[[list[Received]], Any], timeout: float = 30.0, what: str = ""
    ) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(list(self.received))
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"timed out after {timeout} s waiting for {what or predicate}; "
                        f"{len(self.received)} requests received"
                    )
                self._cond.wait(min(left, 0.5))


# --------------------------------------------------------------------------------------------------
# What a consumer does with a signed request (same code as docs/sink-webhook.md)
# --------------------------------------------------------------------------------------------------


def verify_signature(
    key: bytes, headers: Mapping[str, str], body: bytes, tolerance: int = 300, now: float | None = None
) -> None:
    """Raise ``ValueError`` unless the request is signed with ``key`` and fresh (within ``tolerance`` s)."""
    lower = {k.lower(): v for k, v in headers.items()}
    timestamp = lower.get("x-se-bridge-timestamp", "")
    signature = lower.get("x-se-bridge-signature", "")
    if not timestamp.isdigit() or not signature.startswith("sha256="):
        raise ValueError("missing or malformed signature headers")
    if abs((time.time() if now is None else now) - int(timestamp)) > tolerance:
        raise ValueError("stale timestamp")
    expected = hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature[len("sha256=") :]):
        raise ValueError("bad signature")


# --------------------------------------------------------------------------------------------------
# Test certificates: a private CA and a server certificate for 127.0.0.1 / localhost
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA certificate (what a client trusts: ca_file=)
    cert: Path  # the server's certificate chain
    key: Path  # the server's private key


def make_tls_files(directory: Path) -> TlsFiles:
    """Generate a CA and a server certificate signed by it (``cryptography``; raises ImportError
    when it is not installed)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "se-bridge test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return files
