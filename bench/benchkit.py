"""What the benchmarks share: percentiles, the emulator's control API, stopping a child process.

The benchmarks run as ``python bench/<name>.py``, so this module is importable as ``benchkit`` from
the script's own directory. ``http.client`` rather than ``requests`` keeps the benchmarks' own CPU and
GIL hold times small while their threads are timing the agent.
"""

from __future__ import annotations

import contextlib
import http.client
import signal
import subprocess
from typing import Any

import orjson


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); with few samples p99 ~ the max."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples: list[float]) -> dict[str, Any]:
    """n, p50, p99, min, max and the rounded samples (for the JSON results)."""
    return {
        "n": len(samples),
        "p50": percentile(samples, 0.50),
        "p99": percentile(samples, 0.99),
        "min": min(samples) if samples else None,
        "max": max(samples) if samples else None,
        "samples": [round(v, 3) for v in samples],
    }


def emulator_control(host: str, port: int, method: str, path: str, body: Any = None) -> Any:
    """One call to the emulator's control API (``/_emulator/<path>``); ``RuntimeError`` on >= 300."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        payload = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, "/_emulator/" + path, body=payload, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status >= 300:
        raise RuntimeError(f"emulator {method} {path} answered {resp.status}: {data[:300]!r}")
    return orjson.loads(data)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; closes its stdout pipe."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
