"""The Event Hubs sink against a local AMQP 1.0 peer (``tests/peers/amqp_eventhubs.py``) over real TCP.

Nothing is mocked: the sink drives the unmodified azure-eventhub SDK (pyamqp), the peer speaks the
Event Hubs subset of AMQP 1.0 the SDK needs ($cbs, $management, batches, consumer links), the agent
is a real process polling the IMDS emulator, and records are read back with the SDK's own
``EventHubConsumerClient``. Outages are real: the peer drops its connections and stops listening, or
a small TCP proxy accepts connections and never answers (a black-holed path, the case that hangs
the SDK for ever without the sink's watchdog). The official Event Hubs emulator runs in Docker where
a daemon answers (skipped otherwise).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from peers.amqp_eventhubs import EventHubsPeer, StoredEvent
from procs import Agent, Emulator, docker_available, make_changes, wait_until
from test_agent_e2e import assert_consistent

from bridge.pipeline import Entry, Outcome, RecordMeta
from bridge.sinks import SinkError, create_sink
from bridge.sinks.eventhubs import OWNER, EventHubsSink, parse_eventhubs_spec
from bridge.transports.eventhubs import inspect_connection_string

# A SAS key that must never reach a log line. Derived, not random: test ids carry it, and
# pytest-xdist workers must agree on the ids; it is different from any key in the repository.
SECRET = "c2VjcmV0LWtleS1" + uuid.uuid5(uuid.NAMESPACE_URL, "se-bridge-tests/eventhubs-sas").hex


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def peer() -> Iterator[EventHubsPeer]:
    with EventHubsPeer({"hub": 2}) as p:
        yield p
    assert p.errors == [], p.errors


def spec_for(port: int, hub: str = "hub", **options: str) -> str:
    query = {"connection_string_env": "EH_CONN", "send_timeout": "10", "open_timeout": "10", **options}
    return f"eventhubs://127.0.0.1:{port}/{hub}?" + "&".join(f"{k}={v}" for k, v in query.items())


def entry(seq: int, vm_id: str = "vm-a", pad: int = 0) -> Entry:
    record: dict[str, Any] = {"schemaVersion": 1, "recordType": "scheduledEvents", "vm": {"vmId": vm_id}}
    record["recordId"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{vm_id}/{seq}"))
    if pad:
        record["pad"] = "x" * pad
    return Entry(seq, RecordMeta.of(record), time.time(), orjson.dumps(record))


def drain(sink: EventHubsSink, count: int, timeout: float = 30.0) -> list[Outcome]:
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + timeout
    while len(outcomes) < count and time.monotonic() < deadline:
        outcomes += sink.poll(0.2)
    return outcomes


def stored_ids(events: list[StoredEvent]) -> list[str]:
    return [orjson.loads(e.body)["recordId"] for e in events]


def dedup(ids: list[str]) -> list[str]:
    """First occurrences, in order: what an at-least-once consumer that deduplicates sees."""
    seen: set[str] = set()
    return [i for i in ids if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]


def read_back(connection_string: str, expected: int, timeout: float = 60.0) -> list[Any]:
    """Read every partition from the start with the SDK's real consumer until ``expected`` events."""
    from azure.eventhub import EventHubConsumerClient

    client = EventHubConsumerClient.from_connection_string(
        connection_string, consumer_group="$Default", retry_total=1, retry_backoff_factor=0.1
    )
    received: list[Any] = []

    def on_batch(_context: Any, events: list[Any]) -> None:
        received.extend(events)

    thread = threading.Thread(
        target=lambda: client.receive_batch(on_batch, starting_position="-1", max_wait_time=0.5), daemon=True
    )
    thread.start()
    try:
        wait_until(lambda: len(received) >= expected, timeout, what=f"{expected} events read back")
    finally:
        client.close()
        thread.join(10)
    return received


def new_record(agent: Agent, emulator: Emulator, event_type: str = "Freeze") -> str:
    eid = emulator.add_event(eventType=event_type)
    agent.wait_for_change(eid, "scheduled", timeout=20)
    return eid


