"""Decisions held across an agent outage (issue 23 item 1): a burst of decisions for one VM, its
agent killed (SIGKILL) part way and restarted after ``--outage`` seconds on the same state and port,
as systemd does with ``RestartSec``.

Before (``--before``, the approver that gave a decision up after three relay attempts within about
1.5 s and committed it as ``failed/relayUnavailable``): most of the burst was lost for good. Now a
decision no agent answered waits uncommitted and is relayed again until the agent answers or it
expires.

Figures: decisions whose event got its StartRequest (exactly once), lost (never posted), doubled,
final audits that are not ``approved``, and recovery (agent restarted -> last StartRequest). Same
processes as bench/approval_bench.py (the emulator with IMDS's 5/s limit, an agent, a local approver
reading a decisions file). Run by hand:

    .venv/bin/python bench/outage_bench.py --outage 5
    .venv/bin/python bench/outage_bench.py --outage 30 --json out.json
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from approval_bench import REPO, Run, before_tree

BEFORE_COMMIT = "b326de6"  # issue 21's commit: the approver before decisions were held for agents


class OutageRun(Run):
    def kill_agent(self) -> list[str]:
        """SIGKILL the agent; the command line to start it again (same state, same port)."""
        argv = list(self.agent.args)  # type: ignore[arg-type]
        self.agent.send_signal(signal.SIGKILL)
        self.agent.wait(10)
        return argv

    def restart_agent(self, argv: list[str]) -> None:
        log = open(self.workdir / "services.log", "ab")  # noqa: SIM115 - closed with the process
        self.agent = subprocess.Popen(argv, env=self.env, stderr=log, cwd=self.workdir)

    def audits(self) -> list[dict[str, Any]]:
        path = self.workdir / "audit.jsonl"
        return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def measure(pythonpath: Path, before: bool, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="se-outage-bench-") as tmp:
        run = OutageRun(pythonpath, Path(tmp), before)
        try:
            events = run.add_events(args.burst)
            run.decide(events[: args.burst // 5])  # the burst starts...
            deadline = time.monotonic() + 30
            while len(run.state()["startRequests"]) < args.burst // 10 and time.monotonic() < deadline:
                time.sleep(0.02)
            argv = run.kill_agent()  # ...the agent dies part way (a crash, an OOM kill)...
            run.decide(events[args.burst // 5 :])  # ...and the rest of the burst arrives meanwhile
            time.sleep(args.outage)
            run.restart_agent(argv)
            restarted = time.monotonic()
            done = run.started_at(events, timeout=args.outage + 120)
            recovery = max(done.values()) - restarted if done else float("nan")
            time.sleep(2.0)  # the last audit records
            state = run.state()
            final: dict[str, dict[str, Any]] = {}
            for audit in run.audits():
                final.setdefault(audit["decisionId"], audit)
            return {
                "decisions": len(events),
                "posted": len(done),
                "postedOnce": sum(1 for e in events if state["startRequests"].get(e) == 1),
                "lost": len(events) - len(done),
                "doubled": sum(1 for n in state["startRequests"].values() if n > 1),
                "auditsNotApproved": sum(1 for a in final.values() if a["outcome"] != "approved"),
                "recoverySeconds": round(recovery, 2),
            }
        finally:
            run.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE_COMMIT)
    parser.add_argument("--burst", type=int, default=150)
    parser.add_argument("--outage", type=float, default=5.0, help="seconds the agent stays down")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-before", action="store_true", help="measure this tree only")
    args = parser.parse_args()
    results: dict[str, Any] = {"outageSeconds": args.outage}
    if not args.no_before:
        with tempfile.TemporaryDirectory(prefix="se-outage-before-") as old:
            results["before"] = measure(before_tree(args.before, Path(old)), True, args)
    results["after"] = measure(REPO, False, args)
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    if args.json:
        args.json.write_bytes(orjson.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
