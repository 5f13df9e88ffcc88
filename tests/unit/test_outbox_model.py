"""A stateful property test of the outbox against a model: what goes in comes out, in order, once.

Hypothesis drives random sequences of: appends (some of which hit a full disk: a short write then
ENOSPC, or an fsync that fails with EIO), deliveries per sink in random batch sizes, reopening (a
restart), a crash in the middle of an append (a torn tail), and bytes damaged inside frames that a
sink still needs, with segments small enough to roll every few records. The model is the list of
records whose ``append`` returned. Invariant, after every step and at the end: every sink receives
exactly the intact appended records, in append order, each once; no record is invented; damaged
ones are skipped and reported.

Faults of the disk are injected through the outbox's write and sync seams here (thousands of steps
need to be fast); tests/integration/test_storage_faults.py produces the same faults with a real full tmpfs.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bridge.pipeline import Outbox, OutboxWriteError, PipelineMetrics, RecordMeta
from bridge.pipeline import frames as frame_format

SINKS = ("a", "b")
# On tmpfs where there is one: fsync costs nothing there and the model runs thousands of appends.
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None


class FailingWrites:
    """The outbox's write seam: writes ``short`` bytes of the frame, then raises ``error``."""

    def __init__(self, short: int, error: int) -> None:
        self.short, self.error, self.calls = short, error, 0

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        self.calls += 1
        if self.calls == 1 and self.short:
            return os.write(fd, bytes(data[: self.short]))
        raise OSError(self.error, os.strerror(self.error))


