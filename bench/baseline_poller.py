"""The baseline the agent is measured against: a Scheduled Events poller written like Microsoft's sample.

Why it looks the way it does: the benchmark has to answer "how much cheaper is the agent than what a
customer would otherwise run", and what customers run is the documented Python sample: a loop around
``requests.get`` (a new session, hence a new TCP connection, on every call), ``resp.json()`` on every
answer, a ``DocumentIncarnation`` comparison, and ``time.sleep``. The only additions are the ones the
benchmark needs to observe it: each new document is written as one line to ``--out`` and fsynced (the
agent's file sink fsyncs too, so both pay for durability), and SIGTERM ends it with exit code 0.

Nothing here is optimised on purpose; making it faster would flatter the agent's ratio less, but it
would also stop being the thing customers actually copy.

Usage: ``python bench/baseline_poller.py --url http://127.0.0.1:PORT --out FILE --interval 1.0``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from types import FrameType

import requests

API_VERSION = "2020-07-01"
HEADERS = {"Metadata": "true"}

# SIGTERM arrives at any point of the loop. While a line is being written and fsynced the handler only
# sets a flag (so the output never ends with half a line); anywhere else it exits at once, which also
# interrupts time.sleep instead of waiting for the rest of the interval.
_busy = False
_stop = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _stop
    _stop = True
    if not _busy:
        sys.exit(0)


def get_scheduled_events(url: str) -> dict:
    """One poll, as in the sample: a fresh ``requests.get`` and ``resp.json()`` every time."""
    resp = requests.get(url, headers=HEADERS, params={"api-version": API_VERSION}, timeout=10)
    return resp.json()


def main(argv: list[str] | None = None) -> int:
    global _busy
    parser = argparse.ArgumentParser(description="Microsoft-sample style Scheduled Events poller (baseline).")
    parser.add_argument("--url", required=True, help="IMDS base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--out", required=True, help="file to append one JSON line per new document to")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds to sleep between polls")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)

    endpoint = args.url.rstrip("/") + "/metadata/scheduledevents"
    last_incarnation = None
    with open(args.out, "a", encoding="utf-8") as out:
        while not _stop:
            try:
                data = get_scheduled_events(endpoint)
            except (requests.RequestException, ValueError) as exc:
                # The sample has no error handling; a benchmark run should survive a hiccup, though.
                print(f"poll failed: {exc}", file=sys.stderr)
                data = None
            if data is not None and data.get("DocumentIncarnation") != last_incarnation:
                last_incarnation = data.get("DocumentIncarnation")
                _busy = True
                out.write(json.dumps(data) + "\n")
                out.flush()
                os.fsync(out.fileno())
                _busy = False
            if _stop:
                break
            time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
