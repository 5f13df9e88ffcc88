"""The standby: no takeover window when a fleet approver dies (issue 19).

Fleet approvers share the decisions topic by partitions (a Kafka consumer group, Event Hubs partition
ownership). When one is killed, its partitions move to a survivor only once the group notices:
Kafka's session timeout (10 s) and a rebalance, Event Hubs' ownership expiry (30 s and more). A
Preempt gives 30 s of notice; half of it used to go by with nobody acting on those decisions.

So every instance also reads *every* partition with a second reader (:meth:`DecisionSource.standby`)
that never commits, and keeps what it read. It asks the group how far the owners got
(:meth:`DecisionSource.group_progress`: Kafka's committed offsets, Event Hubs' checkpoints) a few
times a second. A decision the owner finished is dropped. One it did not finish is acted on here once
it is ``after`` seconds old *and* its partition's progress has not moved for ``after`` seconds: an
owner working through a burst (one VM's hundred decisions wait for that VM's IMDS budget) keeps
moving and is left alone; a dead one stands still. The standby acts through the same lanes and the
same life as any decision, only never commits (it owns no position). Why this is safe:

* at most one StartRequest: the agent's relay posts once per ``decisionId`` (its ledger), whoever
  relays it and however often; the ARM acknowledgement is idempotent too;
* one final outcome: an approver's audit record of a decision has an id derived from the decision
  (``bridge.records.approver_record_id``), so the owner's and the standby's records of the same
  decision are one record to a consumer that deduplicates on ``recordId``, as every consumer must;
* nothing lost: the owner's positions do not move past a decision the standby acted on, so whoever
  owns the partition next reads it again and finds it final (this instance: its store; another: the
  agent's ledger answers the repeat).

Cost while every approver is healthy: each decision read twice (a JSON peek, no validation) and one
progress query per ``PROGRESS_EVERY``. A decision that waits on a slow agent for longer than
``after`` is relayed twice (the second is a ledger hit at the agent).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from bridge.streams import DecisionSource, Message

log = logging.getLogger(__name__)

#: Seconds between two questions to the group about its progress (committed offsets, checkpoints).
PROGRESS_EVERY = 0.2
#: Messages the standby holds at most; reading pauses beyond (a backlog is the owner's to work off).
MAX_HELD = 10_000


class Standby:
    def __init__(
        self,
        reader: DecisionSource,
        owner: DecisionSource,
        act: Callable[[list[Message]], None],
        *,
        after: float,
        on_acted: Callable[[int], None] | None = None,
    ) -> None:
        self.reader = reader
        self.owner = owner  # this instance's group member: what it owns, how far the group got
        self._act = act
        self.after = after
        self._on_acted = on_acted
        self._held: deque[tuple[float, Message]] = deque()
        self._progress: dict[str, int] = {}
        self._moved_at: dict[str, float] = {}  # partition -> when its progress last moved (monotonic)
        self._progress_at = 0.0
        self._progress_lock = threading.Lock()
        self.acted = 0
        self.caught_up = threading.Event()  # the first read found nothing more: ready

    def run(self, stop: threading.Event) -> None:
        """Read, hold and hand over until ``stop``; a failing reader is retried (never fatal)."""
        while not stop.is_set():
            try:
                self.reader.open()
                self._loop(stop)
            except Exception as exc:  # the standby is a safety net: it must never end the approver
                log.warning("standby reader failed; retrying", extra={"error": str(exc)})
                stop.wait(2.0)
        self.reader.close()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            room = len(self._held) < MAX_HELD
            messages = self.reader.poll(0.05) if room else []
            now = time.monotonic()
            if not messages and room:
                self.caught_up.set()
            self._held.extend((now, m) for m in messages)
            self._release(now)
            if not room:
                stop.wait(0.05)

    def _release(self, now: float) -> None:
        """Hand over what waited ``after`` seconds and the group has not finished."""
        if not self._held or now - self._held[0][0] < self.after:
            return
        if now - self._progress_at >= PROGRESS_EVERY:
            self._update_progress(now)
        owned = set(self.owner.ownership())
        due: list[Message] = []
        dropped: list[Message] = []
        kept: list[tuple[float, Message]] = []
        while self._held and now - self._held[0][0] >= self.after:
            read_at, message = self._held.popleft()
            partition, number = message.position.partition, message.position.number
            if number <= self._progress.get(partition, -1) or partition in owned:
                dropped.append(message)  # the owner finished it, or this instance's own reader has it
            elif now - self._moved_at.get(partition, read_at) < self.after:
                kept.append((read_at, message))  # its owner is still moving: not ours yet
            else:
                due.append(message)
        self._held.extendleft(reversed(kept))
        self.reader.commit_many([*dropped, *due])  # the reader forgets them (it moves no position)
        if due:
            self.acted += len(due)
            if self._on_acted is not None:
                self._on_acted(len(due))
            log.warning(
                "standby acts on decisions their owner did not finish in time",
                extra={"count": len(due), "afterSeconds": self.after, "first": str(due[0].position)},
            )
            self._act(due)

    def owner_finished(self, message: Message) -> bool:
        """Whether the group (its owner) has finished ``message``: asked before the standby's copy is
        retried, expired or acknowledged through ARM (issue 33: one approval, two acknowledgements)."""
        now = time.monotonic()
        if now - self._progress_at >= PROGRESS_EVERY:
            self._update_progress(now)
        return message.position.number <= self._progress.get(message.position.partition, -1)

    def _update_progress(self, now: float) -> None:
        with self._progress_lock:
            self._update_progress_locked(now)

    def _update_progress_locked(self, now: float) -> None:
        try:
            progress = self.owner.group_progress()
        except Exception as exc:  # unknown progress: act (the agents' ledgers absorb the repeats)
            log.debug("group progress unknown", extra={"error": str(exc)})
            progress = {}
        for partition, number in progress.items():
            if number != self._progress.get(partition):
                self._moved_at[partition] = now
        self._progress, self._progress_at = progress, now
