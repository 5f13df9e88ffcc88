"""The ``file://`` decision source: lines as they are written, woken by inotify (issue 19 item 4,
bridge/streams/filewatch.py).

A waiting poll used to check the file every 50 ms, a fifth of an approval's budget spent on
noticing it. These tests write from another thread while a poll waits with a long timeout and a
long safety net, so a poll that was not woken by the write would still be waiting when the test
gives up on it: the assertion is that it returned at all, not how fast."""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bridge.streams import filewatch
from bridge.streams.file import FileSource

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")


class _Poll(threading.Thread):
    """One ``poll`` of ``source`` with ``timeout``, in the background."""

    def __init__(self, source: FileSource, timeout: float = 30.0) -> None:
        super().__init__(daemon=True)
        self.source, self.timeout = source, timeout
        self.lines: list[bytes] | None = None
        self.start()

    def run(self) -> None:
        self.lines = [m.payload for m in self.source.poll(self.timeout)]


def _source(tmp_path: Path) -> tuple[FileSource, Path]:
    decisions = tmp_path / "in" / "decisions.jsonl"
    decisions.parent.mkdir()
    decisions.touch()
    return FileSource(f"file://{decisions}", tmp_path / "state"), decisions


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _started(poll: _Poll) -> None:
    """Wait until the poll is inside its wait (its watch exists), not merely started."""
    for _ in range(200):
        if poll.source._writes is not None:
            return
        time.sleep(0.01)
    raise AssertionError("the poll never began to wait")


@pytest.fixture(autouse=True)
def _slow_safety_net(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filewatch, "SAFETY_NET", 60.0)  # only inotify can end a wait in time


def test_a_line_written_while_a_poll_waits_ends_the_wait(tmp_path: Path) -> None:
    source, decisions = _source(tmp_path)
    poll = _Poll(source)
    _started(poll)
    assert poll.source._writes is not None and poll.source._writes.watching
    _append(decisions, b'{"n": 1}\n')
    poll.join(10)
    assert not poll.is_alive(), "the write did not wake the poll"
    assert poll.lines == [b'{"n": 1}']
    source.close()


def test_half_a_line_does_not_end_the_wait_and_its_end_does(tmp_path: Path) -> None:
    source, decisions = _source(tmp_path)
    poll = _Poll(source)
    _started(poll)
    _append(decisions, b'{"n": ')
    poll.join(0.5)
    assert poll.is_alive()  # a writer caught mid-line: nothing to hand out yet
    _append(decisions, b"2}\n")
    poll.join(10)
    assert poll.lines == [b'{"n": 2}']
    source.close()


