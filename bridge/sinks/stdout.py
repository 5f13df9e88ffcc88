"""``stdout:``: one record per line on standard output (containers, journald, piping into jq)."""

from __future__ import annotations

import sys

from bridge.pipeline import Entry, SynchronousSink


class StdoutSink(SynchronousSink):
    scheme = "stdout"

    def deliver(self, entry: Entry) -> None:
        out = sys.stdout.buffer
        out.write(entry.payload + b"\n")
        out.flush()  # confirmed once the pipe took it; an OSError (EPIPE) is retried by the worker
