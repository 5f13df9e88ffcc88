"""Real processes for integration tests: the IMDS emulator and the agent, over loopback HTTP.

Nothing is mocked: the agent is ``python -m bridge agent`` in its own process, talking HTTP to the
emulator in another process, writing to a real file sink; tests can SIGKILL it and start it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import requests

PY = sys.executable
# The relay key every test agent requires and every test approver signs with (agents refuse unsigned
# relay requests, loopback included). Tests that attack the relay use other keys or none.
RELAY_KEY = b"relay-key-of-the-test-suite-0123456789abcdef"


def ed25519_key(seed: str) -> Any:
    """A deterministic Ed25519 private key (the same in every process and xdist worker)."""
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed.encode()).digest())


# The suite's decision signing key: decide, the console, test code and coordinating fleet approvers
# sign with it; every test agent trusts its public half (key ids ``ops`` and ``coordinator``), as
# agents hold only public decision keys (issue 31). Tests of other keys make their own.
DECISION_KEY = ed25519_key("decisions of the test suite")


def pem_files(workdir: Path, name: str, private: Any) -> tuple[Path, Path]:
    """``workdir/NAME.key`` (private, 0600) and ``workdir/NAME.pub`` for an Ed25519 key."""
    from cryptography.hazmat.primitives import serialization

    key_file, pub_file = workdir / f"{name}.key", workdir / f"{name}.pub"
    key_file.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_file.chmod(0o600)
    pub_file.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key_file, pub_file


def decision_public_pem() -> str:
    from cryptography.hazmat.primitives import serialization

    return (
        DECISION_KEY.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def decision_public_file(workdir: Path) -> Path:
    path = workdir / "decisions-of-the-suite.pub"
    if not path.exists():
        _, pub = pem_files(workdir, "decisions-of-the-suite", DECISION_KEY)
        assert pub == path
    return path


def names_decision(audit: dict[str, Any], decision_id: str) -> bool:
    """Whether an approver's audit record is about ``decision_id``: as its own id, or (a message
    refused before it was proven) as what it claimed, under ``unverified``."""
    return decision_id in (audit.get("decisionId"), (audit.get("unverified") or {}).get("decisionId"))


def relay_post(api: str, body: Any, timeout: float = 60.0) -> tuple[int, dict[str, Any]]:
    """POST ``body`` to an agent's relay API (``http://host:port``), signed with the suite's relay key."""
    from bridge.signing import sign_request

    data = orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    headers.update(sign_request("relay", RELAY_KEY, "POST", "/v1/start-requests", data))
    resp = requests.post(
        f"{api}/v1/start-requests", data=data, headers=headers, timeout=timeout, proxies={"http": ""}
    )
    return resp.status_code, resp.json()


def proven_body(
    event_id: str,
    decision_id: str | None = None,
    *,
    target: str = "vm-bridge-0",
    issued_by: str = "tests",
    ttl: float = 600,
    key: Any = None,
    key_id: str = "ops",
    **extra: Any,
) -> dict[str, Any]:
    """A relay request body for one decision, carrying the signed decision itself as an approver
    relays it (the agent proves it: issue 31). ``extra`` goes into the request, not the decision."""
    import uuid

    from bridge.decisions import new_decision, sign

    draft = new_decision(event_id, target, issued_by, ttl)
    draft["decisionId"] = decision_id or f"d-{uuid.uuid4()}"
    decision = sign(draft, key_id, DECISION_KEY if key is None else key)
    return {
        "decisionId": decision["decisionId"], "eventIds": [event_id], "target": target,
        "issuedBy": issued_by, "expiresAt": decision["expiresAt"], "decision": decision, **extra,
    }  # fmt: skip


def relay_key_file(workdir: Path) -> Path:
    path = workdir / "relay.key"
    if not path.exists():
        path.write_bytes(RELAY_KEY)
        path.chmod(0o600)
    return path


def stop_all(procs: list[subprocess.Popen[bytes]], timeout: float = 15.0) -> list[int]:
    """SIGTERM every process, wait for each, kill what has not stopped by then: their exit codes."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


