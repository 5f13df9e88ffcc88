"""Delivery workers against in-process sinks that behave like async transports.

These sinks are real implementations of the sink interface (not mocks of a broker): they exercise
the worker's contract that broker-backed sinks rely on (several records in flight, confirmations
out of order, transient and permanent failures, a sink that raises).
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import orjson
from procs import wait_until

from bridge.agent.delivery import DeliveryWorker
from bridge.agent.outbox import Entry, Outbox
from bridge.observability import AgentMetrics
from bridge.retry import Backoff
from bridge.sinks.base import Outcome, Sink, SinkError


class AsyncSink(Sink):
    """Confirms up to 8 in-flight records in random order; can fail by script."""

    scheme = "memory"
    max_in_flight = 8

    def __init__(self, spec: str, fail: dict[int, SinkError] | None = None, raise_on: set[int] | None = None):
        super().__init__(spec)
        self.pending: list[Entry] = []
        self.delivered: list[int] = []  # what the "broker" accepted, in acceptance order
        self.fail = dict(fail or {})
        self.raise_on = set(raise_on or ())
        self.lock = threading.Lock()

    def submit(self, entry: Entry) -> None:
        if entry.seq in self.raise_on:
            self.raise_on.discard(entry.seq)
            raise RuntimeError("sink bug")
        with self.lock:
            self.pending.append(entry)

    def poll(self, timeout: float) -> list[Outcome]:
        with self.lock:
            batch, self.pending = self.pending, []
        random.shuffle(batch)  # confirmations arrive in any order
        out = []
        for entry in batch:
            err = self.fail.pop(entry.seq, None)
            if err is None:
                self.delivered.append(entry.seq)
            out.append(Outcome(entry.seq, err))
        return out


def run_worker(tmp_path: Path, sink: Sink, records: int) -> tuple[Outbox, DeliveryWorker, AgentMetrics]:
    metrics = AgentMetrics()
    outbox = Outbox(tmp_path / "outbox", [sink.id])
    for i in range(1, records + 1):
        outbox.append(f"r{i}", orjson.dumps({"i": i}))
    worker = DeliveryWorker(
        sink, outbox, metrics, tmp_path / "dead-letter", backoff=Backoff(base=0.01, cap=0.05)
    )
    worker.start()
    return outbox, worker, metrics


def test_out_of_order_confirmations_keep_the_cursor_contiguous(tmp_path: Path) -> None:
    sink = AsyncSink("memory://a")
    outbox, worker, metrics = run_worker(tmp_path, sink, 50)
    wait_until(lambda: outbox.cursor(sink.id) == 50, what="all confirmed")
    worker.stop(1)
    worker.join(5)
    assert sorted(sink.delivered) == list(range(1, 51))
    assert metrics.sink_sent.labels(sink.id)._value.get() == 50
    assert outbox.pending == (0, 0)


def test_transient_failure_resends_from_the_first_unconfirmed(tmp_path: Path) -> None:
    sink = AsyncSink("memory://b", fail={7: SinkError("broker unavailable", kind="unavailable")})
    outbox, worker, metrics = run_worker(tmp_path, sink, 20)
    wait_until(lambda: outbox.cursor(sink.id) == 20, what="all confirmed")
    worker.stop(1)
    worker.join(5)
    assert set(sink.delivered) == set(range(1, 21))  # at least once: some may be delivered twice
    assert metrics.sink_failures.labels(sink.id, "unavailable")._value.get() == 1
    assert metrics.sink_retries.labels(sink.id)._value.get() == 1


def test_permanent_failure_goes_to_the_dead_letter_file(tmp_path: Path) -> None:
    sink = AsyncSink("memory://c", fail={3: SinkError("too large", kind="too_large", permanent=True)})
    outbox, worker, metrics = run_worker(tmp_path, sink, 5)
    wait_until(lambda: outbox.cursor(sink.id) == 5, what="queue moved on")
    worker.stop(1)
    worker.join(5)
    (line,) = (tmp_path / "dead-letter" / f"{sink.id}.jsonl").read_bytes().splitlines()
    dead = orjson.loads(line)
    assert dead["record"] == {"i": 3} and dead["reason"] == "too large" and dead["kind"] == "too_large"
    assert metrics.sink_dead_letters.labels(sink.id)._value.get() == 1
    assert 3 not in sink.delivered


def test_a_sink_that_raises_is_retried_not_fatal(tmp_path: Path) -> None:
    sink = AsyncSink("memory://d", raise_on={2})
    outbox, worker, metrics = run_worker(tmp_path, sink, 4)
    wait_until(lambda: outbox.cursor(sink.id) == 4, what="all confirmed")
    assert worker.is_alive()
    worker.stop(1)
    worker.join(5)
    assert metrics.sink_failures.labels(sink.id, "internal")._value.get() == 1


def test_secrets_in_sink_errors_are_masked() -> None:
    err = SinkError("POST https://h/x?sig=abcdefSECRET failed")
    assert "abcdefSECRET" not in str(err)