def run_agent_once(
    emulator: Emulator, tmp_path: Path, spec: str, env: dict[str, str]
) -> subprocess.CompletedProcess:
    """An agent that is expected to refuse its start: its exit code and what it printed."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bridge",
            "agent",
            "--imds-url",
            emulator.url,
            "--sink",
            spec,
            "--state-dir",
            str(tmp_path / "state-once"),
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=90,
        check=False,
    )


class BlackHoleProxy:
    """A TCP port we control: it either accepts connections and never answers (a black-holed path:
    the SDK then hangs in SASL negotiation) or forwards them to the peer."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.forwarding = False
        self.black_holed = 0  # connections accepted and never answered
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._accept, name="blackhole-proxy", daemon=True).start()

    def forward(self) -> None:
        self.forwarding = True

    def black_hole(self) -> None:
        """From now on answer nothing, and cut what was forwarded (the path just went dark)."""
        self.forwarding = False
        with self._lock:
            conns, self._open = self._open, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.close()

    def stop(self) -> None:
        self._stopped = True
        self.black_hole()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._open.append(conn)
            if self.forwarding:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
                with self._lock:
                    self._open.append(upstream)
                threading.Thread(target=self._pipe, args=(conn, upstream), daemon=True).start()
            else:
                self.black_holed += 1
                threading.Thread(target=self._swallow, args=(conn,), daemon=True).start()

    @staticmethod
    def _swallow(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                pass

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for src in readable:
                    data = src.recv(65536)
                    if not data:
                        return
                    (b if src is a else a).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()


@pytest.fixture
def proxy(peer: EventHubsPeer) -> Iterator[BlackHoleProxy]:
    p = BlackHoleProxy(peer.port)
    yield p
    p.stop()


# --------------------------------------------------------------------------------------------------
# The spec (no peer needed)
# --------------------------------------------------------------------------------------------------


def test_spec_defaults_and_every_option() -> None:
    o = parse_eventhubs_spec("eventhubs://contoso.servicebus.windows.net/records")
    assert (o.namespace, o.hub, o.credential, o.client_id) == (
        "contoso.servicebus.windows.net",
        "records",
        "managed",
        None,
    )
    assert (o.send_timeout, o.open_timeout, o.max_in_flight, o.retry_total, o.transport) == (
        30.0,
        10.0,
        500,
        1,
        "amqp",
    )
    client = "0f8fad5b-d9cb-469f-a165-70867728950e"
    o = parse_eventhubs_spec(
        f"eventhubs://contoso.servicebus.windows.net/records?credential=default&client_id={client}"
        "&send_timeout=5&open_timeout=3&max_in_flight=50&retry_total=0&transport=websockets"
    )
    assert (o.credential, o.client_id, o.send_timeout, o.open_timeout, o.max_in_flight) == (
        "default",
        client,
        5.0,
        3.0,
        50,
    )
    assert (o.retry_total, o.transport) == (0, "websockets")
    o = parse_eventhubs_spec("eventhubs://127.0.0.1:5672/hub?connection_string_file=/etc/se/eh.conn")
    assert (o.port, o.credential, o.connection_string.path) == (5672, None, "/etc/se/eh.conn")
    o = parse_eventhubs_spec("eventhubs:///?connection_string_env=EH")  # everything in the string
    assert (o.namespace, o.hub, o.connection_string.env) == ("", "", "EH")
    sink = create_sink("eventhubs://contoso.servicebus.windows.net/records")
    assert isinstance(sink, EventHubsSink) and sink.max_in_flight == 500 and sink.id.startswith("eventhubs-")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "eventhubs://ns.servicebus.windows.net/hub?connection_string=Endpoint=sb://x;SharedAccessKey="
            + SECRET,
            "never put a secret",
        ),
        ("eventhubs://ns.servicebus.windows.net/hub?SharedAccessKey=" + SECRET, "never put a secret"),
        ("eventhubs://user:" + SECRET + "@ns.servicebus.windows.net/hub", "no credentials in the address"),
        ("eventhubs://ns.servicebus.windows.net/hub?credentials=managed", "unknown option 'credentials'"),
        ("eventhubs://ns.servicebus.windows.net/hub?credential=password", "credential must be one of"),
        ("eventhubs://ns.servicebus.windows.net/hub?client_id=not-a-uuid", "client_id must be a UUID"),
        ("eventhubs://ns.servicebus.windows.net/?credential=managed", "event hub name is missing"),
        ("eventhubs://ns.servicebus.windows.net:5671/hub", "a port is only meaningful"),
        ("eventhubs:///hub?credential=managed", "namespace is missing"),
        ("eventhubs://ns/hub?connection_string_env=A&connection_string_file=/b", "not both"),
        ("eventhubs://ns/hub?connection_string_env=A&credential=managed", "exclude each other"),
        ("eventhubs://ns/hub?connection_string_env=1BAD", "environment variable name"),
        ("eventhubs://ns/hub?connection_string_file=relative/path", "absolute path"),
        ("eventhubs://ns/hub?connection_string_env=A&send_timeout=soon", "send_timeout must be a number"),
        ("eventhubs://ns/hub?connection_string_env=A&max_in_flight=0", "max_in_flight must be between"),
        ("eventhubs://ns/hub?connection_string_env=A&transport=http", "transport must be one of"),
        ("eventhubs://ns/hub?connection_string_env=A&retry_total=1&retry_total=2", "given twice"),
        ("eventhubs://ns/-bad-?connection_string_env=A", "one event hub name"),
    ],
)
def test_spec_mistakes_are_refused_without_echoing_secrets(spec: str, message: str) -> None:
    with pytest.raises(SinkError) as caught:
        create_sink(spec)
    assert not caught.value.retryable and message in str(caught.value)
    assert SECRET not in str(caught.value)


