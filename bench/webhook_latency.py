"""Webhook latency: IMDS answer carrying a change -> the webhook receiver has the POST, p50/p99.

Why: a Spot eviction gives 30 s of notice, and what a consumer can still do depends on when the
record reaches it. ``bench/poll_bench.py`` measures the agent up to the record being durable in a file;
this measures the whole path to an HTTP endpoint: outbox append + fsync, the delivery worker's wake-up,
encoding (JSON, CloudEvents or Event Grid), the HMAC signature and the POST over the kept-alive
connection (optionally TLS).

How:

* the IMDS emulator (``python -m bridge.imds.emulator --port 0 --rate-limit 0``) and the agent
  (``python -m bridge agent --sink <webhook> --listen off --log-level warning``) are real processes;
  the receiver is ``tests/peers/http_receiver.py`` in this process, answering 202, stamping each request
  with ``time.time()`` once its body is read;
* the bench makes ``--changes`` document changes (add an event, complete it, ...) spaced by a jittered
  gap, and afterwards reads the emulator's ``firstServed`` stamps (the wall-clock time the answer that
  carried each incarnation was completely written to the agent);
* latency of a record = receiver stamp - ``firstServed[documentIncarnation]``. The poll phase is not in
  it (the poll interval only decides when the agent asks), so it is what the bridge adds.

Benchmarks are not tests: the exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import requests
from benchkit import summarize

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from peers.http_receiver import HttpReceiver, make_tls_files  # noqa: E402


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """No proxy variables and no ``SE_BRIDGE_*`` from the caller's shell (they would change the run)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().endswith("_PROXY") and not k.startswith("SE_BRIDGE_")
    }
    return env | extra


def start_emulator(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge.imds.emulator", "--port", "0", "--rate-limit", "0"],
        stdout=subprocess.PIPE,
        stderr=open(workdir / "emulator.log", "wb"),  # noqa: SIM115 - the child's for its lifetime
        env=child_env({}),
        cwd=REPO,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("the emulator did not start")
    return proc, orjson.loads(line)["url"]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def record_of(body: bytes, fmt: str) -> dict[str, Any]:
    doc = orjson.loads(body)
    if fmt == "cloudevents":
        return doc["data"]
    if fmt == "eventgrid":
        return doc[0]["data"]
    return doc


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="se-webhook-bench-", dir=args.tmp_dir))
    key = secrets.token_hex(32)
    tls = make_tls_files(workdir / "tls") if args.tls else None
    receiver = HttpReceiver(tls=tls).start()
    emulator, imds_url = start_emulator(workdir)
    control = requests.Session()
    control.trust_env = False
    options = [f"format={args.format}"]
    if args.hmac:
        options.append("hmac_key_env=BENCH_HMAC_KEY")
    if tls is not None:
        options.append(f"ca_file={tls.ca}")
    spec = f"{receiver.url}/hook#{'&'.join(options)}"
    agent_log = open(workdir / "agent.log", "wb")  # noqa: SIM115 - the child's for its lifetime
    agent = subprocess.Popen(
        [
            sys.executable, "-m", "bridge", "agent",
            "--imds-url", imds_url,
            "--sink", spec,
            "--state-dir", str(workdir / "state"),
            "--poll-interval", str(args.poll_interval),
            "--listen", "off",
            "--log-level", "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=agent_log,
        env=child_env({"BENCH_HMAC_KEY": key}),
        cwd=REPO,
    )  # fmt: skip
    rng = random.Random(args.seed)
    try:
        receiver.wait_for(lambda reqs: len(reqs) >= 1, 60, what="the agent's first record")
        live: list[str] = []
        for n in range(args.changes):
            time.sleep(rng.uniform(*args.gap))
            if live and (n % 2 or len(live) > 3):
                event_id = live.pop(0)
                control.post(
                    f"{imds_url}/_emulator/events/{event_id}/complete", timeout=10
                ).raise_for_status()
            else:
                r = control.post(f"{imds_url}/_emulator/events", json={"eventType": "Freeze"}, timeout=10)
                r.raise_for_status()
                live.append(r.json()["eventId"])
            if (n + 1) % 20 == 0:
                print(f"  {n + 1}/{args.changes} changes", file=sys.stderr)
        receiver.wait_for(lambda reqs: len(reqs) >= args.changes + 1, 60, what="every record at the receiver")
        state = control.get(f"{imds_url}/_emulator/state", timeout=10).json()
    finally:
        stop(agent)
        agent_log.close()
        stop(emulator)
        receiver.stop()

    first_served = state["firstServed"]
    changed_at = {str(h["incarnation"]): h["changedAt"] for h in state["history"]}
    bridge_ms: list[float] = []
    end_to_end_ms: list[float] = []
    for req in receiver.requests()[1:]:  # the first record is the agent's first observation
        incarnation = str(record_of(req.body, args.format)["documentIncarnation"])
        bridge_ms.append((req.arrived - first_served[incarnation]) * 1000)
        end_to_end_ms.append((req.arrived - changed_at[incarnation]) * 1000)
    return {
        "format": args.format,
        "hmac": args.hmac,
        "tls": args.tls,
        "pollInterval": args.poll_interval,
        "changes": args.changes,
        "requests": len(receiver.requests()),
        "connections": receiver.connections,
        "bridgeMs": summarize(bridge_ms),
        "endToEndMs": summarize(end_to_end_ms),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=100, help="document changes to make (default 100)")
    parser.add_argument("--format", choices=("json", "cloudevents", "eventgrid"), default="cloudevents")
    parser.add_argument("--no-hmac", dest="hmac", action="store_false", help="do not sign the requests")
    parser.add_argument("--tls", action="store_true", help="HTTPS with a private CA (needs cryptography)")
    parser.add_argument("--poll-interval", type=float, default=0.2)
    parser.add_argument(
        "--gap",
        type=float,
        nargs=2,
        default=(0.4, 0.7),
        metavar=("MIN", "MAX"),
        help="seconds between changes",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--tmp-dir", default=None, help="where state goes (a real disk: fsync on tmpfs is free)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return 0
    b, e = result["bridgeMs"], result["endToEndMs"]
    print(
        f"webhook sink, format={result['format']}, hmac={result['hmac']}, tls={result['tls']}, "
        f"poll interval {result['pollInterval']} s, {b['n']} records, "
        f"{result['connections']} connection(s)"
    )
    print(f"  IMDS answer sent -> receiver has the POST: p50 {b['p50']:.2f} ms  p99 {b['p99']:.2f} ms  "
          f"(min {b['min']:.2f}, max {b['max']:.2f})")  # fmt: skip
    print(f"  change in IMDS   -> receiver has the POST: p50 {e['p50']:.2f} ms  p99 {e['p99']:.2f} ms  "
          "(includes the wait for the next poll)")  # fmt: skip
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
