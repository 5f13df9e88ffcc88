"""Event Hubs sink latency: IMDS answer received -> the Event Hubs peer stored the event, p50/p99.

Why this exists: a Spot eviction gives 30 seconds' notice, and the record is only useful if it reaches
the consumers' hub quickly. The poll benchmark (``bench/poll_bench.py``) stops at "durable in the
outbox / file"; this one follows the record through the Event Hubs sink (background sender thread,
``EventDataBatch``, the azure-eventhub SDK's AMQP 1.0 transport) to the moment the hub accepted it.

How:

* A fresh IMDS emulator (``python -m bridge.imds.emulator --port 0 --rate-limit 0``), the local AMQP
  1.0 Event Hubs peer of the tests (``tests/peers/amqp_eventhubs.py``, in this process, on a loopback
  port) and the agent as a real process with ``--sink eventhubs://127.0.0.1:PORT/hub?...`` and a
  connection string in its environment (``UseDevelopmentEmulator=true``: plain AMQP, no TLS).
* The bench creates or completes an event every 1.0-1.5 s (jittered). For each incarnation it takes
  the emulator's ``firstServed`` stamp (wall clock when the answer carrying it was completely written
  to the agent, see docs/emulator.md) and the peer's ``arrived_at`` stamp (wall clock when the transfer
  carrying the event was complete). Both clocks are this machine's. ``attributable`` = arrived_at -
  firstServed: what the agent and the sink add, poll phase excluded; ``end_to_end`` starts at the
  emulator's ``changedAt`` instead, so it includes waiting for the next poll.
* The first record (the agent's first observation, which also pays the AMQP connection set-up) is
  excluded, like a warm-up.

Benchmarks are not tests: the exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from benchkit import emulator_control, stop_process, summarize

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from peers.amqp_eventhubs import EventHubsPeer  # noqa: E402 - the tests' peer, found via sys.path

START_TIMEOUT = 60.0


def child_env(connection_string: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().endswith("_PROXY") and not k.startswith("SE_BRIDGE_")
    }
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["SE_BRIDGE_BENCH_EH_CONN"] = connection_string
    return env


class Emulator:
    def __init__(self, log_path: Path) -> None:
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in stop_process()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridge.imds.emulator", "--port", "0", "--rate-limit", "0"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError("the emulator did not start")
        self.url = str(orjson.loads(line)["url"])
        parts = urlsplit(self.url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80

    def control(self, method: str, path: str, body: Any = None) -> Any:
        return emulator_control(self.host, self.port, method, path, body)

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    emulator = Emulator(workdir / "emulator.log")
    peer = EventHubsPeer({"hub": 2}).start()
    agent_log = open(workdir / "agent.log", "wb")  # noqa: SIM115 - closed below
    spec = f"eventhubs://127.0.0.1:{peer.port}/hub?connection_string_env=SE_BRIDGE_BENCH_EH_CONN"
    agent = subprocess.Popen(
        [
            sys.executable, "-m", "bridge", "agent",
            "--imds-url", emulator.url,
            "--sink", spec,
            "--state-dir", str(workdir / "state"),
            "--poll-interval", f"{args.poll_interval:g}",
            "--listen", "off",
            "--log-level", "warning",
        ],
        cwd=REPO,
        env=child_env(peer.connection_string()),
        stdout=subprocess.DEVNULL,
        stderr=agent_log,
        start_new_session=True,
    )  # fmt: skip
    rng = random.Random(args.seed)
    changes: list[int] = []
    try:
        wait_for(lambda: len(peer.messages()) >= 1, START_TIMEOUT, "the agent's first record at the peer")
        pending: str | None = None
        for n in range(args.changes):
            time.sleep(rng.uniform(1.0, 1.5))
            if agent.poll() is not None:
                raise RuntimeError(f"the agent exited with {agent.returncode}")
            if pending is None:
                answer = emulator.control("POST", "events", {"eventType": "Freeze", "noticeSeconds": 900})
                pending = answer["eventId"]
            else:
                answer = emulator.control("POST", f"events/{pending}/complete")
                pending = None
            changes.append(int(answer["documentIncarnation"]))
            if not args.quiet and (n + 1) % 10 == 0:
                print(f"  {n + 1}/{args.changes} changes", file=sys.stderr)
        wait_for(lambda: len(peer.messages()) >= len(changes) + 1, 60, "every record at the peer")
        state = emulator.control("GET", "state")
    finally:
        stop_process(agent)
        agent_log.close()
        emulator.stop()
        peer.stop()
    arrived: dict[int, float] = {}
    for event in peer.messages():
        incarnation = orjson.loads(event.body).get("documentIncarnation")
        if isinstance(incarnation, int):
            arrived.setdefault(incarnation, event.arrived_at)
    first_served = {int(k): float(v) for k, v in state["firstServed"].items()}
    changed_at = {int(h["incarnation"]): float(h["changedAt"]) for h in state["history"]}
    attributable = [
        (arrived[i] - first_served[i]) * 1000 for i in changes if i in arrived and i in first_served
    ]
    end_to_end = [(arrived[i] - changed_at[i]) * 1000 for i in changes if i in arrived and i in changed_at]
    return {
        "pollInterval": args.poll_interval,
        "changes": len(changes),
        "delivered": sum(1 for i in changes if i in arrived),
        "peerErrors": peer.errors,
        "attributable_ms": summarize(attributable),
        "end_to_end_ms": summarize(end_to_end),
    }


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=40, help="document changes to time (default 40)")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="agent poll interval (default 1.0)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tmp-dir", type=Path, default=None, help="where state and logs go")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="eh-latency-", dir=args.tmp_dir) as tmp:
        results = run(args, Path(tmp))
    a, e = results["attributable_ms"], results["end_to_end_ms"]
    print(
        f"Event Hubs sink, poll interval {results['pollInterval']:g} s, "
        f"{results['delivered']}/{results['changes']} changes delivered"
    )
    for label, figures in (
        ("IMDS answer received -> hub stored (attributable)", a),
        ("IMDS change applied  -> hub stored (end to end)  ", e),
    ):
        print(
            f"  {label}: p50 {fmt(figures['p50'])} ms  p99 {fmt(figures['p99'])} ms"
            f"  (min {fmt(figures['min'])}, max {fmt(figures['max'])})"
        )
    if results["peerErrors"]:
        print(f"  peer errors: {results['peerErrors']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