def test_connection_string_checks_never_echo_the_key() -> None:
    base = f"Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=K;SharedAccessKey={SECRET}"
    info = inspect_connection_string(base + ";UseDevelopmentEmulator=true;EntityPath=hub", OWNER)
    assert (info.host, info.entity_path, info.emulator) == ("127.0.0.1:5672", "hub", True)
    for text, message in [
        (base + ";UseDevelopmentEmulator=True", "must be written 'true' in lower case"),
        (f"SharedAccessKeyName=K;SharedAccessKey={SECRET}", "no Endpoint"),
        ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=K", "needs SharedAccessKeyName"),
    ]:
        with pytest.raises(SinkError) as caught:
            inspect_connection_string(text, OWNER)
        assert not caught.value.retryable and message in str(caught.value) and SECRET not in str(caught.value)


def test_open_refuses_a_missing_or_mismatched_connection_string(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("EH_CONN", raising=False)
    sink = create_sink("eventhubs://127.0.0.1:5672/hub?connection_string_env=EH_CONN")
    with pytest.raises(SinkError) as caught:
        sink.open()
    assert not caught.value.retryable and "EH_CONN is not set" in str(caught.value)
    conn_file = tmp_path / "eh.conn"
    conn_file.write_text(
        f"Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=K;SharedAccessKey={SECRET};"
        "UseDevelopmentEmulator=true;EntityPath=other\n"
    )
    sink = create_sink(f"eventhubs://127.0.0.1:5672/hub?connection_string_file={conn_file}")
    with pytest.raises(SinkError) as caught:
        sink.open()
    assert not caught.value.retryable and "EntityPath is 'other'" in str(caught.value)
    assert SECRET not in str(caught.value)
    missing = create_sink(f"eventhubs://127.0.0.1:5672/hub?connection_string_file={tmp_path}/none")
    with pytest.raises(SinkError) as caught:
        missing.open()
    assert not caught.value.retryable and "cannot read connection_string_file" in str(caught.value)


# --------------------------------------------------------------------------------------------------
# The sink in-process against the peer
# --------------------------------------------------------------------------------------------------


def test_batches_carry_key_and_properties_and_a_too_large_record_is_permanent(monkeypatch) -> None:
    with EventHubsPeer({"hub": 4}, max_message_size=8192) as small:
        monkeypatch.setenv("EH_CONN", small.connection_string())
        sink = create_sink(spec_for(small.port))
        assert isinstance(sink, EventHubsSink)
        sink.open()
        assert sink.partition_ids == ["0", "1", "2", "3"]
        entries = [entry(n, pad=20_000 if n == 5 else 0) for n in range(1, 41)]
        entries += [entry(n, vm_id="vm-b") for n in range(41, 46)]  # another key: another batch
        for e in entries:
            sink.submit(e)
        outcomes = drain(sink, len(entries))
        sink.close()
        assert sorted(o.seq for o in outcomes) == [e.seq for e in entries]
        failed = [o for o in outcomes if not o.ok]
        assert [o.seq for o in failed] == [5]
        assert failed[0].error is not None and not failed[0].error.retryable
        assert failed[0].error.kind == "too_large"
        stored = small.messages()
        expected = [e for e in entries if e.seq != 5]
        assert sorted(stored_ids(stored)) == sorted(e.record_id for e in expected)
        for vm in ("vm-a", "vm-b"):
            on_key = [s for s in stored if s.partition_key == vm]
            assert len({s.partition for s in on_key}) == 1  # one VM, one partition
            assert stored_ids(sorted(on_key, key=lambda s: s.sequence_number)) == [
                e.record_id for e in expected if orjson.loads(e.payload)["vm"]["vmId"] == vm
            ]
        first = stored[0]
        assert first.content_type == "application/json"
        assert first.message_id == first.properties["recordId"] == orjson.loads(first.body)["recordId"]
        assert first.properties["recordType"] == "scheduledEvents"
        assert first.properties["schemaVersion"] == 1 and first.properties["vmId"] == "vm-a"
        assert small.errors == []


def test_the_connection_strings_endpoint_wins_over_the_spec_host(
    peer: EventHubsPeer, monkeypatch, caplog
) -> None:
    """The spec names a namespace, the connection string another endpoint: the SDK dials the
    Endpoint (the spec's host only labels the sink), and the agent says so once."""
    monkeypatch.setenv("EH_CONN", peer.connection_string())
    sink = create_sink("eventhubs://contoso-ns.servicebus.windows.net/hub?connection_string_env=EH_CONN")
    with caplog.at_level("WARNING", logger="bridge.sinks.eventhubs"):
        sink.open()
        sink.submit(entry(1))
        assert [o.ok for o in drain(sink, 1)] == [True]
        sink.close()
    assert stored_ids(peer.messages()) == [entry(1).record_id]
    wins = [
        r
        for r in caplog.records
        if r.getMessage() == "the connection string's Endpoint wins over the spec's host"
    ]
    assert len(wins) == 1 and wins[0].endpoint == f"127.0.0.1:{peer.port}"  # type: ignore[attr-defined]


def test_after_a_failure_nothing_overtakes_the_resend(peer: EventHubsPeer, monkeypatch) -> None:
    """Records submitted after a failure and before the worker's resend are dropped, so the resend
    from the first failed record keeps the order."""
    monkeypatch.setenv("EH_CONN", peer.connection_string())
    sink = create_sink(spec_for(peer.port, retry_total="0"))
    sink.open()
    sink.submit(entry(1))
    assert [o.ok for o in drain(sink, 1)] == [True]
    peer.stop()
    for n in (2, 3):
        sink.submit(entry(n))
    failed = drain(sink, 2)
    assert [(o.seq, o.ok) for o in failed] == [(2, False), (3, False)]
    assert failed[0].error is not None and failed[0].error.retryable
    sink.submit(entry(4))  # a worker that had not seen the failure yet: must not go out before 2
    peer.start()
    for n in (2, 3, 4):
        sink.submit(entry(n))
    outcomes = drain(sink, 3)
    sink.close()
    assert [(o.seq, o.ok) for o in outcomes] == [(2, True), (3, True), (4, True)]
    assert stored_ids(peer.messages()) == [entry(n).record_id for n in (1, 2, 3, 4)]


def test_watchdog_abandons_a_black_holed_send_and_frees_its_thread(
    peer: EventHubsPeer, proxy: BlackHoleProxy, monkeypatch
) -> None:
    """A port that accepts TCP and never answers hangs the SDK in SASL negotiation: the watchdog gives
    the batch back as a transient failure, unblocks the hung thread (it exits) and rebuilds the client."""
    monkeypatch.setenv("EH_CONN", peer.connection_string().replace(f":{peer.port};", f":{proxy.port};"))
    sink = create_sink(spec_for(proxy.port, send_timeout="2", open_timeout="2"))
    assert isinstance(sink, EventHubsSink)
    with pytest.raises(SinkError) as caught:
        sink.open()  # black-holed at start: transient, the agent would start and retry
    assert caught.value.retryable and caught.value.kind == "timeout"
    proxy.forward()
    sink.open()
    sink.submit(entry(1))
    assert [o.ok for o in drain(sink, 1)] == [True]
    proxy.black_hole()
    for _attempt in range(5):  # the cut connection may fail fast once; the reconnection then hangs
        for n in (2, 3):
            sink.submit(entry(n))
        failed = drain(sink, 2, timeout=30)
        assert [(o.seq, o.ok) for o in failed] == [(2, False), (3, False)]
        assert all(o.error is not None and o.error.retryable for o in failed)
        if sink.watchdog_fired:
            break
    assert sink.watchdog_fired >= 1
    assert failed[0].error is not None and failed[0].error.kind == "timeout"
    wait_until(
        lambda: sink.abandoned and not any(t.is_alive() for t in sink.abandoned),
        40,
        what="abandoned sender threads to exit once unblocked",
    )
    assert proxy.black_holed >= 2
    proxy.forward()
    for n in (2, 3):
        sink.submit(entry(n))
    outcomes = drain(sink, 2)
    sink.close()
    assert [(o.seq, o.ok) for o in outcomes] == [(2, True), (3, True)]
    assert dedup(stored_ids(peer.messages())) == [entry(n).record_id for n in (1, 2, 3)]
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name in ("eventhubs-open", "eventhubs-reap")],
        40,
        what="no helper thread left behind",
    )


