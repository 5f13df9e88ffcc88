"""``se-bridge console``: the ops console as a service (issue 20).

Wiring: the events stream readers (every instance reads everything, like the fleet approver's
events reader: :func:`bridge.streams.follow.follow`) feed the :class:`~bridge.console.board.Board`;
the web app (:mod:`bridge.console.app`) serves it with uvicorn; decisions go out through a
:class:`~bridge.sinks.publisher.DecisionPublisher`. ``/healthz``, ``/readyz`` (ready once every
stream was read to its end) and ``/metrics`` like every service; SIGTERM stops serving, then the
readers. Nothing here is imported by the agent (the ``console`` extra).

The console keeps no outbox (a decision is published while the person waits, and the page says
whether it went out), so it does not compose the whole :class:`~bridge.shell.service.Shell`, whose
core is the outbox and its workers; it takes the shell's state-directory part, as every service does:
the directory (the stream readers' positions and checkpoints) is locked before anything in it is
read (a second console on it stops, exit 2) and watched (deleted under it: the console stops with
:data:`~bridge.shell.statedir.EXIT_COMPONENT_FAILED`). Signals are uvicorn's (SIGTERM: graceful).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from bridge.console.access import Access
from bridge.console.app import Console
from bridge.console.board import Board
from bridge.console.config import ConsoleConfig
from bridge.console.identity import TokenVerifier
from bridge.decisions import load_signing_key
from bridge.http.netaddr import parse_listen
from bridge.shell.statedir import EXIT_COMPONENT_FAILED, lock_state_dir, watch_state_dir
from bridge.signing import KeyRing, load_key
from bridge.sinks import SinkError
from bridge.sinks.publisher import DecisionPublisher
from bridge.streams import DecisionSource, SourceError, create_source, topology
from bridge.streams.base import lag_of
from bridge.streams.follow import follow

log = logging.getLogger(__name__)


class ConsoleService:
    def __init__(self, config: ConsoleConfig) -> None:
        from bridge.settings import ConfigError

        self.config = config
        self.stop = threading.Event()
        self.fatal: str | None = None
        self.state_dir = Path(config.state_dir)
        key_id, _, where = config.key.partition("=")
        try:
            key = load_signing_key(where)
            azure_keys = KeyRing.from_specs(config.azure_key)  # Azure's channel shown only when signed
            approver_keys = KeyRing.from_specs(config.approver_key)  # approvals only when signed
            self.host, self.port = parse_listen(config.listen)
            self.access = Access(
                config.auth,
                approver_roles=config.approver_role,
                approver_groups=config.approver_group,
                verifier=_verifier(config),
                hosts=_hosts(config, self.host),
                read_token=load_key(Path(config.read_token_file)) if config.read_token_file else None,
            )
            self.publisher = DecisionPublisher(config.sink)
        except (ValueError, SinkError, SourceError, OSError) as exc:
            raise ConfigError(str(exc)) from None
        self._lock_fd = lock_state_dir(self.state_dir)  # before a reader opens a position file in it
        try:
            self.sources = [self._source(spec) for spec in config.events_source]
        except (ValueError, SourceError, OSError) as exc:
            self.release()
            raise ConfigError(str(exc)) from None
        self.board = Board(
            silent_after=config.silent_after,
            history_days=config.history_days,
            azure_keys=azure_keys,
            approver_keys=approver_keys,
        )
        self.registry = CollectorRegistry()
        self._caught_up: set[int] = set()
        self._decisions = Counter(
            "se_bridge_console_decisions", "Decisions asked for in the console, by outcome.", ["outcome"],
            registry=self.registry,
        )  # fmt: skip
        self._gauges()
        self.console = Console(
            self.board,
            self.access,
            self.publisher.publish,
            (key_id, key),
            ready=self.ready,
            metrics=lambda: generate_latest(self.registry),
            decision_ttl=config.decision_ttl,
            on_decision=lambda outcome: self._decisions.labels(outcome).inc(),
        )

    def _source(self, spec: str) -> DecisionSource:
        state_dir = self.state_dir
        topology.check_events_reader(spec)
        group = topology.events_group(spec, self.config.group, state_dir)
        # In bulk: a person waits on the console's backlog after a restart (librdkafka's fetch
        # defaults read it twice as fast as the approvers' lean limits, bench/console_bench.py).
        return create_source(spec, state_dir, group=group, bulk=True)

    def release(self) -> None:
        """Let the state directory's lock go (last: nothing may write in it after)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _gauges(self) -> None:
        def count(index: int) -> float:
            return float(self.board.counts()[index])

        for index, (name, text) in enumerate([
            ("se_bridge_console_vms", "VMs the console knows."),
            ("se_bridge_console_silent_vms", "VMs whose agent sent nothing for --silent-after seconds."),
            ("se_bridge_console_open_events", "Events some VM still shows."),
        ]):  # fmt: skip
            Gauge(name, text, registry=self.registry).set_function(functools.partial(count, index))
        self.registry.register(_RefusedCollector(self.board))
        self.registry.register(self.board.reader)
        lag = Gauge(
            "se_bridge_events_reader_lag",
            "Records of the events stream known not read yet (/readyz waits for it to reach 0).",
            registry=self.registry,
        )
        lag.set_function(lambda: lag_of(self.sources) if hasattr(self, "sources") else 0.0)
        pages = Gauge("se_bridge_console_pages", "Pages following the live stream.", registry=self.registry)
        pages.set_function(lambda: len(self.console.stream.queues) if hasattr(self, "console") else 0)

    def ready(self) -> tuple[bool, str]:
        if len(self._caught_up) < len(self.sources):
            return False, "reading the events stream"
        return True, "ok"

    def run(self) -> int:
        import uvicorn

        from bridge.console.protocol import MAX_HEADER_BYTES, BoundedH11Protocol

        for index, source in enumerate(self.sources):
            caught_up = lambda i=index: self._caught_up.add(i)  # noqa: E731
            reader = threading.Thread(
                target=follow,
                args=(source, self.board.take, self.stop, self.board.reader, caught_up),
                name="console-reader",
                daemon=True,
            )
            reader.start()
        # Bound before anything is printed: a port in use is a configuration error (exit 2, one line),
        # not a clickable sign-in address followed by uvicorn's exit 3 in JSON logs.
        from bridge.settings import ConfigError

        try:
            sock = _bind(self.host, self.port)
        except OSError as exc:
            self.release()
            why = exc.strerror or str(exc)
            raise ConfigError(f"listen: cannot serve on {self.config.listen}: {why}") from None
        if self.access.lab_token:
            # Printed, never logged: the token is the lab's only key.
            print(f"console: open http://{self.host}:{self.port}/?token={self.access.lab_token}", flush=True)
        log.info("console started", extra={"listen": f"{self.host}:{self.port}", "auth": self.access.mode})
        server = uvicorn.Server(
            uvicorn.Config(
                self.console.app(),
                host=self.host,
                port=self.port,
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=5,
                lifespan="on",
                # bounded connections: a request deadline and a budget (bridge.console.protocol)
                http=BoundedH11Protocol,
                h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            )
        )

        def state_dir_lost(why: str) -> None:
            self.fatal = why
            log.error("console state directory lost", extra={"reason": why})
            server.should_exit = True  # the same graceful stop as SIGTERM

        watch_state_dir(self._lock_fd, self.state_dir, state_dir_lost, self.stop)

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            # uvicorn handles SIGTERM/SIGINT while it serves, then restores the handlers it found and
            # raises the signal again: with the default one the process died there (exit -15) before
            # the publisher was closed and the lock let go. This one is what it finds: a stop, exit 0.
            log.info("stopping", extra={"service": "console", "signal": signal.Signals(signum).name})
            self.stop.set()
            server.should_exit = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()
            self.stop.set()
            self.publisher.close()
            self.release()
            log.info("console stopped")
        if self.fatal is not None:
            log.critical("console stopped because a component failed", extra={"reason": self.fatal})
            return EXIT_COMPONENT_FAILED
        return 0 if server.started else 2


