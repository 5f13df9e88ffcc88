"""``stdin:``: decisions piped into the approver, one JSON object per line.

For pipes and labs (``se-bridge decide ... | se-bridge approver --source stdin:``): nothing is kept,
so there is no resume after a restart. At the end of the input the source is :attr:`exhausted` and
the approver stops once what it read is finished.
"""

from __future__ import annotations

import sys
import threading

from bridge.streams.base import DecisionSource, Message, Position


class StdinSource(DecisionSource):
    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        self._line = 0
        self._eof = False

    def poll(self, timeout: float) -> list[Message]:
        if self._eof:
            threading.Event().wait(timeout)
            return []
        line = sys.stdin.buffer.readline()
        if not line:
            self._eof = True
            return []
        self._line += 1
        return (
            [Message(line.strip(), Position("stdin", self._line, partitioned=False))] if line.strip() else []
        )

    def commit(self, message: Message) -> None:
        pass

    @property
    def exhausted(self) -> bool:
        return self._eof
