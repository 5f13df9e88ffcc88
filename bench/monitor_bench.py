"""The Azure Monitor sink's cost on the agent (issue 26): peak RSS with and without it, same run.

What runs: the IMDS emulator and two real agents, side by side: a baseline with a file sink only, and
one with the file sink and ``azuremonitor://`` (the real azure-monitor-ingestion and azure-identity
clients, against the local Logs Ingestion endpoint of tests/peers/logs_ingestion.py, behind TLS).
``--changes`` events are scheduled and canceled (two records each); the figures are each agent's peak
RSS (``VmHWM``) once every record reached its destination, the difference, and the rows received.

    .venv/bin/python bench/monitor_bench.py                 # about 30 s
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from peers.logs_ingestion import LogsIngestion  # noqa: E402
from procs import Agent, Emulator, wait_until  # noqa: E402

RULE = "dcr-0123456789abcdef0123456789abcdef"


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError("no VmHWM")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--changes", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="monitor-bench-"))
    endpoint = LogsIngestion(
        work, RULE, ("Custom-SeBridgeRecords", "Custom-SeBridgeApprovals", "Custom-SeBridgeFindings")
    )
    emulator = Emulator()
    spec = f"azuremonitor://{endpoint.host}/{RULE}?credential=managed&ca_file={endpoint.ca_file}"
    (work / "base").mkdir()
    (work / "monitor").mkdir()
    base = Agent(emulator.url, work / "base").start()
    monitored = Agent(
        emulator.url, work / "monitor", "--sink", spec, env={**os.environ, **endpoint.env()}
    ).start()
    try:
        for _ in range(args.changes):
            event_id = emulator.add_event(eventType="Freeze")
            monitored.wait_for_change(event_id, "scheduled")
            emulator.control("POST", f"events/{event_id}/cancel")
            monitored.wait_for_change(event_id, "canceled")
        wanted = len(monitored.records(None))
        wait_until(lambda: len({r["RecordId"] for r in endpoint.all_rows()}) >= wanted, 60, what="every row")
        assert base.proc is not None and monitored.proc is not None
        base_mb, monitor_mb = peak_rss_mb(base.proc.pid), peak_rss_mb(monitored.proc.pid)
    finally:
        base.stop()
        monitored.stop()
        emulator.stop()
        endpoint.stop()
    print(f"records                          {wanted} (rows received: {len(endpoint.all_rows())})")
    print(f"agent peak RSS, file sink        {base_mb:.1f} MB")
    print(f"agent peak RSS, + azuremonitor   {monitor_mb:.1f} MB (+{monitor_mb - base_mb:.1f} MB)")
    print(f"requests to the endpoint         {len(endpoint.requests)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