def main(config: ConsoleConfig) -> int:
    try:
        return ConsoleService(config).run()
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when the host is), as uvicorn would bind it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off only on accepted sockets of that protocol (with 0, a
    # kept-alive connection's every response after the first waited ~44 ms for a delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def _verifier(config: ConsoleConfig) -> TokenVerifier | None:
    """What proves a person (bridge.console.identity); None in lab mode."""
    if config.auth == "lab":
        return None
    if not (config.oidc_issuer and config.oidc_audience):
        raise ValueError(
            "oidc_issuer and oidc_audience are required with --auth entra or oauth2-proxy: the console "
            "proves each person from the ID token the front door passes (docs/console.md)"
        )
    return TokenVerifier(config.oidc_issuer, config.oidc_audience, config.oidc_jwks_url, config.oidc_ca_file)


def _hosts(config: ConsoleConfig, listen_host: str) -> set[str]:
    """The names a request's Host may give: --public-host; in lab mode also the listen address."""
    hosts = {h.strip().lower() for h in config.public_host if h.strip()}
    if config.auth == "lab":
        hosts |= {listen_host.lower().strip("[]"), "localhost", "127.0.0.1", "::1", "[::1]"}
    elif not hosts:
        raise ValueError(
            "public_host is required with --auth entra or oauth2-proxy: the name people reach the console "
            "by (a request naming another Host is refused: DNS rebinding)"
        )
    return hosts


class _RefusedCollector:
    """``se_bridge_console_refused_total{reason}``: the parts of records the board did not believe
    (bridge.console.board.REFUSALS: another VM speaking in a pinned VM's name, a VM speaking for an
    event that does not name it, an approval no approver signed)."""

    def __init__(self, board: Board) -> None:
        self.board = board

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "se_bridge_console_refused",
            "Record parts the console did not believe, by reason.",
            labels=["reason"],
        )
        for reason, count in self.board.refused.items():
            family.add_metric([reason], count)
        yield family
