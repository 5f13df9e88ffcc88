"""Which observations of Azure's channel are news: duplicates dropped, no state moved back.

Event Grid documents at-least-once delivery with the same envelope ``id`` on a redelivery; Resource
Graph rows are updated in place and a poll returns unchanged rows again; the two channels report the
same change twice. So an observation is news only when its content (status, NotBefore, VMs: a moved
NotBefore is news) was not seen for the event before. Deliveries also arrive out of order (a
``Completed`` before its ``Started``): the late one is still published, it happened, but the event's
state (``state`` in the record) never moves back.

Bounded memory: at most ``max_events`` events are remembered, the oldest forgotten first, each by its
state and the hashes of the contents seen (a few 64-bit numbers, not the text: a wave's events were
most of the channel's memory). Delivery ids are not remembered at all: a redelivery carries the same
envelope, so its content is a duplicate already (the map of 200 000 ids only repeated that check).

Across a restart (SIGTERM or kill -9) each event's state is kept (issue 33: ``Completed``, a restart,
then a late ``Started`` was published ``state: Started, late: false``, the state moved back):
``<state-dir>/azure-states.jsonl`` gets a line, fsynced, each time an event's state advances, once its
records are in the outbox (:meth:`EventTracker.persist`), and is read back at start. What else a
restart forgets (delivery ids, contents seen) only makes a redelivery news again: published again
with the same ``recordId`` (deterministic), which a consumer deduplicates as it must for any
at-least-once stream.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast, get_args

from bridge.azure.events import AzureEvent, Status
from bridge.imds.document import STATUS_RANK
from bridge.shell.journal import Journal, Live


@dataclass(frozen=True, slots=True)
class News:
    """An observation worth a record: the event's state after it, and whether it came late (an
    earlier status than one already seen)."""

    state: Status
    late: bool


class EventTracker:
    def __init__(self, max_events: int = 200_000, state_path: Path | None = None) -> None:
        self.max_events = max_events
        self._lock = threading.Lock()
        # Contents are remembered by their 64-bit hashes: two different contents of one event
        # sharing a hash is a chance of about 1 in 10^19 (it would cost that observation's news).
        self._events: OrderedDict[str, tuple[Status, tuple[int, ...]]] = OrderedDict()
        self._journal = None if state_path is None else Journal(state_path)
        self._persisted: dict[str, Status] = {}  # what the file says of each event
        loaded = self._journal.load() if self._journal is not None else {}
        for key, state in loaded.items():
            if state in _STATES:
                self._persisted[key] = cast(Status, state)
                self._events[key] = (cast(Status, state), ())
        while len(self._events) > self.max_events:
            gone, _ = self._events.popitem(last=False)
            self._persisted.pop(gone, None)

    def persist(self, events: Iterable[AzureEvent]) -> None:
        """Make the states these observations left durable (their records are in the outbox now)."""
        if self._journal is None:
            return
        with self._lock:
            changed: list[tuple[str, str]] = []
            for event in events:
                key = event.key
                known = self._events.get(key)
                if known is not None and self._persisted.get(key) != known[0]:
                    self._persisted[key] = known[0]
                    changed.append((key, known[0]))
            tracked = self._events  # the map built (under this lock) only when the journal is rewritten
            self._journal.append(changed, Live(len(tracked), lambda: {k: s for k, (s, _) in tracked.items()}))

    def observe(self, event: AzureEvent) -> News | None:
        """News, or None for a duplicate (the same content as before: a redelivery, a repeated row)."""
        with self._lock:
            key = event.key
            state, seen = self._events.pop(key, (event.event_status, ()))
            self._events[key] = (state, seen)  # most recently seen last
            content = hash(event.content)
            if content in seen:
                return None
            seen += (content,)
            late = STATUS_RANK[event.event_status] < STATUS_RANK[state]
            if not late:
                state = event.event_status
            self._events[key] = (state, seen)
            if len(self._events) > self.max_events:
                gone, _ = self._events.popitem(last=False)
                self._persisted.pop(gone, None)
            return News(state, late)

    def forget(self, event: AzureEvent) -> None:
        """Undo :meth:`observe` for an observation whose records could not be stored, so it is news
        again when it is read again (the source was not committed): nothing is lost to a failure."""
        with self._lock:
            key = event.key
            known = self._events.get(key)
            if known is not None:
                content = hash(event.content)
                self._events[key] = (known[0], tuple(c for c in known[1] if c != content))

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)


_STATES = frozenset(get_args(Status))