def test_a_line_written_just_after_a_read_that_found_nothing_is_not_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CI flake, found to be a lost wake-up: a read that found nothing took the file's size from
    ``fstat`` *after* reading, so a line written in between counted as read; its inotify event woke
    the wait, which saw the file "not grown" and slept on (until the 0.5 s safety net in
    production; for ever here). The write is put exactly there: between the read and what follows."""
    source, decisions = _source(tmp_path)
    assert source.poll(0.01) == []
    written: list[bool] = []

    class _Reader:
        """The reader's file, with a writer that appends right after the first read."""

        def __init__(self, file: Any) -> None:
            self._file = file

        def __getattr__(self, name: str) -> Any:
            return getattr(self._file, name)

        def __enter__(self) -> _Reader:
            return self

        def __exit__(self, *exc: object) -> None:
            self._file.close()

        def read(self, size: int = -1) -> bytes:
            data: bytes = self._file.read(size)
            if not written:
                written.append(True)
                _append(decisions, b'{"n": 8}\n')
            return data

    real_open = Path.open

    def _open(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(self, mode, *args, **kwargs)
        return _Reader(f) if self == decisions and mode == "rb" else f

    monkeypatch.setattr(Path, "open", _open)
    assert [m.payload for m in source.poll(5.0)] == [b'{"n": 8}']
    source.close()


def test_a_file_renamed_into_place_is_read_from_its_start(tmp_path: Path) -> None:
    source, decisions = _source(tmp_path)
    _append(decisions, b'{"n": 1}\n{"n": 2}\n')
    assert [m.payload for m in source.poll(1.0)] == [b'{"n": 1}', b'{"n": 2}']
    poll = _Poll(source)
    _started(poll)
    fresh = decisions.with_name("new.jsonl")
    fresh.write_bytes(b'{"n": 1}\n{"n": 2}\n{"n": 3}\n')
    os.replace(fresh, decisions)  # a writer that rotates: the watch is on the directory
    poll.join(10)
    assert not poll.is_alive(), "the rename did not wake the poll"
    assert poll.lines == [b'{"n": 3}']  # lines handed out before are not handed out again
    source.close()


def test_writes_inotify_does_not_report_are_found_by_the_safety_net(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file another host writes over NFS or SMB makes no inotify event here: the watch is put on
    a directory nobody writes to, and the file is still read within the safety net's period."""
    monkeypatch.setattr(filewatch, "SAFETY_NET", 0.2)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real_watch = filewatch._Inotify.watch
    monkeypatch.setattr(
        filewatch._Inotify, "watch", lambda self, path: real_watch(self, elsewhere / path.name)
    )
    source, decisions = _source(tmp_path)
    poll = _Poll(source)
    _started(poll)
    _append(decisions, b'{"n": 4}\n')
    poll.join(10)
    assert poll.lines == [b'{"n": 4}']
    source.close()


def test_without_inotify_the_file_is_checked_and_the_reason_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``fs.inotify.max_user_watches`` reached: ``add_watch`` fails with ENOSPC, as the kernel says it
    (raised here: exhausting the machine's watches would starve the other tests of theirs)."""
    import inotify_simple

    def full(self: Any, path: Any, mask: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(inotify_simple.INotify, "add_watch", full)
    source, decisions = _source(tmp_path)
    poll = _Poll(source)
    _started(poll)
    assert poll.source._writes is not None and not poll.source._writes.watching
    _append(decisions, b'{"n": 5}\n')
    poll.join(10)
    assert poll.lines == [b'{"n": 5}']
    assert "inotify cannot watch this file" in caplog.text
    source.close()


def _inotify_descriptors() -> int:
    return sum(1 for fd in os.listdir("/proc/self/fd") if "inotify" in _link(f"/proc/self/fd/{fd}"))


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def test_every_source_of_a_process_shares_one_inotify_instance(tmp_path: Path) -> None:
    """``fs.inotify.max_user_instances`` is 128 for all of a user's processes: a console following
    200 files with an instance each would run out (and every other inotify user of the user with it).
    200 sources in 20 directories, each woken by its own write: one instance, 20 watches."""
    sources, paths = [], []
    for d in range(20):
        (tmp_path / f"d{d}").mkdir()
        for f in range(10):
            path = tmp_path / f"d{d}" / f"{f}.jsonl"
            path.touch()
            paths.append(path)
            sources.append(FileSource(f"file://{path}", tmp_path / "state"))
    assert all(source.poll(0.01) == [] for source in sources)
    assert _inotify_descriptors() == 1
    shared = filewatch._instance()
    assert shared is not None and len(shared._watchers) >= 20
    for n in (7, 123, 199):
        poll = _Poll(sources[n])
        _append(paths[n], b'{"n": %d}\n' % n)
        poll.join(10)
        assert poll.lines == [b'{"n": %d}' % n]
    watched = len(shared._watchers)
    for source in sources:
        source.close()
    assert len(shared._watchers) == watched - 20  # each directory's watch went with its last source


def test_an_overflowed_inotify_queue_wakes_every_waiter(tmp_path: Path) -> None:
    """The kernel drops events past ``fs.inotify.max_queued_events`` and says so once
    (``IN_Q_OVERFLOW``, no watch, no name): every watched file then counts as written, so no waiter
    sleeps on a write that was dropped. The event is handed to the reader's own bookkeeping: filling
    the kernel's queue needs a reader that does not read, and this one always does."""
    from inotify_simple import Event, flags

    source, _ = _source(tmp_path)
    (tmp_path / "other").mkdir()
    other, _ = _source(tmp_path / "other")
    assert source.poll(0.01) == [] and other.poll(0.01) == []
    assert source._writes is not None and other._writes is not None
    marks = (source._writes.mark(), other._writes.mark())
    shared = filewatch._instance()
    assert shared is not None
    shared.note([Event(wd=-1, mask=flags.Q_OVERFLOW, cookie=0, name="")])
    assert source._writes.mark() != marks[0] and other._writes.mark() != marks[1]
    source.close()
    other.close()


def test_no_descriptor_left_for_inotify_the_source_still_reads(tmp_path: Path) -> None:
    """fd exhaustion, for real: in a fresh process whose descriptor limit is what it already has
    open, the shared inotify cannot be made (EMFILE); once descriptors are free again (the limit
    raised) the source reads what is written, by checking the file, and said why once."""
    import subprocess

    decisions = tmp_path / "decisions.jsonl"
    decisions.touch()
    script = f"""
import logging, os, resource, threading
logging.basicConfig(level=logging.WARNING)
from bridge.streams.file import FileSource
from bridge.streams.filewatch import FileWrites
source = FileSource("file://{decisions}", __import__("pathlib").Path("{tmp_path}/state"))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) - 1, hard))
source._writes = FileWrites(source.path)  # what the first poll makes, made with no descriptor left
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
assert not source._writes.watching
threading.Timer(0.3, lambda: open("{decisions}", "ab").write(b'{{"n": 6}}\\n')).start()
print([m.payload for m in source.poll(20.0)])
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[b'{\"n\": 6}']"
    assert "inotify unavailable" in proc.stderr


def test_a_backlog_is_handed_out_in_pieces_in_order_and_resumed_after_a_restart(tmp_path: Path) -> None:
    """Issue 33: a 48.7 MB backlog was read in one piece (Azure's channel: 262 MB)."""
    from bridge.streams.file import READ_BYTES

    path = tmp_path / "big.jsonl"
    line = b'{"n": %d, "pad": "' + b"x" * 800 + b'"}\n'
    with path.open("wb") as f:
        for n in range(12_000):  # about 9.8 MB
            f.write(line % n)
    source = FileSource(f"file://{path}", tmp_path / "state")
    seen: list[int] = []
    biggest = 0
    while len(seen) < 6_000:
        batch = source.poll(1.0)
        biggest = max(biggest, sum(len(m.payload) for m in batch))
        seen += [m.position.number for m in batch]
        source.commit_many(batch)
    assert biggest <= READ_BYTES and seen == list(range(1, len(seen) + 1))
    source.close()
    again = FileSource(f"file://{path}", tmp_path / "state")  # a restart: on from the committed line
    first = again.poll(1.0)
    assert first and first[0].position.number == len(seen) + 1
    rest = [m.position.number for m in first]
    while batch := again.poll(0.2):
        rest += [m.position.number for m in batch]
    assert rest == list(range(len(seen) + 1, 12_001))
    again.close()


def test_a_line_longer_than_a_read_is_handed_on_and_the_next_lines_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to MAX_LINE whole (its consumer refuses it as too large); past that never held whole and
    never silently dropped: its first bytes go on, and the reader refuses them as unreadable."""
    from bridge.streams import file as module
    from bridge.streams.file import LONG_LINE_HEAD, READ_BYTES

    path = tmp_path / "whole.jsonl"
    path.write_bytes(b'{"huge": "' + b"y" * (2 * READ_BYTES) + b'"}\n{"n": 2}\n')
    source = FileSource(f"file://{path}", tmp_path / "state-whole")
    got = []
    while batch := source.poll(0.2):
        got += batch
    assert [len(m.payload) for m in got] == [2 * READ_BYTES + 12, 8]
    source.close()
    monkeypatch.setattr(module, "MAX_LINE", 2 * READ_BYTES)
    path = tmp_path / "long.jsonl"
    path.write_bytes(b'{"n": 1}\n' + b'{"huge": "' + b"y" * (3 * READ_BYTES) + b'"}\n{"n": 3}\n')
    source = FileSource(f"file://{path}", tmp_path / "state")
    got = []
    while batch := source.poll(0.2):
        got += batch
    assert [m.position.number for m in got] == [1, 2, 3]
    assert got[0].payload == b'{"n": 1}' and got[2].payload == b'{"n": 3}'
    assert len(got[1].payload) == LONG_LINE_HEAD
    source.close()
