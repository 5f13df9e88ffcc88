"""The fleet approver at 1 000 to 100 000 VMs, by simulation (issue 19 item 6, issue 23 item 7).

One machine cannot run 10 000 agents, but it can run what a fleet approver meets: the events stream
of a fleet, and decisions. This bench produces straight to a local Tansu broker the records of N
synthetic VMs (each its own name, vmId, resource id and loopback address 127.x.y.z), then a
simulated month of maintenance (``--waves`` waves: in each, every VM's record shows one Scheduled
event, then a record without it, as an agent publishes an event that came and went), and measures
one real fleet approver (``python -m bridge approver --mode fleet``) reading it:

* **RSS** after it learned the fleet, and after every wave (the curve must stay flat: events are
  forgotten once no VM shows them);
* **ingest**: records/s the events reader took in (time until ``se_bridge_approver_fleet_vms``
  reached N), and the lag left;
* **decisions**: a burst of ``--decisions`` signed decisions for random VMs of the open wave:
  decisions/s (first publish -> last audit record), the approver's CPU per decision.

What is not real: the agents. Their relay is one stand-in HTTP server on 0.0.0.0 (every 127.x.y.z
reaches it) that answers every relay request ``approved``, as an agent whose IMDS took the
StartRequest would: 10 000 agents cannot run here, and the approver's side is what is measured.
Everything else is the real approver over real sockets (Kafka protocol, HTTP).

    .venv/bin/python bench/fleet_scale_bench.py --vms 1000 5000 10000 --json out.json
    .venv/bin/python bench/fleet_scale_bench.py --vms 100000 --waves 30 --decisions 200
    .venv/bin/python bench/fleet_scale_bench.py --vms 10000 --waves 20 --coordinate   # issue 33
    .venv/bin/python bench/fleet_scale_bench.py --vms 100000 --waves 5 --decisions 200 --restart

With ``--restart`` the approver is then stopped (SIGTERM) and started again on the same state
directory and topics, and the bench times ``/readyz`` 200 and the events stream read to its end
(``se_bridge_events_reader_lag`` 0 with every VM known), with the peak RSS of the restart.

With ``--coordinate`` the approver coordinates (``--coordinate``, the coordinator key): in each wave
every VM also publishes its ``preparation`` (prepared) for its event, the coordinator approves each
event through the stand-in agents, and the RSS after each wave shows whether what it keeps of the
events is forgotten once they are over. The decision burst is skipped (the coordinator decides).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the Tansu fixture (tests/brokers.py)

from benchkit import fleet_topics, produce_keyed, scheduled_events_bytes, stop_process  # noqa: E402
from brokers import TansuBroker  # noqa: E402
from records import preparation as preparation_fixture  # noqa: E402
from records import vm_block as vm_fixture  # noqa: E402

from bridge.decisions import generate_key_pair, new_decision, parse_key, sign  # noqa: E402

# The decision key: Ed25519 (issue 31), what a fleet's approvers verify in production.
OPS_KEY_PEM, OPS_PUB_PEM = generate_key_pair()
OPS_KEY = parse_key(OPS_KEY_PEM, "the bench's ops key")
RELAY_KEY = b"fleet-scale-relay-key-" + b"r" * 32
SUB = "8d10da13-8125-4ba9-a717-bf7490507b3d"
TARGETS = {"rss_mb_10k": 200.0, "decisions_per_s_10k": 200.0}


class StandInAgents(ThreadingHTTPServer):
    """Every synthetic VM's relay: answers each decision ``approved`` (see the module docstring)."""

    daemon_threads = True
    request_queue_size = 512

    def __init__(self) -> None:
        super().__init__(("0.0.0.0", 0), _Relay)
        self.relayed = 0
        self.lock = threading.Lock()


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
        many = body.get("decisions") or [body]
        answers = [
            {"decisionId": d["decisionId"], "outcome": "approved", "reason": None, "documentIncarnation": 2,
             "results": [{"eventId": e, "result": "approved", "detail": None} for e in d["eventIds"]]}
            for d in many
        ]  # fmt: skip
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.relayed += len(many)  # type: ignore[attr-defined]
        data = orjson.dumps({"answers": answers} if "decisions" in body else answers[0])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def vm(index: int) -> dict[str, Any]:
    name = f"sim-vm-{index:06d}"
    return {
        "vmId": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
        "name": name,
        "resourceId": f"/subscriptions/{SUB}/resourceGroups/rg-{index // 1000}/providers/"
        f"Microsoft.Compute/virtualMachines/{name}",
        "privateIp": f"127.{1 + index // 65025}.{(index // 255) % 255}.{1 + index % 255}",
    }


def record(
    machine: dict[str, Any], events: list[dict[str, Any]], ended: dict[str, Any] | None = None
) -> bytes:
    """A VM's record; ``ended``: the event that just left its document (its ``completed`` change)."""
    changes = None
    if ended is not None:
        changes = [{"eventId": ended["eventId"], "change": "completed", "eventType": ended["eventType"],
                    "previousStatus": "Scheduled", "eventStatus": None}]  # fmt: skip
    return scheduled_events_bytes(
        machine, events, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), changes
    )


