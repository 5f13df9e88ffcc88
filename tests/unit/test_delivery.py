"""Delivery workers against in-process sinks that behave like async transports.

These sinks are real implementations of the sink interface (not mocks of a broker): they exercise
the worker's contract that broker-backed sinks rely on (several records in flight, confirmations
out of order, transient and permanent failures, a sink that raises). The outbox records every cursor
move, so the tests assert on the cursor sequence itself, and a deliberately wrong worker (one that
acknowledges the highest confirmed seq) is shown to fail the same checks.
"""

from __future__ import annotations

import errno
import random
import threading
from pathlib import Path

import orjson
import pytest
from procs import wait_until

from bridge.pipeline import (
    DeliveryWorker,
    Entry,
    Health,
    Outbox,
    Outcome,
    PipelineMetrics,
    RecordMeta,
    Sink,
    SinkError,
)
from bridge.pipeline.delivery import _Window
from bridge.support.retry import Backoff


class AsyncSink(Sink):
    """Keeps up to 8 records in flight and confirms a random part of them per poll, in random
    order (as a broker's acknowledgements arrive); can fail by script."""

    scheme = "memory"
    max_in_flight = 8

    def __init__(
        self,
        spec: str,
        fail: dict[int, SinkError] | None = None,
        raise_on: set[int] | None = None,
        sticky: bool = False,  # a scripted failure repeats on every resend
    ):
        super().__init__(spec)
        self.sticky = sticky
        self.pending: list[Entry] = []
        self.delivered: list[int] = []  # what the "broker" accepted, in acceptance order
        self.settled: set[int] = set()  # confirmed, or refused for good (dead-lettered)
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
            random.shuffle(self.pending)  # confirmations arrive in any order, a few at a time
            cut = random.randint(1, len(self.pending)) if self.pending else 0
            batch, self.pending = self.pending[:cut], self.pending[cut:]
        out = []
        for entry in batch:
            err = self.fail.get(entry.seq) if self.sticky else self.fail.pop(entry.seq, None)
            if err is None:
                self.delivered.append(entry.seq)
            if err is None or not err.retryable:
                self.settled.add(entry.seq)
            out.append(Outcome(entry.seq, err))
        return out


class WatchedOutbox(Outbox):
    """Records every cursor move and whether everything up to it was settled by the sink then."""

    sink: AsyncSink

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.acks: list[int] = []
        self.gaps: list[tuple[int, list[int]]] = []  # (acked seq, seqs below it not settled yet)

    def ack(self, sink_id: str, seq: int) -> None:
        missing = [s for s in range(1, seq + 1) if s not in self.sink.settled]
        if missing:
            self.gaps.append((seq, missing))
        self.acks.append(seq)
        super().ack(sink_id, seq)


class MaxAckWorker(DeliveryWorker):
    """A wrong worker: acknowledges the highest confirmed seq (skips whatever is still in flight)."""

    def _advance(self, window: _Window) -> None:
        if window.confirmed:
            top = max(window.confirmed)
            window.cursor = max(window.cursor, top)
            while window.in_flight and window.in_flight[0].seq <= top:
                window.in_flight.popleft()
            window.confirmed.clear()
            self.outbox.ack(self.sink.id, window.cursor)


def run_worker(
    tmp_path: Path, sink: AsyncSink, records: int, worker_class: type[DeliveryWorker] = DeliveryWorker
) -> tuple[WatchedOutbox, DeliveryWorker, PipelineMetrics]:
    metrics = PipelineMetrics()
    outbox = WatchedOutbox(tmp_path / "outbox", [sink.id])
    outbox.sink = sink
    for i in range(1, records + 1):
        outbox.append(RecordMeta(f"r{i}", "test", "k"), orjson.dumps({"i": i}))
    worker = worker_class(
        sink, outbox, metrics, tmp_path / "dead-letter", backoff=Backoff(base=0.01, cap=0.05)
    )
    worker.start()
    return outbox, worker, metrics


def finish(worker: DeliveryWorker) -> None:
    worker.stop(1)
    worker.join(5)


