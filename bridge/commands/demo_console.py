"""``se-bridge demo --console``: a fleet of three VMs and the ops console, left running for a person.

The scripted demo shows the product in a minute and stops; this one keeps a small fleet running so
someone can open the console, watch events arrive, approve one and see it go through. Every part
is the real product in its own process, as it would be deployed: the IMDS emulator serving three
VMs of one availability set (each its own document and private address, 127.x.y.z), an agent per
VM (file sink, signed relay on the VM's address), the fleet approver (decisions file, audit file)
and ``se-bridge console`` in lab mode (a random token printed once). A new user-initiated Reboot
is scheduled every ``EVENT_EVERY`` seconds, so there is always something to approve; the platform's
own events (a Freeze) come too. Ctrl-C (or SIGTERM) stops everything.
"""

from __future__ import annotations

import contextlib
import json
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bridge.support.fsutil import ensure_private_dir

VMS = 3
EVENT_EVERY = 120.0  # seconds between two new user Reboots
CONSOLE_PORT = 8720


class ConsoleDemo:
    def __init__(self, output: Path, port: int) -> None:
        self.output = output
        self.port = port
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = output / "logs"
        self.emulator_url = ""

    # -- starting -----------------------------------------------------------------------------------

    def _spawn(self, name: str, *args: str, stdout: int | None = None) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            [sys.executable, "-m", *args], stdout=stdout or log, stderr=log, stdin=subprocess.DEVNULL
        )
        log.close()
        self.procs.append(proc)
        return proc

    def start(self) -> str:
        """Start every part; the console's address with its lab token."""
        ensure_private_dir(self.logs)
        keys = self.output / "keys"
        ensure_private_dir(keys)
        from bridge.decisions import generate_key_pair

        # As text: key files are read as text and stripped, so raw random bytes ending in a
        # whitespace byte (one run in 40) were one byte short and refused.
        (keys / "relay.key").write_bytes(secrets.token_hex(32).encode())
        private, public = generate_key_pair()  # the console signs; the approver and agents prove
        (keys / "console.key").write_bytes(private)
        (keys / "console.pub").write_bytes(public)
        (keys / "approvers-sign.key").write_bytes(secrets.token_bytes(32).hex().encode())
        for name in ("relay.key", "console.key", "approvers-sign.key"):
            (keys / name).chmod(0o600)
        first_ip = f"127.{random.randint(20, 250)}.{random.randint(0, 250)}.1"
        emulator = self._spawn(
            "emulator", "bridge.imds.emulator", "--port", "0", "--fleet", str(VMS),
            "--fleet-first-ip", first_ip, "--approval-delay", "5", stdout=subprocess.PIPE,
        )  # fmt: skip
        assert emulator.stdout is not None
        info = json.loads(emulator.stdout.readline() or b"{}")
        if "fleet" not in info:
            raise RuntimeError("the IMDS emulator did not start (logs/emulator.log)")
        self.emulator_url = info["url"]
        streams = []
        for vm in info["fleet"]:
            state = self.output / vm["name"]
            streams.append(f"file://{state / 'records.jsonl'}")
            self._spawn(
                f"agent-{vm['name']}", "bridge", "agent", "--imds-url", vm["url"],
                "--sink", streams[-1], "--state-dir", str(state / "state"),
                "--listen", f"{vm['privateIp']}:8710", "--relay-key", f"relay={keys / 'relay.key'}",
                "--decision-key", f"console={keys / 'console.pub'}", "--heartbeat-interval", "20",
            )  # fmt: skip
        decisions, audit = self.output / "decisions.jsonl", self.output / "audit.jsonl"
        decisions.touch()
        audit.touch()
        sources = [arg for stream in streams for arg in ("--events-source", stream)]
        self._spawn(
            "approver", "bridge", "approver", "--mode", "fleet", "--source", f"file://{decisions}",
            "--sink", f"file://{audit}", "--relay-url-template", "http://{privateIp}:8710",
            "--key", f"console={keys / 'console.pub'}",
            "--sign-key", f"approvers={keys / 'approvers-sign.key'}",
            "--relay-key", f"relay={keys / 'relay.key'}", "--state-dir", str(self.output / "approver"),
            "--listen", "127.0.0.1:0", *sources,
        )  # fmt: skip
        console = self._spawn(
            "console", "bridge", "console", "--auth", "lab", "--sink", f"file://{decisions}",
            "--key", f"console={keys / 'console.key'}", "--state-dir", str(self.output / "console"),
            "--approver-key", f"approvers={keys / 'approvers-sign.key'}",
            "--listen", f"127.0.0.1:{self.port}", "--silent-after", "60",
            *sources, "--events-source", f"file://{audit}", stdout=subprocess.PIPE,
        )  # fmt: skip
        assert console.stdout is not None
        line = console.stdout.readline().decode()  # "console: open http://...?token=..."
        if "http" not in line:
            raise RuntimeError("the console did not start (logs/console.log)")
        self._until_ready(f"http://127.0.0.1:{self.port}/readyz")
        return line.split("open ", 1)[1].strip()

    def _until_ready(self, url: str, timeout: float = 60.0) -> None:
        """The address is printed once the console has read the fleet's records (its /readyz)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), opener.open(url, timeout=2) as answer:
                if answer.status == 200:
                    return
            if self.dead() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError("the console did not become ready (logs/console.log)")

    # -- running ------------------------------------------------------------------------------------

    def schedule(self, body: dict[str, Any]) -> None:
        request = urllib.request.Request(
            f"{self.emulator_url}/_emulator/fleet/events",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # local: never a proxy
        with opener.open(request, timeout=10) as answer:
            answer.read()

    def user_reboot(self) -> None:
        names = [f"fleet-vm-{i:03d}" for i in range(VMS)]
        self.schedule({"eventType": "Reboot", "eventSource": "User", "resources": names,
                       "noticeSeconds": 900, "startedSeconds": 20})  # fmt: skip

    def platform_freeze(self) -> None:
        self.schedule({"eventType": "Freeze", "eventSource": "Platform", "resources": ["fleet-vm-001"],
                       "noticeSeconds": 300, "startedSeconds": 5})  # fmt: skip

    def dead(self) -> subprocess.Popen[bytes] | None:
        return next((p for p in self.procs if p.poll() is not None), None)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
            if proc.poll() is None:
                proc.kill()


def run_console_demo(output: Path) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("the console needs its extra: pip install 'scheduled-events-bridge[console]' (make demo does)")
        return 2
    output = output.resolve()
    ensure_private_dir(output)
    demo = ConsoleDemo(output, _port())
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        url = demo.start()
        say = [
            f"A fleet of {VMS} VMs (one availability set), an agent on each, the fleet approver, a console:",
            f"\n  open  {url}\n",
            f"A user Reboot of the set now and every {EVENT_EVERY:.0f} s, a platform Freeze now: approve one",
            f"in the console and watch it go through. Logs and records in {output}. Ctrl-C stops everything.",
        ]
        print("\n".join(say), flush=True)
        demo.user_reboot()
        demo.platform_freeze()
        next_event = time.monotonic() + EVENT_EVERY
        while not stopping:
            time.sleep(0.5)
            if (dead := demo.dead()) is not None:
                print(f"a part of the demo stopped (exit {dead.returncode}); see {output / 'logs'}")
                return 1
            if time.monotonic() >= next_event:
                demo.user_reboot()
                next_event += EVENT_EVERY
        return 0
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, OSError) as exc:
        print(f"the console demo could not start: {exc}")
        return 1
    finally:
        demo.stop()


def _port() -> int:
    """8720 (the console's default) when free, else any free port."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", CONSOLE_PORT))
            return CONSOLE_PORT
        except OSError:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
