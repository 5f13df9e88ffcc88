"""The durable outbox: ordering, per-sink cursors, trimming, limits, damage and crash recovery.

Faults are real where they can be (files damaged on disk, SIGKILL); short writes and ENOSPC are
injected through the outbox's write seam here, and produced by a full tmpfs in
tests/integration/test_storage_faults.py.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path

import orjson
import pytest

from bridge.pipeline import Outbox, OutboxFull, OutboxWriteError, PipelineMetrics, RecordMeta
from bridge.pipeline import frames as frame_format


def payload(i: int) -> bytes:
    return b'{"n":%d,"pad":"%s"}' % (i, b"x" * 100)


def meta(i: int, vm: str = "vm-a") -> RecordMeta:
    return RecordMeta(f"r{i}", "scheduledEvents", vm, vm_id=vm, observed_at="2026-11-23T08:00:00Z")


def fill(box: Outbox, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        box.append(meta(i), payload(i))


def frame_spans(segment: Path) -> list[tuple[int, int]]:
    found, damage = frame_format.scan(segment.read_bytes())
    assert not damage
    return [(f.offset, f.end) for f in found]


def flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01  # changes the value of any digit, hex digit, letter or separator
    path.write_bytes(bytes(data))


def test_entries_come_back_in_order_per_sink(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a", "b"])
    fill(box, 5)
    assert [e.seq for e in box.read(0)] == [1, 2, 3, 4, 5]
    assert [e.payload for e in box.read(3)] == [payload(3), payload(4)]
    box.ack("a", 5)
    assert box.depth("a") == 0 and box.depth("b") == 5
    assert box.pending[0] == 5  # b still needs them all
    box.ack("b", 2)
    assert box.pending[0] == 3


def test_routing_metadata_is_stored_with_the_record(tmp_path: Path) -> None:
    """Sinks get key, type, VM and time from the frame header: no sink parses a record again."""
    box = Outbox(tmp_path, ["a"])
    m = RecordMeta(
        "r1", "approval", "vm-x", vm_id="vm-x", vm_name="web-0", resource_id="/sub/x", observed_at="t"
    )
    box.append(m, b'{"anything":"opaque"}')
    box.close()
    (entry,) = Outbox(tmp_path, ["a"]).read(0)
    assert entry.meta == m and entry.record_id == "r1" and entry.key == "vm-x"


def test_cursors_and_records_survive_a_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a", "b"])
    fill(box, 4)
    box.ack("a", 4)
    box.ack("b", 1)
    box.close()
    again = Outbox(tmp_path, ["a", "b"])
    assert again.cursor("a") == 4 and again.cursor("b") == 1
    assert [e.record_id for e in again.read(again.cursor("b"))] == ["r1", "r2", "r3"]
    assert again.append(meta(4), payload(4)).seq == 5
    assert again.last_seq == 5


def test_new_sink_starts_with_what_is_still_held(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a"])
    fill(box, 3)
    box.ack("a", 1)
    box.close()
    again = Outbox(tmp_path, ["a", "new"])
    assert again.cursor("new") == 1  # the slowest known sink's position: nothing held is skipped


def test_a_sink_that_never_confirmed_keeps_its_own_position_after_a_restart(tmp_path: Path) -> None:
    """Issue 8: a webhook that was down since the first start was taken for a new sink after a
    restart and started at the file sink's cursor: its whole backlog was skipped."""
    box = Outbox(tmp_path, ["file", "webhook"])
    assert (tmp_path / "cursors" / "webhook").read_text() == "0\n"  # persisted from its first start
    fill(box, 5)
    box.ack("file", 5)
    box.close()
    again = Outbox(tmp_path, ["file", "webhook"])
    assert again.cursor("webhook") == 0
    assert [e.seq for e in again.read(again.cursor("webhook"))] == [1, 2, 3, 4, 5]