def sample(metrics: PipelineMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(("worker_class", "correct"), [(DeliveryWorker, True), (MaxAckWorker, False)])
def test_out_of_order_confirmations_keep_the_cursor_contiguous(
    tmp_path: Path, worker_class: type[DeliveryWorker], correct: bool
) -> None:
    random.seed(8)
    sink = AsyncSink("memory://a")
    outbox, worker, metrics = run_worker(tmp_path, sink, 50, worker_class)
    wait_until(lambda: outbox.cursor(sink.id) == 50, what="all confirmed")
    finish(worker)
    contiguous = not outbox.gaps and outbox.acks == sorted(set(outbox.acks))
    assert contiguous is correct, outbox.gaps[:3]  # the check catches a worker that acks max(seq)
    if correct:
        assert sorted(sink.delivered) == list(range(1, 51))
        assert sample(metrics, "se_bridge_sink_sent_total", sink=sink.id) == 50
        assert outbox.pending == (0, 0)


@pytest.mark.parametrize(("worker_class", "correct"), [(DeliveryWorker, True), (MaxAckWorker, False)])
def test_transient_failure_resends_from_the_first_unconfirmed(
    tmp_path: Path, worker_class: type[DeliveryWorker], correct: bool
) -> None:
    random.seed(7)
    sink = AsyncSink("memory://b", fail={7: SinkError("broker unavailable", kind="unavailable")})
    outbox, worker, metrics = run_worker(tmp_path, sink, 20, worker_class)
    wait_until(lambda: outbox.cursor(sink.id) == 20, what="all confirmed")
    finish(worker)
    # No gap: the cursor never passed 7 before 7 itself was confirmed, i.e. after the failure the
    # worker went back to 7 and sent it again.
    resent = 7 in sink.delivered
    assert (resent and not outbox.gaps) is correct, (outbox.acks, outbox.gaps)
    if correct:
        assert set(sink.delivered) == set(range(1, 21))  # at least once: some may be delivered twice
        assert sample(metrics, "se_bridge_sink_failures_total", sink=sink.id, kind="unavailable") == 1
        assert sample(metrics, "se_bridge_sink_retries_total", sink=sink.id) == 1


def test_permanent_failure_goes_to_the_dead_letter_file(tmp_path: Path) -> None:
    sink = AsyncSink("memory://c", fail={3: SinkError("too large", kind="too_large", retryable=False)})
    outbox, worker, metrics = run_worker(tmp_path, sink, 5)
    wait_until(lambda: outbox.cursor(sink.id) == 5, what="queue moved on")
    finish(worker)
    (line,) = (tmp_path / "dead-letter" / f"{sink.id}.jsonl").read_bytes().splitlines()
    dead = orjson.loads(line)
    assert dead["record"] == {"i": 3} and dead["reason"] == "too large" and dead["kind"] == "too_large"
    assert sample(metrics, "se_bridge_sink_dead_letters_total", sink=sink.id) == 1
    assert 3 not in sink.delivered and not outbox.gaps


def test_a_dead_letter_that_cannot_be_written_keeps_the_record(tmp_path: Path) -> None:
    """A refused record is confirmed only once its dead letter is on disk; until then it is retried."""
    (tmp_path / "dead-letter").write_text("a file where the directory should be")
    refuse = SinkError("too large", kind="too_large", retryable=False)
    sink = AsyncSink("memory://g", fail={2: refuse}, sticky=True)
    outbox, worker, metrics = run_worker(tmp_path, sink, 3)
    wait_until(
        lambda: sample(metrics, "se_bridge_component_errors_total", component=worker.component, kind="io")
    )
    assert outbox.cursor(sink.id) < 2 and worker.is_alive()  # never past the refused record
    (tmp_path / "dead-letter").unlink()
    wait_until(lambda: outbox.cursor(sink.id) == 3, what="moved on once the dead letter was kept")
    finish(worker)
    assert len((tmp_path / "dead-letter" / f"{sink.id}.jsonl").read_bytes().splitlines()) == 1


def test_a_sink_that_raises_is_retried_not_fatal(tmp_path: Path) -> None:
    sink = AsyncSink("memory://d", raise_on={2})
    outbox, worker, metrics = run_worker(tmp_path, sink, 4)
    wait_until(lambda: outbox.cursor(sink.id) == 4, what="all confirmed")
    assert worker.is_alive()
    finish(worker)
    assert sample(metrics, "se_bridge_sink_failures_total", sink=sink.id, kind="internal") == 1


def test_an_outbox_read_error_is_retried_and_reported(tmp_path: Path) -> None:
    """EMFILE while opening a segment: counted, /healthz lists the worker as failing, then it goes on."""
    sink = AsyncSink("memory://e")
    metrics = PipelineMetrics()
    outbox = WatchedOutbox(tmp_path / "outbox", [sink.id])
    outbox.sink = sink
    outbox.append(RecordMeta("r1", "t", "k"), b"{}")
    real_read, failures = outbox.read, [3]

    def flaky_read(after: int, limit: int = 100) -> list[Entry]:
        if failures[0] > 0:
            failures[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real_read(after, limit)

    outbox.read = flaky_read  # type: ignore[method-assign]
    health = Health(metrics)
    worker = DeliveryWorker(
        sink, outbox, metrics, tmp_path / "dl", health=health, backoff=Backoff(base=0.01, cap=0.05)
    )
    worker.start()
    wait_until(lambda: outbox.cursor(sink.id) == 1, what="delivered after the errors")
    finish(worker)
    assert sample(metrics, "se_bridge_component_errors_total", component=worker.component, kind="io") == 3
    alive, body = health.report()
    assert alive and "failing" not in body  # the success ended the streak


def test_a_worker_whose_loop_breaks_fails_the_service(tmp_path: Path) -> None:
    """No silent death: a broken worker marks itself failed and asks the service to stop."""
    sink = AsyncSink("memory://f")
    metrics = PipelineMetrics()
    outbox = Outbox(tmp_path / "outbox", [sink.id])
    stopped: list[str] = []
    health = Health(metrics, on_fatal=stopped.append)
    worker = DeliveryWorker(sink, outbox, metrics, tmp_path / "dl", health=health)
    worker._loop = lambda: (_ for _ in ()).throw(SystemError("broken"))  # type: ignore[method-assign]
    worker.start()
    worker.join(5)
    alive, body = health.report()
    assert not alive and worker.component in body["failed"] and stopped
    assert sample(metrics, "se_bridge_component_up", component=worker.component) == 0


def test_internal_errors_that_never_end_fail_the_service(tmp_path: Path) -> None:
    stopped: list[str] = []
    health = Health(PipelineMetrics(), on_fatal=stopped.append, give_up_after=0.0)
    health.register("delivery/x")
    health.error("delivery/x", "disk_full", restart_helps=False)
    assert health.report()[0] and not stopped  # a full disk is waited out, never restarted for
    health.ok("delivery/x")
    health.error("delivery/x", "io")
    assert not health.report()[0] and stopped == ["delivery/x: io errors for 0 s without a success"]


def test_secrets_in_sink_errors_are_masked() -> None:
    err = SinkError("POST https://h/x?sig=abcdefSECRET failed")
    assert "abcdefSECRET" not in str(err)