class OutboxModel(RuleBasedStateMachine):
    @initialize(segment_bytes=st.sampled_from([300, 700, 4096]))
    def open_outbox(self, segment_bytes: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-model-", dir=SCRATCH))
        self.segment_bytes = segment_bytes
        self.metrics = PipelineMetrics()
        self.box = self._open()
        self.appended: list[bytes] = []  # payloads whose append returned, in order
        self.damaged: set[bytes] = set()  # payloads damaged on disk while some sink still needed them
        self.received: dict[str, list[bytes]] = {s: [] for s in SINKS}
        self.counter = 0

    def _open(self) -> Outbox:
        return Outbox(self.dir, list(SINKS), segment_bytes=self.segment_bytes, metrics=self.metrics)

    def _payload(self, size: int) -> bytes:
        self.counter += 1
        return b'{"n":%d,"pad":"%s"}' % (self.counter, b"p" * size)

    def _expected(self, sink: str) -> list[bytes]:
        """What ``sink`` must still receive: intact appended records after the last it got."""
        got = self.received[sink]
        last = self.appended.index(got[-1]) if got else -1
        return [p for p in self.appended[last + 1 :] if p not in self.damaged]

    # -- rules --------------------------------------------------------------------------------------

    @rule(size=st.integers(0, 400))
    def append(self, size: int) -> None:
        payload = self._payload(size)
        entry = self.box.append(RecordMeta(f"r{self.counter}", "t", "vm"), payload)
        assert entry.payload == payload
        self.appended.append(payload)

    @rule(
        size=st.integers(0, 400), short=st.integers(0, 60), error=st.sampled_from([errno.ENOSPC, errno.EIO])
    )
    def append_on_a_full_disk(self, size: int, short: int, error: int) -> None:
        self.box.disk.write = FailingWrites(short, error)
        try:
            self.box.append(RecordMeta("full", "t", "vm"), self._payload(size))
            raise AssertionError("an append that could not be written returned")
        except OutboxWriteError as err:
            assert err.errno == error
        finally:
            self.box.disk.write = os.write

    @rule(size=st.integers(0, 200))
    def append_with_a_failing_fsync(self, size: int) -> None:
        def broken(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        real, self.box.disk.sync = self.box.disk.sync, broken
        try:
            self.box.append(RecordMeta("eio", "t", "vm"), self._payload(size))
            raise AssertionError("an append whose fsync failed returned")
        except OutboxWriteError:
            pass
        finally:
            self.box.disk.sync = real

    @rule(sink=st.sampled_from(SINKS), limit=st.integers(1, 7))
    def deliver(self, sink: str, limit: int) -> None:
        entries = self.box.read(self.box.cursor(sink), limit)
        expected = self._expected(sink)
        assert [e.payload for e in entries] == expected[:limit], "out of order, invented or skipped"
        if entries:
            self.received[sink].extend(e.payload for e in entries)
            self.box.ack(sink, entries[-1].seq)

    @rule()
    def restart(self) -> None:
        self.box.close()
        self.box = self._open()

    @rule(keep=st.floats(0.05, 0.95))
    def crash_mid_append(self, keep: float) -> None:
        """The process dies inside ``write``: part of a frame is on disk, ``append`` never returned."""
        self.box.close()
        active = max(self.dir.glob("seg-*.log"))
        frame, _ = frame_format.encode(
            0, 0, self.box.last_seq + 1, 0, RecordMeta("torn", "t", "vm"), self._payload(50)
        )
        with open(active, "ab") as f:
            f.write(frame[: max(1, int(len(frame) * keep))])
        self.box = self._open()

    @precondition(lambda self: any(self._expected(s) for s in SINKS))
    @rule(data=st.data())
    def damage_a_needed_frame(self, data: st.DataObject) -> None:
        needed = sorted({p for s in SINKS for p in self._expected(s)}, key=self.appended.index)
        victim = data.draw(st.sampled_from(needed))
        for segment in sorted(self.dir.glob("seg-*.log")):
            buf = bytearray(segment.read_bytes())
            found, _ = frame_format.scan(bytes(buf))
            frame = next((f for f in found if frame_format.decode(bytes(buf), f).payload == victim), None)
            if frame is not None:
                at = data.draw(st.integers(frame.offset, frame.end - 1))
                buf[at] ^= 0x01
                segment.write_bytes(bytes(buf))
                self.damaged.add(victim)
                return
        raise AssertionError("a record some sink still needs is not on disk")

    # -- invariants ---------------------------------------------------------------------------------

    @invariant()
    def nothing_invented_and_each_sink_in_order(self) -> None:
        for sink in SINKS:
            got = self.received[sink]
            assert len(set(got)) == len(got), "a record was delivered twice"
            positions = [self.appended.index(p) for p in got]  # ValueError: an invented record
            assert positions == sorted(positions)

    def _damaged_runs(self) -> int:
        """Damaged records, adjacent ones counted once: a flip on the boundary of two adjacent frames
        (the first one's newline, the next one's marker) leaves nothing on disk that tells one frame
        from two, so the metric's guarantee is at least one per damaged region (it counts the frame
        starts and ends it still sees)."""
        positions = sorted(self.appended.index(p) for p in self.damaged)
        return sum(1 for i, pos in enumerate(positions) if i == 0 or pos != positions[i - 1] + 1)

    def teardown(self) -> None:
        if not hasattr(self, "box"):
            return
        try:
            self.restart()
            for sink in SINKS:
                while self._expected(sink):
                    self.deliver(sink, 7)
                assert self.box.read(self.box.cursor(sink), 100) == []
            intact = [p for p in self.appended if p not in self.damaged]
            for sink in SINKS:  # a record damaged after this sink got it was rightly delivered to it
                assert [p for p in self.received[sink] if p not in self.damaged] == intact
            reported = self.metrics.registry.get_sample_value("se_bridge_outbox_corrupt_frames_total")
            assert reported >= self._damaged_runs()
        finally:
            self.box.close()
            shutil.rmtree(self.dir, ignore_errors=True)


OutboxModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("OUTBOX_MODEL_EXAMPLES", "60")), stateful_step_count=40, deadline=None
)
TestOutboxModel = OutboxModel.TestCase