class RefusingCredential:
    """Stands in for Entra ID (unreachable here): a token credential whose token request fails the way
    azure-identity's do. Everything else is real: the SDK calls it during the $cbs handshake with the
    peer, and wraps what it raises in its own exception."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        raise self.error


def test_entra_id_refusals_through_the_real_sdk_are_classified(peer: EventHubsPeer) -> None:
    from azure.core.exceptions import ClientAuthenticationError
    from azure.eventhub import EventHubProducerClient
    from azure.identity import CredentialUnavailableError

    identity_not_found = ClientAuthenticationError("Identity not found")
    identity_not_found.status_code = 400  # what IMDS answers on a VM without that identity
    cases = [
        (CredentialUnavailableError("ManagedIdentityCredential authentication unavailable"), True),
        (identity_not_found, True),
        (ClientAuthenticationError("IMDS answered 503, try again later"), False),
    ]
    sink = create_sink("eventhubs://127.0.0.1/hub?credential=managed")
    assert isinstance(sink, EventHubsSink)
    for error, permanent in cases:
        client = EventHubProducerClient(
            fully_qualified_namespace=f"127.0.0.1:{peer.port}",
            eventhub_name="hub",
            credential=RefusingCredential(error),
            use_tls=False,  # the peer speaks plain AMQP; the SDK's own option, not the sink's
            retry_total=0,
        )
        try:
            with pytest.raises(Exception) as caught:
                client.get_eventhub_properties()
        finally:
            client.close()
        at_start = sink._error(caught.value, opening=True)
        assert (at_start.kind, not at_start.retryable) == ("auth", permanent), at_start
        assert ("credential refused" in str(at_start)) == permanent
        running = sink._error(caught.value, opening=False)
        assert running.kind == "auth" and running.retryable


# --------------------------------------------------------------------------------------------------
# The agent (a real process) -> the peer
# --------------------------------------------------------------------------------------------------


def test_agent_delivers_every_record_to_eventhubs_and_file(
    emulator: Emulator, make_agent, peer: EventHubsPeer, tmp_path: Path
) -> None:
    """Emulator -> agent (Event Hubs and file sinks at once) -> peer -> the SDK's consumer: every
    record, the file sink's order per partition key, the properties present. The spec's host:port and
    the connection string's Endpoint name the same peer here; the Endpoint is what the SDK dials."""
    agent = make_agent(
        emulator.url,
        "--sink",
        f"file://{tmp_path}/records.jsonl",
        sink=spec_for(peer.port),
        env={"EH_CONN": peer.connection_string()},
    ).start()
    records = make_changes(emulator, agent)  # every record goes to every sink: the events' and their impact
    assert len(records) >= 8
    assert_consistent([r for r in records if r["recordType"] == "scheduledEvents"])
    wait_until(lambda: len(peer.messages()) >= len(records), 30, what="every record at the peer")

    events = read_back(peer.connection_string(), len(records))
    assert len(events) == len(records)
    by_key: dict[str, list[Any]] = {}
    for event in events:
        by_key.setdefault(event.partition_key.decode(), []).append(event)
    for key, keyed in by_key.items():
        keyed.sort(key=lambda e: e.sequence_number)
        assert len({e.partition_key for e in keyed}) == 1
        expected = [r for r in records if r["vm"]["vmId"] == key]
        assert [e.body_as_json() for e in keyed] == expected  # same records, same order as the file
    assert set(by_key) == {r["vm"]["vmId"] for r in records}
    for event, record in ((e, e.body_as_json()) for e in events):
        props = {k.decode(): v.decode() if isinstance(v, bytes) else v for k, v in event.properties.items()}
        assert props == {
            "recordType": record["recordType"],
            "schemaVersion": record["schemaVersion"],
            "vmId": record["vm"]["vmId"],
            "recordId": record["recordId"],
        }
        assert event.content_type == "application/json" and event.message_id == record["recordId"]
    assert agent.metric("se_bridge_sink_failures_total") == 0
    assert agent.terminate() == 0


