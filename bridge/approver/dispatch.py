"""Decisions in flight: per-VM lanes, bounded concurrency, commits in the order messages were read.

The approver used to take one decision at a time: one relay round trip and one StartRequests POST
each, so a burst of 200 decisions took minutes and every VM waited behind every other. Now:

* each message goes to the **lane** of its target VM. Lanes run concurrently (at most ``workers`` at
  once); one lane is one VM: a lane worker takes what has queued in it (up to a batch) and relays
  those decisions to the VM's agent in one request, in their order, which the agent posts to IMDS as
  one StartRequests. Up to ``per_lane`` batches of one lane are in flight at once (issue 19): a
  decision arriving while the previous one waits for the agent's IMDS slot is sent at once, and the
  agent, which coalesces concurrent requests into its next POST, makes it wait one slot, not two;
* a decision id is **claimed** while one worker processes it (:class:`Claims`): the same id read
  twice (a replay, or the owner's and the standby's copy of one message) waits for the first to be
  final, then is a replay or a re-read, never a second relay at the same time;
* at most ``max_in_flight`` messages are read and not yet finished: reading stops while the bound is
  reached (a slow agent cannot make the approver hold an unbounded backlog in memory);
* **commits** happen in the order the messages were read within each partition, each once it and
  every message before it in its partition are finished: a source position (a Kafka offset, an
  Event Hubs checkpoint, a file line) never moves past a decision that is still in flight, so a
  crash re-reads exactly what was not finished, and the decision store and the agent's ledger keep
  that re-read harmless (exactly once per decision).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bridge.approver.messages import MAX_MESSAGE_BYTES, loads_object
from bridge.decisions import Decision
from bridge.streams import Message

log = logging.getLogger(__name__)


@dataclass
class Slot:
    """One message read and not yet committed (and, while no agent answers, its retries)."""

    message: Message
    done: bool = False
    unreached: int = 0  # relay rounds in which no agent of the event answered
    maybe_sent: bool = False  # one of them may have reached an agent (connected, no answer)
    unreached_since: float | None = None
    decision: Decision | None = None  # once proven valid (the parking reads it, not the message)
    standby: bool = False  # the standby's copy of a message another instance owns (never committed)
    _fields: tuple[dict[str, Any] | None] | None = field(default=None, repr=False)

    @property
    def fields(self) -> dict[str, Any] | None:
        """The message's JSON object, parsed once and *not trusted*: what routing (its lane), the
        decision-id claims and a refusal's ``unverified`` part read before or instead of validation
        (which parses strictly, once more, to prove it). None when it is no JSON object, or too
        large to be a decision (never parsed)."""
        if self._fields is None:
            payload = self.message.payload
            self._fields = (loads_object(payload) if len(payload) <= MAX_MESSAGE_BYTES else None,)
        return self._fields[0]


class Parking:
    """Decisions that reached no agent wait here, uncommitted, and go back to their lane when due
    (issue 23: a decision an agent provably never got was given up after ~1.5 s, and a restarting
    agent made the approver drop decisions for good). ``expire(slot)`` ends one whose decision
    expired while it waited; ``resubmit(slot)`` queues it on its lane again."""

    def __init__(self, resubmit: Callable[[Slot], bool], expire: Callable[[Slot], None]) -> None:
        self._resubmit = resubmit
        self._expire = expire
        self._cond = threading.Condition()
        self._waiting: list[tuple[float, float, int, Slot]] = []  # (due, expires, order, slot)
        self._order = 0

    def park(self, slot: Slot, delay: float, expires_at: float) -> None:
        with self._cond:
            self._order += 1
            due = time.time() + delay
            self._waiting.append((min(due, expires_at), expires_at, self._order, slot))
            self._waiting.sort(key=lambda item: item[:3])
            self._cond.notify_all()

    @property
    def count(self) -> int:
        with self._cond:
            return len(self._waiting)

    def run(self, stop: threading.Event) -> None:
        """Hand back what is due until ``stop`` (what still waits then is read again after a restart:
        it was never committed)."""
        while not stop.is_set():
            with self._cond:
                now = time.time()
                due = [item for item in self._waiting if item[0] <= now]
                self._waiting = [item for item in self._waiting if item[0] > now]
                wait = self._waiting[0][0] - now if self._waiting else 0.5
            for _, expires_at, _, slot in due:
                if expires_at <= time.time():
                    self._expire(slot)
                elif not self._resubmit(slot):
                    return  # stopping
            with self._cond:
                self._cond.wait(min(max(wait, 0.01), 0.5))


class OrderedCommits:
    """Commits finished messages in read order *per partition* (see the module docstring).

    A source position is cumulative within a partition (a Kafka offset, an Event Hubs sequence
    number), not across partitions: one slow decision holds back its own partition's commits only.
    (It used to hold every partition's: under a burst a standby then saw the whole group stand still
    and acted on decisions their owners were about to finish.)

    Lane threads only mark messages finished; the commits themselves are made by the thread that
    polls the source (:meth:`commit_ready`), because a consumer is driven by one thread: a Kafka
    consumer's synchronous commit from another thread can wait for the very poll it blocks."""

    def __init__(self, commit: Callable[[list[Message]], None]) -> None:
        self._commit = commit  # finished messages at the heads of their partitions, oldest first
        self._cond = threading.Condition()
        self._orders: dict[str, deque[Slot]] = {}
        self._count = 0

    def track(self, message: Message) -> Slot:
        slot = Slot(message)
        partition = message.position.partition
        with self._cond:
            self._orders.setdefault(partition, deque()).append(slot)
            self._count += 1
        return slot

    def finished(self, slot: Slot) -> None:
        with self._cond:
            slot.done = True
            self._cond.notify_all()

    def commit_ready(self) -> int:
        """Commit every finished message at the head of its partition (on the polling thread)."""
        with self._cond:
            ready = []
            for order in self._orders.values():
                while order and order[0].done:
                    ready.append(order.popleft().message)
            self._count -= len(ready)
        if ready:
            self._commit(ready)
        return len(ready)

    @property
    def pending(self) -> int:
        with self._cond:
            return self._count

    def wait_drained(self, stop: threading.Event) -> None:
        """Commit as messages finish until every tracked one was committed, or ``stop`` is set."""
        while not stop.is_set():
            self.commit_ready()
            with self._cond:
                if not self._count:
                    return
                self._cond.wait(0.2)


