"""The impact record's pause measure (issue 25): a Freeze's pause as the agent measures it.

What runs: the IMDS emulator and a real agent; a Freeze event is started, and the agent's process is
frozen (SIGSTOP, then SIGCONT: what a paused guest looks like to its processes on a clock that keeps
counting; this machine cannot pause a whole guest) for 2, 3 and 4 s, measured by the bench itself.
Figures: the injected pause, the agent's ``pauseSeconds`` and clock, and the difference (target:
within 100 ms). A figure, not a test: how close it comes depends on the machine's load.

    .venv/bin/python bench/impact_bench.py
"""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from procs import Agent, Emulator, wait_until  # noqa: E402


def one(pause: float) -> tuple[float, float, str]:
    emulator = Emulator()
    agent = Agent(emulator.url, Path(tempfile.mkdtemp(prefix="impact-bench-"))).start()
    try:
        event_id = emulator.add_event(eventType="Freeze", durationInSeconds=5)
        agent.wait_for_change(event_id, "scheduled")
        emulator.control("POST", f"events/{event_id}/start")
        agent.wait_for_change(event_id, "started")
        time.sleep(1.0)
        assert agent.proc is not None
        frozen = time.monotonic()
        agent.proc.send_signal(signal.SIGSTOP)
        time.sleep(pause)
        agent.proc.send_signal(signal.SIGCONT)
        injected = time.monotonic() - frozen
        time.sleep(1.0)
        emulator.control("POST", f"events/{event_id}/complete")
        record = wait_until(lambda: agent.records("impact"), 15, what="the impact record")[0]
        return injected, record["pauseSeconds"], record["pauseClock"]
    finally:
        agent.stop()
        emulator.stop()


def main() -> int:
    worst = 0.0
    for pause in (2.0, 3.0, 4.0):
        injected, measured, clock = one(pause)
        worst = max(worst, abs(measured - injected))
        off = measured - injected
        print(f"injected {injected:.3f} s -> pauseSeconds {measured:.3f} s ({clock}), off by {off:+.3f} s")
    print(f"  [{'PASS' if worst <= 0.1 else 'MISS'}] every pause within 100 ms (worst {worst * 1000:.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