def test_peer_down_then_up_loses_nothing_and_keeps_order(
    emulator: Emulator, make_agent, peer: EventHubsPeer, tmp_path: Path
) -> None:
    spec = spec_for(peer.port)
    agent = make_agent(
        emulator.url,
        "--sink",
        f"file://{tmp_path}/records.jsonl",
        sink=spec,
        env={"EH_CONN": peer.connection_string()},
    ).start()
    wait_until(lambda: len(peer.messages()) == 1, 30, what="first record at the peer")
    peer.stop()  # every connection dropped, nothing listening
    for kind in ("Freeze", "Reboot", "Redeploy"):
        new_record(agent, emulator, kind)
    label = create_sink(spec).id
    wait_until(
        lambda: agent.metric("se_bridge_sink_failures_total", sink=label) >= 1, 30, what="a failed delivery"
    )
    wait_until(lambda: agent.metric("se_bridge_sink_queue_depth", sink=label) == 3, 30, what="3 records held")
    peer.start()  # same port
    records = agent.records()
    wait_until(lambda: len(peer.messages()) >= len(records), 60, what="the backlog at the peer")
    assert stored_ids(peer.messages()) == [r["recordId"] for r in records]  # none missing, none reordered
    wait_until(lambda: agent.metric("se_bridge_sink_queue_depth", sink=label) == 0, 10, what="queue drained")
    assert agent.metric("se_bridge_sink_dead_letters_total") == 0


