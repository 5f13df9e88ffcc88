"""The baseline across crashes: the outbox's newest record wins over a stale baseline.json."""

from __future__ import annotations

from pathlib import Path

from helpers import VM, doc, event

from bridge.agent.diff import diff
from bridge.agent.state import BaselineStore, IdentityCache
from bridge.pipeline import Outbox, RecordMeta
from bridge.records import encode
from bridge.records import scheduled_events_record as build_record


def test_baseline_round_trip(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    assert store.load(Outbox(tmp_path / "empty", ["a"])) is None
    d = doc(4, event("a"))
    store.save(d, seq=1)
    loaded = store.load(Outbox(tmp_path / "outbox", ["a"]))
    assert loaded is not None and loaded.digest == d.digest and loaded.incarnation == 4


def test_crash_between_outbox_append_and_baseline_save(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    box = Outbox(tmp_path / "outbox", ["a"])
    d1, d2 = doc(1), doc(2, event("a"))
    box.append(
        RecordMeta("r1", "scheduledEvents", "k"), encode(build_record(VM, None, d1, diff(None, d1), 0))
    )
    store.save(d1, seq=1)
    box.append(
        RecordMeta("r2", "scheduledEvents", "k"), encode(build_record(VM, d1, d2, diff(d1, d2), 0))
    )  # ...and the agent dies here
    box.append(
        RecordMeta("r3", "approval", "k"), b'{"recordType":"approval","recordId":"r3"}'
    )  # a relay audit came in between
    box.close()
    recovered = store.load(Outbox(tmp_path / "outbox", ["a"]))
    assert recovered is not None and recovered.incarnation == 2 and recovered.digest == d2.digest


def test_damaged_files_do_not_stop_the_agent(tmp_path: Path) -> None:
    (tmp_path / "baseline.json").write_text("{half")
    assert BaselineStore(tmp_path).load(Outbox(tmp_path / "outbox", ["a"])) is None
    (tmp_path / "identity.json").write_text("[]")
    assert IdentityCache(tmp_path).load() is None
    IdentityCache(tmp_path).save(VM)
    assert IdentityCache(tmp_path).load().vm_id == VM.vm_id  # type: ignore[union-attr]


def test_identity_falls_back_then_resolves(tmp_path: Path) -> None:
    import socket
    import threading

    from bridge.agent.identity import IdentityResolver
    from bridge.agent.metrics import AgentMetrics
    from bridge.imds.client import ImdsClient
    from bridge.imds.emulator import EmulatorServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    stop = threading.Event()
    unreachable = IdentityResolver(
        ImdsClient(dead, max_rps=0, first_timeout=1), IdentityCache(tmp_path), AgentMetrics()
    )
    assert unreachable.current.source == "hostname" and unreachable.current.vm_id is None
    with EmulatorServer(port=0, rate_limit=0) as emu:
        resolver = IdentityResolver(ImdsClient(emu.url, max_rps=0), IdentityCache(tmp_path), AgentMetrics())
        resolver.start(stop)
        assert resolver.wait(5)
        assert resolver.current.name == "vm-bridge-0" and resolver.current.source == "imds"
    stop.set()
    cached = IdentityResolver(ImdsClient(dead, max_rps=0), IdentityCache(tmp_path), AgentMetrics())
    assert cached.current.source == "cache" and cached.current.name == "vm-bridge-0"