def wait_until(
    predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


class Emulator:
    """``python -m bridge.imds.emulator`` as a subprocess, plus its control API."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [PY, "-m", "bridge.imds.emulator", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("emulator did not start")
        self.info: dict[str, Any] = orjson.loads(line)  # url, and with --fleet each VM's url and address
        self.url: str = self.info["url"]
        self.http = requests.Session()
        self.http.trust_env = False

    def control(self, method: str, path: str, body: Any = None) -> Any:
        r = self.http.request(method, f"{self.url}/_emulator/{path}", json=body, timeout=10)
        assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()

    def add_event(self, **spec: Any) -> str:
        return self.control("POST", "events", spec)["eventId"]

    def state(self) -> dict[str, Any]:
        return self.control("GET", "state")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Agent:
    """``python -m bridge agent`` with a file sink in ``workdir``; restartable on the same state."""

    def __init__(
        self,
        imds_url: str,
        workdir: Path,
        *extra: str,
        sink: str | None = None,
        env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.imds_url = imds_url
        self.prefix = prefix  # a command the agent runs under (strace, runuser, prlimit ...)
        self.workdir = workdir
        self.sink_path = workdir / "records.jsonl"
        self.sink = sink or f"file://{self.sink_path}"
        self.state_dir = workdir / "state"
        self.log_path = workdir / "agent.log"
        self.extra = extra
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.api: str | None = None

    def start(self, *more: str, first_record: bool = True) -> Agent:
        """Start the agent; unless told otherwise, wait for the record of its first observation (so
        that events a test creates afterwards are changes, not events already ``present``)."""
        before = len(self.records())
        args = [
            *self.prefix,
            PY,
            "-m",
            "bridge",
            "agent",
            "--imds-url",
            self.imds_url,
            "--sink",
            self.sink,
            "--state-dir",
            str(self.state_dir),
            "--poll-interval",
            "0.2",
            "--listen",
            "127.0.0.1:0",
            "--imds-first-timeout",
            "10",
            "--shutdown-timeout",
            "3",
            "--relay-key",
            f"relay={relay_key_file(self.workdir)}",
            "--decision-key",
            f"ops={decision_public_file(self.workdir)}",
            "--decision-key",
            f"coordinator={decision_public_file(self.workdir)}",
            # No heartbeat unless a test asks (--heartbeat-interval N later wins): they come on
            # wall-clock boundaries and would land among the records a test counts.
            "--heartbeat-interval",
            "0",
            *self.extra,
            *more,
        ]
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=self.env)
        log.close()
        started = wait_until(lambda: self._find_log("agent started"), 15, what="agent start")
        listen = started["listen"]
        if isinstance(listen, str):  # a Unix socket
            self.api = f"unix:{listen}"
        else:
            host, port = listen
            self.api = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        if first_record:
            wait_until(lambda: len(self.records()) > before, 15, what="first record")
        return self

    # -- observation --------------------------------------------------------------------------------

    def logs(self, all_runs: bool = True) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        data = self.log_path.read_bytes()
        if not all_runs:
            data = data[self._log_offset :]
        out = []
        for line in data.splitlines():
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                out.append({"msg": line.decode(errors="replace"), "level": "raw"})
        return out

    def _find_log(self, msg: str) -> dict[str, Any] | None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"agent exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
            )
        return next((e for e in self.logs(all_runs=False) if e.get("msg") == msg), None)

    def records(self, record_type: str | None = "scheduledEvents") -> list[dict[str, Any]]:
        """Records in the file sink, of one type (``None``: every record)."""
        if not self.sink_path.exists():
            return []
        records = [orjson.loads(line) for line in self.sink_path.read_bytes().splitlines() if line.strip()]
        return [r for r in records if record_type is None or r.get("recordType") == record_type]

    def changes(self) -> list[tuple[str, str]]:
        return [(c["eventId"], c["change"]) for r in self.records() for c in r["changes"]]

    def wait_for_change(self, event_id: str, change: str, timeout: float = 15.0) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            for record in self.records():
                if any(c["eventId"] == event_id and c["change"] == change for c in record["changes"]):
                    return record
            return None

        return wait_until(find, timeout, what=f"{change} of {event_id}")

    def get(self, path: str) -> requests.Response:
        assert self.api is not None
        return requests.get(self.api + path, timeout=5, proxies={"http": "", "https": ""})

    def metric(self, name: str, **labels: str) -> float:
        assert self.api is not None
        return scrape(self.api, name, **labels)

    # -- lifecycle ----------------------------------------------------------------------------------

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.terminate()
        return self.proc.wait(20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def decide(
    sink: str,
    event_id: str,
    key_file: Path,
    *,
    target: str = "vm-bridge-0",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``se-bridge decide`` (key id ``ops``) and return what it printed; fail on a non-zero exit."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridge",
            "decide",
            "--sink",
            sink,
            "--event-id",
            event_id,
            "--target",
            target,
            "--key-id",
            "ops",
            "--key-file",
            str(key_file),
            "--reason",
            "tests",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = orjson.loads(proc.stdout)
    result["output"] = proc.stdout + proc.stderr
    return result


def docker_available() -> str | None:
    """None when a Docker daemon answers within a few seconds, else why not."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"no Docker daemon answers ({type(exc).__name__}: {str(exc)[:120]})"
    return None


def scrape(base_url: str, name: str, headers: dict[str, str] | None = None, **labels: str) -> float:
    """The sum of the ``name`` samples matching ``labels`` on a service's ``/metrics`` (scraped over
    HTTP, as Prometheus does: tests never read the client library's internals)."""
    text = requests.get(
        base_url + "/metrics", headers=headers, timeout=5, proxies={"http": "", "https": ""}
    ).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        base, _, lab = key.partition("{")
        if base == name and all(f'{k}="{v}"' in lab for k, v in labels.items()):
            total += float(value)
    return total


def approver_api(workdir: Path, timeout: float = 30.0) -> str:
    """The base URL of the approver's API (``--listen 127.0.0.1:0``), from its last start log line."""

    def listening() -> str | None:
        path = workdir / "approver.log"
        found = None
        for line in path.read_bytes().splitlines() if path.exists() else []:
            if b"--- approver start ---" in line:
                found = None  # an earlier run's address is not this run's
            elif b'"approver started"' in line:
                found = orjson.loads(line).get("listen")
        return found

    return "http://" + wait_until(listening, timeout, what="the approver's listener")


def approver_command(workdir: Path, source: str, sink: str, relay: str, key: Any, *extra: str) -> list[str]:
    """``se-bridge approver`` with the decision key ``ops`` and its state in ``workdir/approver-state``.
    ``key``: an Ed25519 private key (its public half, ``workdir/ops.pub``, is the approver's; the
    private one, ``workdir/ops.key``, is what ``decide`` signs with), or HMAC bytes (a migration)."""
    key_file = workdir / "ops.key"
    if isinstance(key, bytes):
        key_file.write_bytes(key)
    else:
        _, key_file = pem_files(workdir, "ops", key)
    return [
        PY, "-m", "bridge", "approver", "--source", source, "--sink", sink, "--relay", relay,
        "--key", f"ops={key_file}", "--state-dir", str(workdir / "approver-state"), "--relay-timeout", "3",
        "--relay-key", f"relay={relay_key_file(workdir)}", "--listen", "127.0.0.1:0",
        *extra,
    ]  # fmt: skip


def start_approver(
    workdir: Path,
    source: str,
    sink: str,
    relay: str,
    key: Any,
    *extra: str,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start the approver; its JSON log is appended to ``workdir/approver.log``, each run after a marker."""
    with open(workdir / "approver.log", "ab") as log:
        log.write(b'{"msg": "--- approver start ---"}\n')
        log.flush()
        return subprocess.Popen(
            approver_command(workdir, source, sink, relay, key, *extra),
            stderr=log,
            stdout=subprocess.DEVNULL,
            env=env,
        )


def make_changes(emulator: Emulator, agent: Agent) -> list[dict[str, Any]]:
    """Five document changes, each waited for in the file sink so each is a record of its own, and the
    impact record of each of the two events once it ended (bridge.agent.impact): eight records."""
    first = emulator.add_event(eventType="Freeze", durationInSeconds=5)
    agent.wait_for_change(first, "scheduled")
    emulator.control("POST", f"events/{first}/start")
    agent.wait_for_change(first, "started")
    second = emulator.add_event(eventType="Reboot")
    agent.wait_for_change(second, "scheduled")
    emulator.control("POST", f"events/{first}/complete")
    agent.wait_for_change(first, "completed")
    emulator.control("POST", f"events/{second}/cancel")
    agent.wait_for_change(second, "canceled")
    wait_until(lambda: len(agent.records("impact")) == 2, 15, what="both impact records")
    return agent.records(None)