@pytest.mark.parametrize("how", ["refused", "wrong-key"])
def test_refused_credential_stops_the_start_and_never_logs_the_key(
    emulator: Emulator, tmp_path: Path, how: str
) -> None:
    if how == "refused":
        refusing = EventHubsPeer({"hub": 2})
        refusing.refuse_tokens = True
    else:  # the peer checks the SAS signature like the service: a wrong key is refused there
        refusing = EventHubsPeer({"hub": 2}, keys={"K": "the-right-key"})
    with refusing:
        run = run_agent_once(
            emulator,
            tmp_path,
            spec_for(refusing.port),
            {"EH_CONN": refusing.connection_string(key=SECRET)},
        )
        assert refusing.token_requests and all(status == 401 for _, status in refusing.token_requests)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "credential refused" in run.stderr and "Traceback" not in run.stderr
    assert SECRET not in run.stdout + run.stderr


def test_credential_refused_while_running_is_retried_not_dead_lettered(
    emulator: Emulator, make_agent, peer: EventHubsPeer, tmp_path: Path
) -> None:
    spec = spec_for(peer.port)
    agent = make_agent(
        emulator.url,
        "--sink",
        f"file://{tmp_path}/records.jsonl",
        sink=spec,
        env={"EH_CONN": peer.connection_string(key=SECRET)},
    ).start()
    wait_until(lambda: len(peer.messages()) == 1, 30, what="first record at the peer")
    peer.refuse_tokens = True  # e.g. the key was rotated on the namespace...
    peer.stop()
    peer.start()  # ...and the connection has to be re-established
    new_record(agent, emulator)
    wait_until(lambda: agent.metric("se_bridge_sink_failures_total", kind="auth") >= 1, 30, what="401s")
    peer.refuse_tokens = False  # ...and the agent's secret is updated on the namespace side
    records = agent.records()
    wait_until(lambda: len(peer.messages()) >= len(records), 60, what="the queued record")
    assert stored_ids(peer.messages()) == [r["recordId"] for r in records]
    assert agent.metric("se_bridge_sink_dead_letters_total") == 0
    log = agent.log_path.read_text()
    assert "credential refused" in log
    assert SECRET not in log