class Claims:
    """Decision ids being processed, one worker each (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: set[str] = set()

    def claim(self, key: str) -> bool:
        """Take ``key``; False when another worker holds it."""
        with self._cond:
            if key in self._held:
                return False
            self._held.add(key)
            return True

    def release(self, key: str) -> None:
        with self._cond:
            self._held.discard(key)
            self._cond.notify_all()

    def wait_released(self, key: str, stop: threading.Event) -> bool:
        """Wait until nobody holds ``key``; False when ``stop`` came first."""
        with self._cond:
            while key in self._held:
                if stop.is_set():
                    return False
                self._cond.wait(0.2)
        return True


class Lanes:
    """Per-key FIFO lanes drained by a bounded pool, up to ``per_lane`` batches of one lane at once;
    ``drain(key, items)`` processes a batch of one lane and must finish every item it is given (or
    leave it to a re-read when stopping)."""

    def __init__(
        self,
        drain: Callable[[str, list[Slot]], None],
        *,
        workers: int,
        max_in_flight: int,
        batch: int,
        per_lane: int = 1,
    ) -> None:
        self._drain = drain
        self._batch = batch
        self._per_lane = per_lane
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lane")
        self._room = threading.BoundedSemaphore(max_in_flight)
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Slot]] = {}
        self._running: dict[str, int] = {}  # lane -> workers draining it now

    def add(self, key: str, slot: Slot, stop: threading.Event) -> bool:
        """Queue ``slot`` on lane ``key``; waits while ``max_in_flight`` are in flight. False when
        stopping before there was room."""
        while not self._room.acquire(timeout=0.2):
            if stop.is_set():
                return False
        with self._lock:
            self._queues.setdefault(key, deque()).append(slot)
            if self._running.get(key, 0) >= self._per_lane:
                return True
            self._running[key] = self._running.get(key, 0) + 1
        self._pool.submit(self._run, key)
        return True

    def _run(self, key: str) -> None:
        while True:
            with self._lock:
                queue = self._queues.get(key)
                if not queue:
                    self._running[key] -= 1
                    if not self._running[key]:
                        del self._running[key]
                        self._queues.pop(key, None)
                    return
                batch = [queue.popleft() for _ in range(min(self._batch, len(queue)))]
            try:
                self._drain(key, batch)
            except Exception:  # the drain finishes its items itself; this only keeps the lane alive
                log.exception("lane failed", extra={"lane": key})
            finally:
                for _ in batch:
                    self._room.release()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)