def prepared(machine: dict[str, Any], event: dict[str, Any]) -> bytes:
    """The ``preparation`` record an agent run with ``coordinate = "fleet"`` publishes."""
    block = vm_fixture(machine["name"], vm_id=machine["vmId"], resource_id=machine["resourceId"],
                       private_ip=machine["privateIp"])  # fmt: skip
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return orjson.dumps(
        preparation_fixture(block, event["eventId"], at=at, resources=tuple(event["resources"]))
    )


def wave_event(wave: int, index: int, set_size: int = 5) -> dict[str, Any]:
    """The event of VM ``index`` in ``wave``: one per availability set of ``set_size`` VMs."""
    first = index - index % set_size
    return {
        "eventId": str(uuid.uuid5(uuid.NAMESPACE_URL, f"wave-{wave}-set-{first}")).upper(),
        "eventType": "Freeze",
        "eventStatus": "Scheduled",
        "resources": [vm(i)["name"] for i in range(first, first + set_size)],
        "notBefore": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 900)),
    }


class Scale:
    def __init__(self, workdir: Path, args: argparse.Namespace) -> None:
        self.workdir, self.args = workdir, args
        self.broker = TansuBroker(workdir).start()
        self.producer = fleet_topics(self.broker.bootstrap, linger_ms=20)
        self.agents = StandInAgents()
        threading.Thread(target=self.agents.serve_forever, daemon=True).start()
        (workdir / "ops.pub").write_bytes(OPS_PUB_PEM)
        (workdir / "relay.key").write_bytes(RELAY_KEY)
        self.port = _free_port()
        self.log = open(workdir / "approver.log", "wb")  # noqa: SIM115 - closed in close()
        self.coordinate_args = self.coordination(workdir)
        self.produced = 0
        self.approver = self.start()

    def start(self) -> subprocess.Popen[bytes]:
        workdir, bootstrap = self.workdir, self.broker.bootstrap
        return subprocess.Popen(
            [sys.executable, "-m", "bridge", "approver", "--mode", "fleet", "--group", "scale",
             "--source", f"kafka://{bootstrap}/decisions", "--events-source", f"kafka://{bootstrap}/events",
             "--relay-url-template", f"http://{{privateIp}}:{self.agents.server_address[1]}",
             "--key", f"ops={workdir / 'ops.pub'}", "--relay-key", f"relay={workdir / 'relay.key'}",
             "--sink", f"file://{workdir}/audit.jsonl", "--state-dir", str(workdir / "state"),
             "--listen", f"127.0.0.1:{self.port}", "--standby-after", "0", *self.coordinate_args],
            env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=self.log, cwd=workdir,
        )  # fmt: skip

    def restart(self) -> dict[str, Any]:
        """SIGTERM, start again on the same state directory (its fleet pins) and topics: how long to
        /readyz 200, and to the events stream read to its end (issue 33: ready said 200 after 7.2 s
        while the backlog took 115 s). Ready must not come before caught up."""
        stop_process(self.approver)
        started = time.monotonic()
        self.approver = self.start()
        ready = caught_up = None
        peak = 0.0
        while time.monotonic() - started < 1800 and (ready is None or caught_up is None):
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/readyz")
                if ready is None and conn.getresponse().status == 200:
                    ready = time.monotonic() - started
            # Caught up: every record of the events topic taken again (counted by the approver;
            # its lag gauge says 0 until its reader has fetched, so it cannot tell this alone).
            read = self.metric("se_bridge_approver_fleet_records_read_total")
            if caught_up is None and read >= self.produced:
                caught_up = time.monotonic() - started
            with contextlib.suppress(OSError, StopIteration):
                peak = max(peak, self.hwm_mb())
            time.sleep(0.1)
        return {
            "restartReadySeconds": None if ready is None else round(ready, 1),
            "restartCaughtUpSeconds": None if caught_up is None else round(caught_up, 1),
            "restartPeakRssMb": round(peak, 1),
            "restartRecords": self.produced,
        }

    def hwm_mb(self) -> float:
        status = Path(f"/proc/{self.approver.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024

    def coordination(self, workdir: Path) -> list[str]:
        if not self.args.coordinate:
            return []
        key_pem, _ = generate_key_pair()
        (workdir / "coordinator.key").write_bytes(key_pem)
        return ["--coordinate", "true", "--coordinate-key", f"coordinator={workdir / 'coordinator.key'}"]

    def produce(self, values: list[tuple[str, bytes]]) -> None:
        self.produced += len(values)  # the events topic's size: what a restart must read again
        produce_keyed(self.producer, "events", values)

    def metric(self, name: str) -> float:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            conn.request("GET", "/metrics")
            for line in conn.getresponse().read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return -1.0

    def wait_metric(self, name: str, value: float, timeout: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.metric(name) == value:
                return time.monotonic() - started
            time.sleep(0.1)
        raise RuntimeError(f"{name} never reached {value} (now {self.metric(name)})")

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    return
            time.sleep(0.1)
        self.log.flush()
        tail = (self.workdir / "approver.log").read_bytes()[-3000:].decode("utf-8", "replace")
        raise RuntimeError(f"the approver never became ready; its log ends:\n{tail}")

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.approver.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.approver.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def audits(self) -> int:
        path = self.workdir / "audit.jsonl"
        return len(path.read_bytes().splitlines()) if path.exists() else 0

    def close(self) -> None:
        stop_process(self.approver)
        self.agents.shutdown()
        self.broker.stop()
        self.log.close()


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="se-fleet-scale-") as tmp:
        run = Scale(Path(tmp), args)
        try:
            machines = [vm(i) for i in range(n)]
            run.wait_ready(120)  # its readers are up: ingest measures reading, not starting
            started = time.monotonic()
            run.produce([(m["name"], record(m, [])) for m in machines])
            learned = run.wait_metric("se_bridge_approver_fleet_vms", n, 600)
            ingest = time.monotonic() - started
            figures: dict[str, Any] = {
                "vms": n,
                "ingestRecordsPerS": round(n / ingest),
                "learnSeconds": round(learned, 1),
            }
            figures["rssLearnedMb"] = round(run.rss_mb(), 1)
            rss_after_waves = []
            for wave in range(args.waves):
                run.produce([(m["name"], record(m, [wave_event(wave, i)])) for i, m in enumerate(machines)])
                run.wait_metric("se_bridge_approver_fleet_events", n // 5, 600)
                if args.coordinate:
                    relayed = run.agents.relayed
                    run.produce(
                        [(m["name"], prepared(m, wave_event(wave, i))) for i, m in enumerate(machines)]
                    )
                    deadline = time.monotonic() + 600
                    while run.agents.relayed < relayed + n // 5 and time.monotonic() < deadline:
                        time.sleep(0.2)  # every event of the wave approved by the coordinator
                    figures["coordinatedApprovals"] = figures.get("coordinatedApprovals", 0) + (
                        run.agents.relayed - relayed
                    )
                elif wave == args.waves - 1:
                    figures.update(decisions(run, machines, wave, args.decisions))
                # the wave is over: each event leaves the documents (an agent's "completed" change)
                run.produce([(m["name"], record(m, [], wave_event(wave, i))) for i, m in enumerate(machines)])
                run.wait_metric("se_bridge_approver_fleet_events", 0, 600)
                rss_after_waves.append(round(run.rss_mb(), 1))
            figures["rssAfterWavesMb"] = rss_after_waves
            figures["rssMb"] = max([figures["rssLearnedMb"], *rss_after_waves])
            if args.restart:
                figures.update(run.restart())
            return figures
        finally:
            run.close()


def decisions(run: Scale, machines: list[dict[str, Any]], wave: int, count: int) -> dict[str, Any]:
    """A burst of ``count`` signed decisions for random VMs of the open wave."""
    from confluent_kafka import Producer

    rng = random.Random(wave)
    picks = [rng.randrange(len(machines)) for _ in range(count)]
    drafts = [new_decision(wave_event(wave, i)["eventId"], machines[i]["name"], "bench", 900) for i in picks]
    signed = [sign(draft, "ops", OPS_KEY) for draft in drafts]
    producer = Producer({"bootstrap.servers": run.broker.bootstrap, "linger.ms": 5})
    before_cpu, before = run.cpu_s(), run.audits()
    first = time.monotonic()
    for decision in signed:
        producer.produce("decisions", orjson.dumps(decision), key=decision["target"].encode())
    producer.flush(30)
    deadline = time.monotonic() + 300
    while run.audits() < before + count and time.monotonic() < deadline:
        time.sleep(0.02)
    took = time.monotonic() - first
    return {
        "decisions": count,
        "decisionsAudited": run.audits() - before,
        "decisionsPerS": round(count / took, 1),
        "cpuMsPerDecision": round((run.cpu_s() - before_cpu) * 1000 / count, 2),
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vms", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--waves", type=int, default=3, help="simulated maintenance waves (a month: 30)")
    parser.add_argument("--decisions", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--coordinate", action="store_true", help="the approver coordinates (see above)")
    parser.add_argument("--restart", action="store_true", help="then restart it: to ready, to caught up")
    args = parser.parse_args()
    results = [measure(n, args) for n in args.vms]
    print(f"\n{'VMs':>8} {'RSS MB':>8} {'after waves':>24} {'ingest/s':>9} {'dec/s':>7} {'CPU ms/dec':>10}")
    for r in results:
        waves = ",".join(str(x) for x in r["rssAfterWavesMb"])
        print(f"{r['vms']:>8} {r['rssMb']:>8} {waves:>24} {r['ingestRecordsPerS']:>9} "
              f"{r.get('decisionsPerS', '-'):>7} {r.get('cpuMsPerDecision', '-'):>10}")  # fmt: skip
        if "coordinatedApprovals" in r:
            print(
                f"{'':>8} coordinated approvals: {r['coordinatedApprovals']} (every event of every wave once)"
            )
    if args.json:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