def test_unknown_hub_fails_fast(emulator: Emulator, tmp_path: Path, peer: EventHubsPeer) -> None:
    run = run_agent_once(
        emulator,
        tmp_path,
        spec_for(peer.port, hub="no-such-hub"),
        {"EH_CONN": peer.connection_string(hub="no-such-hub", key=SECRET)},
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "hub not found" in run.stderr and "no-such-hub" in run.stderr and "Traceback" not in run.stderr
    assert SECRET not in run.stderr


def test_black_holed_namespace_then_served(
    emulator: Emulator, make_agent, peer: EventHubsPeer, proxy: BlackHoleProxy, tmp_path: Path
) -> None:
    """The agent starts even though its namespace is black-holed (open is transient), records queue;
    when the path is served they arrive; when it goes dark again the watchdog abandons the hung send
    and rebuilds the client, and everything arrives once the peer answers again."""
    connection_string = peer.connection_string().replace(f":{peer.port};", f":{proxy.port};")
    spec = spec_for(proxy.port, send_timeout="3", open_timeout="2")
    agent = make_agent(
        emulator.url,
        "--sink",
        f"file://{tmp_path}/records.jsonl",
        sink=spec,
        env={"EH_CONN": connection_string},
    ).start()
    assert any(e.get("msg") == "sink not reachable at start, will retry" for e in agent.logs())
    wait_until(
        lambda: agent.metric("se_bridge_sink_failures_total", kind="timeout") >= 1, 30, what="an open timeout"
    )
    assert peer.messages() == []
    proxy.forward()
    wait_until(lambda: len(peer.messages()) >= 1, 60, what="the first record once served")
    proxy.black_hole()
    new_record(agent, emulator)
    wait_until(
        lambda: any(e.get("msg") == "event hubs send abandoned by the watchdog" for e in agent.logs()),
        40,
        what="the watchdog",
    )
    proxy.forward()
    records = agent.records()
    wait_until(lambda: len(dedup(stored_ids(peer.messages()))) >= len(records), 60, what="every record")
    assert dedup(stored_ids(peer.messages())) == [r["recordId"] for r in records]
    assert agent.proc is not None and agent.proc.poll() is None
    assert agent.terminate() == 0


# --------------------------------------------------------------------------------------------------
# The official Event Hubs emulator, where a Docker daemon answers
# --------------------------------------------------------------------------------------------------

EMULATOR_IMAGE = "mcr.microsoft.com/azure-messaging/eventhubs-emulator:latest"
AZURITE_IMAGE = "mcr.microsoft.com/azure-storage/azurite:latest"
#: The emulator's fixed, documented development key (not a secret).
EMULATOR_KEY = "SAS_KEY_VALUE"


@pytest.mark.docker
def test_official_eventhubs_emulator_in_a_container(tmp_path: Path, monkeypatch) -> None:
    """The same sink against Microsoft's Event Hubs emulator (with Azurite, as it requires): an unknown
    hub stops the start, the configured one receives every record, read back in order."""
    reason = docker_available()
    if reason is not None:
        pytest.skip(f"testcontainers Event Hubs emulator test skipped: {reason}")
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network
    from testcontainers.core.waiting_utils import wait_for_logs

    config = tmp_path / "Config.json"
    config.write_text(
        json.dumps(
            {
                "UserConfig": {
                    "NamespaceConfig": [
                        {
                            "Type": "EventHub",
                            "Name": "emulatorNs1",
                            "Entities": [
                                {
                                    "Name": "se-records",
                                    "PartitionCount": "2",
                                    "ConsumerGroups": [{"Name": "cg1"}],
                                }
                            ],
                        }
                    ],
                    "LoggingConfig": {"Type": "File"},
                }
            }
        )
    )
    with Network() as network:
        azurite = DockerContainer(AZURITE_IMAGE).with_network(network).with_network_aliases("azurite")
        emulator = (
            DockerContainer(EMULATOR_IMAGE)
            .with_network(network)
            .with_env("BLOB_SERVER", "azurite")
            .with_env("METADATA_SERVER", "azurite")
            .with_env("ACCEPT_EULA", "Y")
            .with_volume_mapping(str(config), "/Eventhubs_Emulator/ConfigFiles/Config.json", "ro")
            .with_exposed_ports(5672)
        )
        with azurite, emulator:
            wait_for_logs(emulator, "Emulator Service is Successfully Up", timeout=180)
            host, port = emulator.get_container_host_ip(), emulator.get_exposed_port(5672)

            def conn(hub: str) -> str:
                return (
                    f"Endpoint=sb://{host}:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
                    f"SharedAccessKey={EMULATOR_KEY};UseDevelopmentEmulator=true;EntityPath={hub}"
                )

            monkeypatch.setenv("EH_CONN", conn("not-configured"))
            missing = create_sink(f"eventhubs://{host}:{port}/not-configured?connection_string_env=EH_CONN")
            with pytest.raises(SinkError) as caught:
                missing.open()
            assert not caught.value.retryable and "hub not found" in str(caught.value)

            monkeypatch.setenv("EH_CONN", conn("se-records"))
            sink = create_sink(f"eventhubs://{host}:{port}/se-records?connection_string_env=EH_CONN")
            sink.open()
            entries = [entry(n) for n in range(1, 51)]
            for e in entries:
                sink.submit(e)
            outcomes = drain(sink, len(entries), timeout=60)
            sink.close()
            assert [o.seq for o in outcomes if o.ok] == [e.seq for e in entries]
            events = read_back(conn("se-records"), len(entries), timeout=120)
            events.sort(key=lambda e: e.sequence_number)
            assert [e.body_as_json()["recordId"] for e in events] == [e.record_id for e in entries]
            assert {e.partition_key for e in events} == {b"vm-a"}
