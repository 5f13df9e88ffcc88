"""Outbox append, drain and recovery rates: the pipeline's outbox against the one it replaced.

Why: the outbox is on the path of every record (append + fsync before any sink sees it; every sink
reads it back and moves its cursor). The frame index, the header with routing metadata and the CRC
check on every read must not cost more than 10 % of what the previous outbox did. Both run in the
same process, in interleaved rounds (before, after, before, after, ...), on the same disk, with the
same records, so machine noise hits both alike. Run by hand, it is not a test:

    .venv/bin/python bench/outbox_bench.py                      # 3000 records, 5 rounds
    .venv/bin/python bench/outbox_bench.py --records 10000 --rounds 3 --tmp-dir /var/tmp

"Before" is ``bridge/agent/outbox.py`` as of commit ``a409fcf`` (the last one before the pipeline
package), read from git history, so nothing of it is kept in the tree. ``--before-commit C`` compares
instead with ``bridge/pipeline/outbox.py`` as of commit ``C`` (same API; the modules it imports are
today's), e.g. the one-class outbox before it was split into segments and cursors (issue 32):

    .venv/bin/python bench/outbox_bench.py --before-commit 20f2381 --tmp-dir /var/tmp

Figures, per implementation, median of the rounds:

* **append**: records/s appended, each fsynced (fdatasync) as the agent does, ~1.6 KB records;
  dominated by the disk's flush latency (use a real disk: ``--tmp-dir`` on tmpfs makes fsync free);
* **drain, one at a time**: records/s a synchronous sink's worker moves through: ``read(after, 1)``
  then ``ack`` per record (the file and webhook sinks' pattern; the ack writes the cursor file);
* **drain, batches, routed**: ``read(after, 500)``, the routing metadata of each record (key, type,
  VM id: what the Kafka and Event Hubs sinks put next to each message), then one ``ack`` (the broker
  sinks' pattern). Before, those sinks parsed each payload for it (``record_meta`` of that commit,
  reproduced below); now it comes from the frame header (``Entry.meta``);
* **recovery**: records/s scanned when an outbox holding them is opened (start-up after a crash).

Targets: each "after" figure at least 0.9 times its "before" (no regression above 10 %), judged on
the median of the per-round ratios (the columns show the median rates). The exit code is
0 whatever the figures unless ``--strict``.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
BEFORE_COMMIT = "a409fcf"
TARGET_RATIO = 0.9
# Two sinks, so the records stay on disk until both drained them: one reads a record at a time (the
# file and webhook sinks' pattern), the other in batches of 500 (the Kafka sink's).
SINKS = ["one", "batch"]

from benchkit import sample_record  # noqa: E402

from bridge.pipeline import Outbox, RecordMeta  # noqa: E402


def load_before(
    workdir: Path, commit: str = BEFORE_COMMIT, path: str = "bridge/agent/outbox.py"
) -> ModuleType:
    """The previous outbox module, from git history."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:{path}"],
        capture_output=True,
        check=True,
    ).stdout
    path = workdir / "outbox_before.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("outbox_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["outbox_before"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


class Subject:
    """One implementation behind the calls the bench makes."""

    def __init__(
        self,
        name: str,
        opener: Callable[[Path], Any],
        appender: Callable[[Any, dict, bytes], None],
        route: Callable[[Any], str],
    ):
        self.name, self.open, self.append, self.route = name, opener, appender, route


def record_meta_before(entry: Any) -> str:
    """What the Kafka and Event Hubs sinks did per record before (``bridge/sinks/base.py`` at
    a409fcf, ``record_meta``): parse the payload for the routing fields. Returns the key."""
    record = orjson.loads(entry.payload)
    vm = record.get("vm") or {}
    vm_id = vm.get("vmId")
    key = vm_id or vm.get("name") or entry.record_id
    _ = (str(record.get("recordType", "")), int(record.get("schemaVersion", 0)))
    return key


def subjects(before: ModuleType, same_api: bool) -> list[Subject]:
    limits = {"max_records": 1_000_000, "max_bytes": 1 << 34}
    return [
        Subject(
            "before",
            lambda d: before.Outbox(d, SINKS, **limits),
            lambda box, record, payload: box.append(RecordMeta.of(record), payload),
            lambda entry: entry.meta.key,
        )
        if same_api
        else Subject(
            "before",
            lambda d: before.Outbox(d, SINKS, **limits),
            lambda box, record, payload: box.append(record["recordId"], payload),
            record_meta_before,
        ),
        Subject(
            "after",
            lambda d: Outbox(d, SINKS, **limits),
            lambda box, record, payload: box.append(RecordMeta.of(record), payload),
            lambda entry: entry.meta.key,
        ),
    ]


def one_round(subject: Subject, records: list[tuple[dict, bytes]], root: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    n = len(records)
    directory = root / f"{subject.name}-{time.monotonic_ns()}"
    box = subject.open(directory)
    started = time.perf_counter()
    for record, payload in records:
        subject.append(box, record, payload)
    out["append"] = n / (time.perf_counter() - started)
    box.close()

    started = time.perf_counter()
    box = subject.open(directory)
    out["recovery"] = n / (time.perf_counter() - started)

    for sink, size, key in (("one", 1, "drain, one at a time"), ("batch", 500, "drain, batches, routed")):
        started, cursor, count = time.perf_counter(), 0, 0
        while batch := box.read(cursor, size):
            if size > 1:
                keys = [subject.route(entry) for entry in batch]
                assert keys[-1] == "bench-vm", keys[-1]
            cursor, count = batch[-1].seq, count + len(batch)
            box.ack(sink, cursor)
        out[key] = n / (time.perf_counter() - started)
        assert (cursor, count) == (n, n), (subject.name, sink, cursor, count)
    box.close()
    shutil.rmtree(directory)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tmp-dir", default=None, help="where the outboxes go (a real disk)")
    parser.add_argument("--json", default=str(REPO / "bench" / "results" / "outbox.json"))
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--before-commit", help="compare with bridge/pipeline/outbox.py at this commit")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="se-outbox-bench-", dir=args.tmp_dir))
    try:
        if args.before_commit:
            before = load_before(root, args.before_commit, "bridge/pipeline/outbox.py")
        else:
            before = load_before(root)
        impls = subjects(before, same_api=bool(args.before_commit))
        records = []
        for n in range(args.records):
            record = sample_record(n, "bench-vm")
            records.append((record, orjson.dumps(record)))
        size = sum(len(p) for _, p in records) / len(records)
        print(f"{args.records} records of {size:.0f} bytes, {args.rounds} interleaved rounds, in {root}")
        runs: dict[str, list[dict[str, float]]] = {s.name: [] for s in impls}
        for r in range(args.rounds):
            for subject in impls if r % 2 == 0 else reversed(impls):
                runs[subject.name].append(one_round(subject, records, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    figures = {
        name: {k: statistics.median(run[k] for run in rounds) for k in rounds[0]}
        for name, rounds in runs.items()
    }
    # The verdict is on the median of the per-round ratios: both ran back to back in each round, so a
    # slow moment of the disk (fsync latency varies by 10 % and more here) hits both of a pair.
    ratios = {
        k: statistics.median(a[k] / b[k] for a, b in zip(runs["after"], runs["before"], strict=True))
        for k in figures["before"]
    }
    missed = 0
    print(f"\n{'records/s (median)':<24}{'before':>12}{'after':>12}{'after/before':>14}")
    for key, ratio in ratios.items():
        verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
        missed += verdict == "FAIL"
        before, after = figures["before"][key], figures["after"][key]
        print(f"{key:<24}{before:>12.0f}{after:>12.0f}{ratio:>13.2f}x  {verdict}")
    result = {
        "records": args.records,
        "rounds": args.rounds,
        "figures": figures,
        "ratios": ratios,
        "runs": runs,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(f"\nwritten to {args.json}")
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
