"""Reading the events stream to its end (bridge/streams/follow.py): "caught up" decides when a fleet
approver and the console say ready (issue 33: a poll that came back empty while the consumer was
still fetching a 1.1 M-record backlog made a restarted fleet approver ready 108 s too early)."""

from __future__ import annotations

import threading

import orjson
from records import heartbeat, vm_block

from bridge.records.reader import Reader
from bridge.streams.base import DecisionSource, Message, Position


class Scripted(DecisionSource):
    """Polls answer from a script: a list of messages, or [] (an empty poll) with what ``behind``
    says at that moment."""

    def __init__(self, script: list[tuple[list[bytes], int | None]]) -> None:
        super().__init__("scripted:")
        self.script = script
        self.now_behind: int | None = None
        self.read = 0

    def open(self) -> None:
        pass

    def poll(self, timeout: float) -> list[Message]:
        if not self.script:
            self.now_behind = 0
            return []
        payloads, self.now_behind = self.script.pop(0)
        out = [
            Message(p, Position("line", self.read + i + 1, partitioned=False)) for i, p in enumerate(payloads)
        ]
        self.read += len(out)
        return out

    def behind(self) -> int | None:
        return self.now_behind

    def commit(self, message: Message) -> None:
        pass

    def close(self) -> None:
        pass


def heartbeat_record() -> bytes:
    return orjson.dumps(heartbeat(vm_block("vm-a")))


def run(source: Scripted) -> list[int]:
    from bridge.streams.follow import follow

    stop = threading.Event()
    taken: list[object] = []
    caught: list[int] = []

    def caught_up() -> None:
        caught.append(len(taken))
        stop.set()

    follow(source, taken.append, stop, Reader(), caught_up)
    return caught


def test_an_empty_poll_while_the_source_knows_more_waits_is_not_the_end() -> None:
    record = heartbeat_record()
    source = Scripted([([record] * 10, 90), ([], 90), ([record] * 90, 0)])
    assert run(source) == [100]


def test_a_source_that_cannot_tell_is_caught_up_at_its_first_empty_poll() -> None:
    record = heartbeat_record()
    source = Scripted([([record] * 10, None), ([], None), ([record] * 5, None)])
    assert run(source) == [10]
