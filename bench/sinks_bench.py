"""Sinks benchmark: the issue-3 targets for Kafka, Event Hubs and webhook, in one command.

Why this exists: a Spot eviction gives 30 s of notice, and a record only helps once it has left the VM.
``bench/poll_bench.py`` stops at "durable in the outbox / file"; the single-sink benches
(``kafka_drain.py``, ``eventhubs_latency.py``, ``webhook_latency.py``) each follow one sink. Here ONE
agent carries every sink at once, as a real deployment would, so the figures include the sinks
competing for the same process, GIL and 2 cores:

* **Latency per sink** (target p99 <= 20 ms): from the emulator's ``firstServed[incarnation]`` (wall
  clock when the IMDS answer carrying the change was completely written to the agent; the poll phase is
  excluded) to the moment the record reached the peer:

  - Kafka: the broker's LogAppendTime if the topic uses it; otherwise (Tansu) when a consumer tailing
    the topic received the record. Tansu stamps messages with the producer's CreateTime, which is when
    the sink called ``produce()``, *before* linger and the broker, so it is not an arrival time; it is
    shown as a breakdown ("the agent's share"). Tansu does not answer a fetch early when data arrives,
    so the tail consumer uses ``fetch.wait.max.ms=--kafka-fetch-wait-ms`` (2 ms): the Kafka figure
    includes up to that much measurement delay.
  - Event Hubs: the AMQP 1.0 peer's ``arrived_at`` (the transfer carrying the event was complete).
  - webhook: the HTTP receiver's ``arrived`` (request body read), CloudEvents structured mode.

  Every peer runs in its *own* process (the Tansu binary, and one ``multiprocessing`` child for the
  Kafka tail consumer, the Event Hubs peer and the HTTP receiver each): all three receive the same record
  within a millisecond, and in one Python process their stamps would wait for each other's GIL.
* **Peak RSS** (target <= 80 MB): ``VmHWM`` of the agent, all four sinks loaded, read before it stops.
* **Kafka drain rate** (target >= 2000 records/s): ``bench/kafka_drain.py``'s ``run()`` against the same
  Tansu broker, after the agent has stopped: a 10 000-record outbox drained by the agent's own
  DeliveryWorker and KafkaSink in this process, then read back in order.

    .venv/bin/python bench/sinks_bench.py                      # 60 changes, about 1.5 minutes
    .venv/bin/python bench/sinks_bench.py --changes 20 --drain-records 2000   # smoke run

Benchmarks are not tests: the exit code is 0 whatever the figures, unless ``--strict`` is given (1 when
a target is missed); 2 when the bench could not measure.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import requests
from benchkit import stop_process, summarize

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the tests' broker and peers (tests/brokers.py, tests/peers/)
sys.path.insert(0, str(REPO / "bench"))  # kafka_drain.py

TARGET_P99_MS = 20.0
TARGET_RSS_MB = 80.0  # MB = 10^6 bytes, as in the issue; MiB is printed next to it
TARGET_DRAIN_RPS = 2000.0
START_TIMEOUT = 60.0
EH_CONN_ENV = "SE_BRIDGE_BENCH_EH_CONN"
SINKS = ("kafka", "eventhubs", "webhook")


class BenchError(Exception):
    """Something did not start or died: nothing was measured (not a missed target)."""


# ---------------------------------------------------------------------------------- peer processes


def _peer_main(kind: str, conn: multiprocessing.connection.Connection, options: dict[str, Any]) -> None:
    """One peer in its own process. Sends its address, then answers "collect" with
    ``[(incarnation, arrival epoch, extra), ...]`` until "stop" (or the parent is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if kind == "kafka":
        _kafka_tail(conn, options)
        return
    if kind == "webhook":
        from peers.http_receiver import HttpReceiver

        peer: Any = HttpReceiver().start()
        conn.send(peer.url)

        def collect() -> list[tuple[int, float, Any]]:
            out = []
            for req in peer.requests():
                data = orjson.loads(req.body).get("data") or {}
                out.append((data.get("documentIncarnation"), req.arrived, None))
            return out
    else:
        from peers.amqp_eventhubs import EventHubsPeer

        peer = EventHubsPeer({"hub": 2}).start()
        conn.send(peer.connection_string())

        def collect() -> list[tuple[int, float, Any]]:
            return [
                (orjson.loads(e.body).get("documentIncarnation"), e.arrived_at, None) for e in peer.messages()
            ]

    try:
        while True:
            try:
                command = conn.recv()
            except EOFError:
                break
            if command != "collect":
                break
            conn.send({"stamps": collect(), "errors": list(getattr(peer, "errors", []))})
    finally:
        peer.stop()


def _kafka_tail(conn: multiprocessing.connection.Connection, options: dict[str, Any]) -> None:
    """Tail every partition of the topic; stamp each message with time.time() as poll() returns it."""
    from brokers import TopicReader

    reader = TopicReader(
        options["bootstrap"],
        options["topic"],
        **{
            "fetch.wait.max.ms": options["fetch_wait_ms"],
            "fetch.error.backoff.ms": 10,
            "allow.auto.create.topics": True,  # the tail starts before the agent's first record
        },
    )
    conn.send(options["bootstrap"])
    stamps: list[tuple[int, float, Any]] = []
    try:
        while True:
            msg = reader.consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                arrived = time.time()
                ts_type, ts_ms = msg.timestamp()
                incarnation = orjson.loads(msg.value()).get("documentIncarnation")
                stamps.append((incarnation, arrived, [ts_type, ts_ms]))
                continue
            if conn.poll():
                try:
                    command = conn.recv()
                except EOFError:
                    break
                if command != "collect":
                    break
                conn.send({"stamps": stamps, "errors": []})
    finally:
        reader.close()


class PeerProcess:
    def __init__(self, kind: str, **options: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.kind = kind
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_peer_main, args=(kind, child, options), name=kind, daemon=True)
        self.proc.start()
        child.close()
        try:
            if not self.conn.poll(START_TIMEOUT):
                raise EOFError
            self.address: str = self.conn.recv()
        except EOFError:
            self.stop()
            raise BenchError(f"the {kind} peer did not start (its error is above)") from None

    def collect(self) -> dict[str, Any]:
        self.conn.send("collect")
        if not self.conn.poll(30):
            raise BenchError(f"the {self.kind} peer did not answer")
        return self.conn.recv()

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send("stop")
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


# ---------------------------------------------------------------------------------- processes, helpers


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """No proxy variables and no ``SE_BRIDGE_*`` from the caller's shell (they would change the run)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().endswith("_PROXY") and not k.startswith("SE_BRIDGE_")
    }
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env | extra


def start_emulator(workdir: Path, stack: contextlib.ExitStack) -> str:
    log = stack.enter_context((workdir / "emulator.log").open("wb"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge.imds.emulator", "--port", "0", "--rate-limit", "0"],
        cwd=REPO,
        env=child_env({}),
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    stack.callback(stop_process, proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise BenchError("the emulator did not start")
    return str(orjson.loads(line)["url"])


def status_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmHWM", "VmRSS"):
                out[name] = int(value.split()[0])
    return out


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def machine_info() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": os.getloadavg(),
    }


# ---------------------------------------------------------------------------------- the run


def latency_phase(args: argparse.Namespace, workdir: Path, bootstrap: str) -> dict[str, Any]:
    topic = f"se-bench-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        imds_url = start_emulator(workdir, stack)
        peers: dict[str, PeerProcess] = {}
        for kind, options in (
            ("kafka", {"bootstrap": bootstrap, "topic": topic, "fetch_wait_ms": args.kafka_fetch_wait_ms}),
            ("eventhubs", {}),
            ("webhook", {}),
        ):
            peers[kind] = PeerProcess(kind, **options)
            stack.callback(peers[kind].stop)
        eh_port = peers["eventhubs"].address.split("sb://127.0.0.1:", 1)[1].split(";", 1)[0]
        specs = {
            "kafka": f"kafka://{bootstrap}/{topic}?client_id=se-bridge-bench"
            + "".join(f"&{o}" for o in args.kafka_option),
            "eventhubs": f"eventhubs://127.0.0.1:{eh_port}/hub?connection_string_env={EH_CONN_ENV}",
            "webhook": f"{peers['webhook'].address}/hook#format=cloudevents",
            "file": f"file://{workdir}/records.jsonl",
        }
        command = [sys.executable, "-m", "bridge", "agent", "--imds-url", imds_url]
        for spec in specs.values():
            command += ["--sink", spec]
        command += ["--state-dir", str(workdir / "state"), "--poll-interval", f"{args.poll_interval:g}"]
        command += ["--listen", "off", "--log-level", "warning"]
        agent_log = stack.enter_context(open(workdir / "agent.log", "wb"))
        agent = subprocess.Popen(
            command,
            cwd=REPO,
            env=child_env({EH_CONN_ENV: peers["eventhubs"].address}),
            stdout=subprocess.DEVNULL,
            stderr=agent_log,
            start_new_session=True,
        )
        stack.callback(stop_process, agent)

        def arrivals(kind: str) -> dict[str, Any]:
            got = peers[kind].collect()
            first: dict[int, tuple[float, Any]] = {}
            for incarnation, stamp, extra in got["stamps"]:
                if isinstance(incarnation, int):
                    first.setdefault(incarnation, (stamp, extra))
            return {"first": first, "count": len(got["stamps"]), "errors": got["errors"]}

        def wait_all(incarnations: list[int], timeout: float, what: str) -> dict[str, dict[str, Any]]:
            deadline = time.monotonic() + timeout
            while True:
                if agent.poll() is not None:
                    tail = (workdir / "agent.log").read_text(errors="replace")[-2000:]
                    raise BenchError(f"the agent exited with {agent.returncode}: {tail}")
                seen = {kind: arrivals(kind) for kind in SINKS}
                if all(all(i in seen[k]["first"] for i in incarnations) for k in SINKS):
                    return seen
                if time.monotonic() > deadline:
                    missing = {k: [i for i in incarnations if i not in seen[k]["first"]] for k in SINKS}
                    raise BenchError(f"timed out waiting for {what}: missing {missing}")
                time.sleep(0.2)

        control = requests.Session()
        control.trust_env = False
        state = control.get(f"{imds_url}/_emulator/state", timeout=10).json()
        initial = int(state["history"][-1]["incarnation"])
        wait_all([initial], START_TIMEOUT, "the agent's first record at every sink")
        print(f"agent up with 4 sinks; making {args.changes} changes", file=sys.stderr, flush=True)

        rng = random.Random(args.seed)
        busy_start = cpu_ticks()
        changes: list[int] = []
        live: list[str] = []
        for n in range(args.changes):
            time.sleep(rng.uniform(*args.gap))
            if agent.poll() is not None:
                raise BenchError(f"the agent exited with {agent.returncode}")
            completing = bool(live) and (n % 2 == 1 or len(live) > 3)
            if completing:
                r = control.post(f"{imds_url}/_emulator/events/{live.pop(0)}/complete", timeout=10)
            else:
                r = control.post(f"{imds_url}/_emulator/events", json={"eventType": "Freeze"}, timeout=10)
            r.raise_for_status()
            answer = r.json()
            if not completing:
                live.append(answer["eventId"])
            changes.append(int(answer["documentIncarnation"]))
            if (n + 1) % 20 == 0:
                print(f"  {n + 1}/{args.changes} changes", file=sys.stderr, flush=True)
        seen = wait_all(changes, 60, "every record at every sink")
        busy_end = cpu_ticks()
        memory = status_kib(agent.pid)
        state = control.get(f"{imds_url}/_emulator/state", timeout=10).json()
        stop_process(agent)
        agent_rc = agent.returncode

    first_served = {int(k): float(v) for k, v in state["firstServed"].items()}
    changed_at = {int(h["incarnation"]): float(h["changedAt"]) for h in state["history"]}
    sinks: dict[str, Any] = {}
    for kind in SINKS:
        first = seen[kind]["first"]
        stamps = {i: first[i][0] for i in changes}
        if kind == "kafka":
            # CreateTime is librdkafka's produce() call, before linger and the broker: not an arrival.
            # LogAppendTime is the broker's write (1 ms steps), better than the tail consumer's wake-up.
            types = sorted({first[i][1][0] for i in changes})
            broker_stamped = types == [2]
            if broker_stamped:
                stamps = {i: first[i][1][1] / 1000 for i in changes}
        attributable = [(stamps[i] - first_served[i]) * 1000 for i in changes if i in first_served]
        entry = {
            "spec": specs[kind],
            "delivered": sum(1 for i in changes if i in first),
            "messages": seen[kind]["count"],
            "peerErrors": seen[kind]["errors"],
            "attributable_ms": summarize(attributable),
            "end_to_end_ms": summarize([(stamps[i] - changed_at[i]) * 1000 for i in changes]),
        }
        if kind == "kafka":
            entry["timestampTypes"] = types
            entry["arrivalStamp"] = "LogAppendTime" if broker_stamped else "consumer receive time"
            entry["timestamp_ms"] = summarize([first[i][1][1] - first_served[i] * 1000 for i in changes])
        sinks[kind] = entry
    log_text = (workdir / "agent.log").read_text(errors="replace")
    return {
        "command": shlex.join(command),
        "changes": len(changes),
        "sinks": sinks,
        "allCpusBusyPercent": 100 * (busy_end[0] - busy_start[0]) / max(1, busy_end[1] - busy_start[1]),
        "agentPeakRssKiB": memory["VmHWM"],
        "agentRssKiB": memory["VmRSS"],
        "agentExit": agent_rc,
        "agentLogLines": [ln for ln in log_text.splitlines() if ln.strip()][-20:],
    }


def drain_phase(args: argparse.Namespace, workdir: Path, bootstrap: str) -> dict[str, Any]:
    import kafka_drain

    drain_dir = workdir / "drain"
    drain_dir.mkdir()
    topic = f"se-drain-{uuid.uuid4().hex[:8]}"
    return kafka_drain.run(args.drain_records, bootstrap, topic, drain_dir, verify=True)


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(results: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    m = results["machine"]
    print()
    print(f"machine: nproc {m['nproc']}, CPU {m['cpu_model']}, Linux {m['kernel']}, Python {m['python']}")
    print("load average at start: " + " / ".join(f"{x:.2f}" for x in m["loadavg_at_start"]))
    print(f"bench command: {results['benchCommand']}")
    lat = results["latency"]
    print(f"agent command: {lat['command']}")
    print(
        f"{lat['changes']} changes, one every {args.gap[0]:.1f}-{args.gap[1]:.1f} s, poll interval "
        f"{args.poll_interval:g} s; latency = arrival at the peer - emulator firstServed (ms); "
        f"all CPUs {lat['allCpusBusyPercent']:.0f} % busy meanwhile"
    )
    print()
    kafka = lat["sinks"]["kafka"]
    stamp = {
        "kafka": "broker LogAppendTime (1 ms steps)"
        if kafka["arrivalStamp"] == "LogAppendTime"
        else f"tail consumer receive time (fetch.wait.max.ms={args.kafka_fetch_wait_ms})",
        "eventhubs": "AMQP peer arrived_at",
        "webhook": "HTTP receiver arrived",
    }
    rows = [("sink", "arrival stamp", "delivered", "p50", "p99", "max", "end-to-end p50")]
    for kind in SINKS:
        s = lat["sinks"][kind]
        a = s["attributable_ms"]
        rows.append(
            (
                kind,
                stamp[kind],
                f"{s['delivered']}/{lat['changes']}",
                fmt(a["p50"]),
                fmt(a["p99"]),
                fmt(a["max"]),
                fmt(s["end_to_end_ms"]["p50"]),
            )
        )
        if kind == "kafka" and s["arrivalStamp"] != "LogAppendTime":
            c = s["timestamp_ms"]
            types = ",".join({0: "none", 1: "CreateTime"}.get(t, str(t)) for t in s["timestampTypes"])
            rows.append(
                ("  (info)", f"kafka message timestamp ({types}: produce() called)", "", fmt(c["p50"]),
                 fmt(c["p99"]), fmt(c["max"]), "")
            )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))
    rss = lat["agentPeakRssKiB"] * 1024
    print()
    print(f"agent peak RSS (VmHWM, 4 sinks): {rss / 1e6:.1f} MB ({rss / 2**20:.1f} MiB)")
    drain = results.get("drain")
    if drain:
        print(
            f"Kafka drain: {int(drain['records'])} records in {drain['seconds']:.2f} s = "
            f"{drain['recordsPerSecond']:.0f} records/s, read back in order, "
            f"{int(drain.get('duplicates', 0))} duplicates"
        )
    if lat["agentLogLines"]:
        print(f"agent log (warning and above), last {len(lat['agentLogLines'])} lines:")
        for line in lat["agentLogLines"]:
            print(f"  {line[:300]}")
    for kind in SINKS:
        if lat["sinks"][kind]["peerErrors"]:
            print(f"{kind} peer errors: {lat['sinks'][kind]['peerErrors']}")

    checks = []
    for kind in SINKS:
        p99 = lat["sinks"][kind]["attributable_ms"]["p99"]
        complete = lat["sinks"][kind]["delivered"] == lat["changes"]
        checks.append(
            {
                "target": f"{kind}: bridge-attributable p99 <= {TARGET_P99_MS:g} ms, every change delivered",
                "shown": f"{fmt(p99)} ms",
                "pass": p99 is not None and p99 <= TARGET_P99_MS and complete,
            }
        )
    checks.append(
        {
            "target": f"agent peak RSS with all sinks <= {TARGET_RSS_MB:g} MB",
            "shown": f"{rss / 1e6:.1f} MB",
            "pass": rss / 1e6 <= TARGET_RSS_MB,
        }
    )
    if drain:
        checks.append(
            {
                "target": f"Kafka drain, {int(drain['records'])}-record backlog >= {TARGET_DRAIN_RPS:g}/s",
                "shown": f"{drain['recordsPerSecond']:.0f} records/s",
                "pass": drain["recordsPerSecond"] >= TARGET_DRAIN_RPS,
            }
        )
    print()
    print("targets:")
    for c in checks:
        print(f"  {'PASS' if c['pass'] else 'FAIL'}  {c['target']}: {c['shown']}")
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=60, help="document changes to time (default 60)")
    parser.add_argument("--gap", type=float, nargs=2, default=(1.0, 1.5), metavar=("MIN", "MAX"),
                        help="seconds between changes, uniform jitter (default 1.0 1.5)")  # fmt: skip
    parser.add_argument("--poll-interval", type=float, default=0.2, help="agent poll interval (default 0.2)")
    parser.add_argument("--drain-records", type=int, default=10_000, help="Kafka backlog size; 0 skips it")
    parser.add_argument("--kafka-fetch-wait-ms", type=int, default=2,
                        help="fetch.wait.max.ms of the tail consumer = its measurement delay")  # fmt: skip
    parser.add_argument("--kafka-option", action="append", default=[], metavar="NAME=VALUE",
                        help="extra Kafka sink option, e.g. linger_ms=0 (repeatable)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=None, help="jitter seed (default: random, printed)")
    parser.add_argument("--tmp-dir", type=Path, default=None, help="state and logs (a real disk: fsync)")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "sinks.json",
                        help="write every figure here (default bench/results/sinks.json)")  # fmt: skip
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(2**31)

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    results: dict[str, Any] = {
        "machine": machine_info(),
        "benchCommand": shlex.join([sys.executable, *sys.argv])
        + ("" if "--seed" in sys.argv else f" --seed {args.seed}"),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    workdir = Path(tempfile.mkdtemp(prefix="se-sinks-bench-", dir=args.tmp_dir))
    try:
        from brokers import TansuBroker

        with TansuBroker(workdir) as broker:
            results["latency"] = latency_phase(args, workdir, broker.bootstrap)
            if args.drain_records > 0:
                print(f"draining a {args.drain_records}-record backlog to Kafka", file=sys.stderr, flush=True)
                results["drain"] = drain_phase(args, workdir, broker.bootstrap)
    except KeyboardInterrupt:
        print("interrupted: every process stopped, temporary files removed", file=sys.stderr)
        return 130
    except (BenchError, RuntimeError, AssertionError, OSError, requests.RequestException) as exc:
        print(f"the bench could not measure: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    checks = report(results, args)
    results["checks"] = checks
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
        print(f"\nevery figure, each latency sample included: {args.json}")
    if args.strict and not all(c["pass"] for c in checks):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