def test_segments_are_trimmed_once_every_sink_confirmed(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a"], segment_bytes=500)
    fill(box, 20)
    segments = sorted(tmp_path.glob("seg-*.log"))
    assert len(segments) > 3
    box.ack("a", 20)
    left = sorted(tmp_path.glob("seg-*.log"))
    assert left == segments[-1:]  # the active segment stays (it holds the newest record and the seq)
    box.close()
    again = Outbox(tmp_path, ["a"])
    assert again.append(meta(20), payload(20)).seq == 21
    assert again.last_seq == 21


def test_limits_refuse_new_records_until_sinks_catch_up(tmp_path: Path) -> None:
    metrics = PipelineMetrics()
    box = Outbox(tmp_path, ["a"], max_records=3, metrics=metrics)
    fill(box, 3)
    with pytest.raises(OutboxFull):
        box.append(meta(3), payload(3))
    box.ack("a", 1)
    assert box.append(meta(3), payload(3)).seq == 4
    bytes_box = Outbox(tmp_path / "b", ["a"], max_bytes=4096)
    with pytest.raises(OutboxFull):
        fill(bytes_box, 100)
    assert metrics.registry.get_sample_value("se_bridge_outbox_records") == 3


def test_torn_tail_is_cut_and_a_corrupt_frame_is_skipped(tmp_path: Path) -> None:
    metrics = PipelineMetrics()
    box = Outbox(tmp_path, ["a"])
    fill(box, 3)
    box.close()
    (segment,) = tmp_path.glob("seg-*.log")
    spans = frame_spans(segment)
    flip_byte(segment, spans[1][1] - 5)  # inside the payload of frame 2: its CRC no longer matches
    with open(segment, "ab") as f:
        f.write(frame_format.encode(0, 0, 4, 0, meta(3), payload(3))[0][:40])  # a crash mid-append
    again = Outbox(tmp_path, ["a"], metrics=metrics)
    assert [e.record_id for e in again.read(0)] == ["r0", "r2"]
    assert metrics.registry.get_sample_value("se_bridge_outbox_corrupt_frames_total") == 2
    assert segment.stat().st_size == spans[-1][1]  # the torn tail was cut, the damaged frame kept
    assert again.append(meta(3), payload(3)).seq == 4


def test_a_corrupt_middle_frame_never_hides_the_intact_ones_after_it(tmp_path: Path) -> None:
    """Issue 8: with frame 3 of 8 damaged a one-at-a-time reader got [1, 2, 4, 6, 8]."""
    box = Outbox(tmp_path, ["a"])
    fill(box, 8)
    box.close()
    (segment,) = tmp_path.glob("seg-*.log")
    flip_byte(segment, frame_spans(segment)[2][1] - 10)
    again = Outbox(tmp_path, ["a"])
    got, cursor = [], again.cursor("a")
    while batch := again.read(cursor, 1):  # one at a time, as a synchronous sink reads
        got.append(batch[0].seq)
        cursor = batch[0].seq
        again.ack("a", cursor)
    assert got == [1, 2, 4, 5, 6, 7, 8]
    assert again.depth("a") == 0 and again.oldest_unconfirmed("a") is None
    assert not again.wait(cursor, 0.01)  # nothing to read: a reader sleeps, it does not spin


@pytest.mark.parametrize("where", ["newline", "header", "crc"])
def test_any_damaged_byte_costs_only_its_own_frame(tmp_path: Path, where: str) -> None:
    box = Outbox(tmp_path, ["a"])
    fill(box, 5)
    box.close()
    (segment,) = tmp_path.glob("seg-*.log")
    start, end = frame_spans(segment)[1]
    at = {"newline": end - 1, "header": start + 15, "crc": start + 4}[where]
    flip_byte(segment, at)
    assert [e.seq for e in Outbox(tmp_path, ["a"]).read(0)] == [1, 3, 4, 5]


def test_damage_that_appears_while_running_is_caught_when_read(tmp_path: Path) -> None:
    metrics = PipelineMetrics()
    box = Outbox(tmp_path, ["a", "b"], metrics=metrics)
    fill(box, 4)
    (segment,) = tmp_path.glob("seg-*.log")
    flip_byte(segment, frame_spans(segment)[1][1] - 3)  # bit rot under a running service
    assert [e.seq for e in box.read(0)] == [1, 3, 4]
    assert [e.seq for e in box.read(0)] == [1, 3, 4]  # gone for every sink, reported once
    assert metrics.registry.get_sample_value("se_bridge_outbox_corrupt_frames_total") == 1
    assert box.depth("b") == 3


def test_a_record_is_durable_once_append_returns_even_under_sigkill(tmp_path: Path) -> None:
    """A child appends and SIGKILLs itself right after append returns; the parent recovers it."""
    script = textwrap.dedent(f"""
        import os, signal
        from bridge.pipeline import Outbox, RecordMeta
        box = Outbox({str(tmp_path)!r}, ["a"])
        for i in range(50):
            box.append(RecordMeta(f"r{{i}}", "t", "k"), b'{{"i":%d}}' % i)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], check=False)
    assert proc.returncode == -9
    again = Outbox(tmp_path, ["a"])
    assert [e.record_id for e in again.read(0, 100)] == [f"r{i}" for i in range(50)]


def test_payload_must_be_one_line(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a"])
    with pytest.raises(ValueError):
        box.append(meta(0), b"a\nb")
    assert box.last_seq == 0


class ShortWrites:
    """The write seam of an outbox: the first ``fail`` writes stop short, then ENOSPC or EIO."""

    def __init__(self, fail: int, error: int = errno.ENOSPC, short: int = 8) -> None:
        self.fail, self.error, self.short = fail, error, short
        self.partial = 0

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        if self.fail <= 0:
            return os.write(fd, data)
        if self.partial == 0:
            self.partial = 1
            return os.write(fd, bytes(data[: self.short]))  # a short write: part of the frame lands
        self.fail -= 1
        self.partial = 0
        raise OSError(self.error, os.strerror(self.error))


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO])
def test_a_failed_append_leaves_no_partial_frame(tmp_path: Path, error: int) -> None:
    metrics = PipelineMetrics()
    box = Outbox(tmp_path, ["a"], metrics=metrics)
    fill(box, 2)
    size = next(tmp_path.glob("seg-*.log")).stat().st_size
    box.disk.write = ShortWrites(fail=2, error=error)
    for _ in range(2):
        with pytest.raises(OutboxWriteError) as info:
            box.append(meta(2), payload(2))
        assert info.value.errno == error
        assert next(tmp_path.glob("seg-*.log")).stat().st_size == size  # cut back to the last frame
    assert box.append(meta(2), payload(2)).seq == 3  # space is back: the same seq, nothing skipped
    box.close()
    assert [e.payload for e in Outbox(tmp_path, ["a"]).read(0)] == [payload(0), payload(1), payload(2)]
    assert metrics.registry.get_sample_value("se_bridge_outbox_write_errors_total", {"op": "append"}) == 2


def test_a_failed_fsync_is_a_failed_append(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a"])

    def broken_sync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    box.disk.sync = broken_sync
    with pytest.raises(OutboxWriteError):
        box.append(meta(0), payload(0))
    assert box.read(0) == [] and box.last_seq == 0


class CountingSync:
    """Counts the outbox's fsyncs (the real ones still run) and can fail them with EIO."""

    def __init__(self, real) -> None:
        self.real, self.calls, self.fail = real, 0, False

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.fail:
            raise OSError(errno.EIO, "Input/output error")
        self.real(fd)


def test_a_batch_appended_without_sync_costs_one_fsync_and_is_durable_after_sync(tmp_path: Path) -> None:
    box = Outbox(tmp_path, ["a"])
    syncs = box.disk.sync = CountingSync(box.disk.sync)
    for i in range(50):
        box.append(meta(i), payload(i), sync=False)
    assert syncs.calls == 0 and len(box.read(0, limit=100)) == 50  # readable before the sync
    box.sync()
    box.sync()  # nothing new: no second fsync
    assert syncs.calls == 1
    box.append(meta(50), payload(50))  # a durable append syncs as before
    assert syncs.calls == 2
    box.close()
    assert len(Outbox(tmp_path, ["a"]).read(0, limit=100)) == 51


def test_a_failed_batch_sync_is_an_error_and_a_roll_syncs_the_batch_first(tmp_path: Path) -> None:
    metrics = PipelineMetrics()
    box = Outbox(tmp_path, ["a"], segment_bytes=600, metrics=metrics)
    syncs = box.disk.sync = CountingSync(box.disk.sync)
    box.append(meta(0), payload(0), sync=False)
    syncs.fail = True
    with pytest.raises(OutboxWriteError):
        box.sync()
    assert metrics.registry.get_sample_value("se_bridge_outbox_write_errors_total", {"op": "append"}) == 1
    syncs.fail = False
    box.sync()  # still owed: the failed sync did not clear it
    assert syncs.calls == 2
    for i in range(1, 8):  # past segment_bytes: the roll must sync the unsynced frames it leaves
        box.append(meta(i), payload(i), sync=False)
    assert len(list(tmp_path.glob("seg-*.log"))) > 1 and syncs.calls > 2


def test_batch_syncs_run_outside_the_append_lock_and_share_fsyncs(tmp_path: Path) -> None:
    """The approver's lanes: while one lane's fsync is on the disk, other lanes keep appending (they
    do not queue behind it), a lane whose frames that fsync covered needs none of its own, and a
    roll meanwhile (the fsync runs on a duplicate descriptor) changes nothing."""
    box = Outbox(tmp_path, ["a"], segment_bytes=2_000)
    in_fsync, release = threading.Event(), threading.Event()
    real = box.disk.sync
    calls: list[int] = []

    def slow_sync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # the first batch sync stays on the "disk" until released
            in_fsync.set()
            assert release.wait(10)
        real(fd)

    box.disk.sync = slow_sync
    box.append(meta(0), payload(0), sync=False)
    first = threading.Thread(target=box.sync)
    first.start()
    assert in_fsync.wait(10)
    appender = threading.Thread(  # appends (and the rolls they cause) go on during that fsync
        target=lambda: [box.append(meta(i), payload(i), sync=False) for i in range(1, 30)]
    )
    appender.start()
    appender.join(5)
    blocked = appender.is_alive()
    if blocked:
        release.set()  # let the test end instead of hanging
    assert not blocked, "appends waited for another lane's fsync"
    assert len(list(tmp_path.glob("seg-*.log"))) > 1
    rolled = len(calls) - 1  # each roll synced what it left behind
    waiting = threading.Thread(target=box.sync)  # needs an fsync of its own: its frames came later
    waiting.start()
    release.set()
    first.join(10)
    waiting.join(10)
    assert not first.is_alive() and not waiting.is_alive()
    assert len(calls) == rolled + 2
    box.sync()  # everything covered: no fsync
    assert len(calls) == rolled + 2
    box.close()
    assert [e.seq for e in Outbox(tmp_path, ["a"]).read(0, limit=100)] == list(range(1, 31))


def test_a_batch_sync_at_fd_exhaustion_is_an_error_and_loses_nothing(tmp_path: Path) -> None:
    """The batch sync runs on a duplicate of the segment's descriptor: at fd exhaustion (EMFILE) the
    dup fails. That is an OutboxWriteError, as a failed fsync is (the approver then appends the
    chunk's audit records again durably, which needs no new descriptor), not a crash; the frames stay
    and a later sync covers them. Run in a child process whose own RLIMIT_NOFILE is lowered to the
    descriptors it holds: a real EMFILE from the kernel, not a patched os.dup."""
    script = textwrap.dedent(
        f"""
        import errno, os, resource, sys
        from bridge.pipeline import Outbox, OutboxWriteError, RecordMeta
        box = Outbox({str(tmp_path)!r}, ["a"])
        meta = lambda i: RecordMeta(f"r{{i}}", "scheduledEvents", "vm-a", vm_id="vm-a",
                                    observed_at="2026-11-23T08:00:00Z")
        for i in range(3):
            box.append(meta(i), b'{{"n":%d}}' % i, sync=False)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        free = next(fd for fd in range(3, soft) if not os.path.exists(f"/proc/self/fd/{{fd}}"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (free, hard))
        try:
            box.sync()
            sys.exit("the sync did not fail at fd exhaustion")
        except OutboxWriteError as exc:
            assert exc.errno == errno.EMFILE, exc
        box.append(meta(3), b'{{"n":3}}')  # durable, on the open descriptor: works at the limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        box.sync()
        box.close()
        print(len(Outbox({str(tmp_path)!r}, ["a"]).read(0, limit=10)))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "4"


def test_a_cursor_that_cannot_be_written_is_kept_and_written_later(tmp_path: Path) -> None:
    metrics = PipelineMetrics()
    box = Outbox(tmp_path, ["a"], metrics=metrics)
    fill(box, 3)
    cursors = tmp_path / "cursors"
    # Tests run as root, which permissions do not stop: put a file where the directory was instead.
    cursors.rename(tmp_path / "cursors.moved")
    cursors.write_text("not a directory")  # every cursor write now fails (ENOTDIR)
    box.ack("a", 2)  # must not raise: the position is kept in memory
    assert box.cursor("a") == 2 and box.depth("a") == 1
    assert metrics.registry.get_sample_value("se_bridge_outbox_write_errors_total", {"op": "cursor"}) == 1
    cursors.unlink()
    (tmp_path / "cursors.moved").rename(cursors)
    box.ack("a", 3)
    assert (cursors / "a").read_text() == "3\n"


def test_state_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        box = Outbox(tmp_path / "outbox", ["a"])
        fill(box, 1)
        box.ack("a", 1)
    finally:
        os.umask(old)
    for path in [tmp_path / "outbox", tmp_path / "outbox" / "cursors"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in [*(tmp_path / "outbox").glob("seg-*"), tmp_path / "outbox" / "cursors" / "a"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_an_outbox_written_by_the_previous_format_is_still_delivered(tmp_path: Path) -> None:
    """Format 1 frames (CRC over the payload only, metadata in the payload) survive an upgrade."""
    record = {"recordId": "old-1", "recordType": "scheduledEvents", "vm": {"vmId": "vm-o", "name": "o"}}
    body = orjson.dumps(record)
    line = b"1 old-1 1700000000000 %08x %d %s\n" % (zlib.crc32(body), len(body), body)
    (tmp_path / "seg-00000000000000000001.log").write_bytes(line)
    box = Outbox(tmp_path, ["a"])
    (entry,) = box.read(0)
    assert entry.payload == body and entry.meta.key == "vm-o" and entry.meta.vm_name == "o"
    assert box.append(meta(1), payload(1)).seq == 2
