"""The fleet page's data in pages (issue 33).

Why: ``/api/fleet`` used to hand every page the whole fleet, every VM and every open event: 3.4 MB
at 10 000 VMs (its fetch and parse alone took the page's first frame past 300 ms) and 34 MB at
100 000, built for each page that opened. What a person looks at first is the soonest events and
the VMs that need a look; the rest comes when asked:

* the first answer carries the counts, the first ``FIRST_EVENTS`` open events in NotBefore order,
  and the VM groups (name, size, how many need a look), with the VM lists only of the groups shown
  open: those the page asked for (``open``), and every group with a VM to look at when, in all, at
  most ``OPEN_UP_TO`` need a look (during a fleet-wide wave nobody reads 10 000 entries);
* the next events by cursor (``after``: the last row's sort key), ``MAX_PAGE`` at a time, so rows
  arriving live while a page is still loading are neither lost nor shown twice.

The functions run under the board's lock, over its rows, and return JSON-ready values.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.console.board import EventRow, VmRow

#: Open events in the first answer (the page draws them in its first frame).
FIRST_EVENTS = 100
#: Open events per later page, and at most.
MAX_PAGE = 500
#: A group's VMs listed (those needing a look first; the search box finds the others).
MAX_LISTED = 500
#: Groups described in one answer (sorted by name; the rest counted).
MAX_GROUPS = 2000
#: Groups a page may ask to see open at once.
MAX_OPEN = 20
#: Groups open by themselves when no more VMs than this need a look, in all.
OPEN_UP_TO = 300
#: How long a VM view is served again, and how many are kept (FleetPages).
VIEW_SECONDS = 1.0
MAX_VIEWS = 64
#: How the page may group VMs: its select's values, and the rows' attributes.
GROUP_BY = {
    "resourceGroup": "resource_group",
    "scaleSet": "scale_set",
    "location": "location",
    "zone": "zone",
}

Key = tuple[float, str]


def sort_key(event: EventRow) -> Key:
    """NotBefore (a Started event has none: first), then the id: a total order for the cursor."""
    return (event.not_before_at, event.event_id)


def cursor(key: Key) -> str:
    return f"{key[0]!r}~{key[1]}"


def parse_cursor(text: str) -> Key | None:
    """The page's ``after``; None (from the start) for anything that is not one of ours."""
    at, sep, event_id = text.partition("~")
    try:
        epoch = float(at)
    except ValueError:
        return None
    return (epoch, event_id) if sep and math.isfinite(epoch) else None


def matches_vm(vm: VmRow, wanted: str) -> bool:
    return not wanted or wanted in vm.name.lower() or wanted in vm.resource_group.lower()


def matches_event(event: EventRow, wanted: str) -> bool:
    """The search box on open events (issue 33: "what touches vm-001" found only the VM): the event's
    id, type, status or source, or a VM it names."""
    return (
        not wanted
        or wanted in event.event_id.lower()
        or wanted in event.event_type.lower()
        or wanted in event.status.lower()
        or wanted in event.source.lower()
        or any(wanted in r.lower() for r in event.resources)
    )


def events_page(
    events: Iterable[EventRow], wanted: str, after: Key | None, limit: int
) -> tuple[list[dict[str, object]], str | None, int]:
    """(the next ``limit`` matching events after ``after``, the cursor past them or None at the end,
    how many match in all)."""
    rows = [(sort_key(e), e) for e in events if matches_event(e, wanted)]
    matched = len(rows)
    if after is not None:
        rows = [pair for pair in rows if pair[0] > after]
    # The smallest limit + 1 (is there more?), not a sort of them all: 20 000 events at 100 000 VMs.
    page = heapq.nsmallest(limit + 1, rows, key=lambda pair: pair[0])
    more = len(page) > limit and limit > 0
    page = page[:limit]
    return [e.summary() for _, e in page], cursor(page[-1][0]) if more else None, matched


def _needs_look(vm: VmRow, now: float, silent_after: float) -> bool:
    return bool(vm.events) or vm.silent(now, silent_after)


@dataclass(frozen=True, slots=True)
class VmView:
    """The VM side of a first answer: counts and groups."""

    vms: int
    silent: int
    groups: list[dict[str, object]]
    omitted: int  # groups past MAX_GROUPS


class FleetPages:
    """The answers, built under the board's lock from its rows. VM views (counts and groups) are
    served again for VIEW_SECONDS, by (search, grouping, groups open): every open page asks for them
    every 2 s (silence is an absence no message announces), one costs ~45 ms at 100 000 VMs, and the
    pages mostly ask the same."""

    def __init__(self, silent_after: float) -> None:
        self.silent_after = silent_after
        self._views: dict[tuple[str, str, tuple[str, ...]], tuple[float, VmView]] = {}

    def first(
        self,
        vms: Mapping[str, VmRow],
        events: Mapping[str, EventRow],
        now: float,
        query: str,
        group_by: str,
        opened: Sequence[str],
        limit: int,
    ) -> dict[str, object]:
        wanted = query.strip().lower()
        view = self._view(vms, (wanted, group_by, tuple(opened[:MAX_OPEN])), now)
        shown, after, matched = events_page(events.values(), wanted, None, limit)
        return {
            "now": now,
            "silentAfter": self.silent_after,
            "counts": {"vms": view.vms, "silent": view.silent, "openEvents": matched},
            "groups": view.groups,
            "groupsOmitted": view.omitted,  # past MAX_GROUPS: the search box narrows
            "events": shown,
            "next": after,
        }

    def after(self, events: Mapping[str, EventRow], query: str, after: str, limit: int) -> dict[str, object]:
        shown, following, _ = events_page(events.values(), query.strip().lower(), parse_cursor(after), limit)
        return {"events": shown, "next": following}

    def _view(self, vms: Mapping[str, VmRow], key: tuple[str, str, tuple[str, ...]], now: float) -> VmView:
        found = self._views.get(key)
        if found is not None and 0 <= now - found[0] < VIEW_SECONDS:
            return found[1]
        view = vm_view(vms.values(), *key, now, self.silent_after)
        if len(self._views) >= MAX_VIEWS:  # bounded: the oldest goes (dicts keep insertion order)
            del self._views[next(iter(self._views))]
        self._views.pop(key, None)
        self._views[key] = (now, view)
        return view


def vm_view(
    vms: Iterable[VmRow], wanted: str, by: str, opened: Sequence[str], now: float, silent_after: float
) -> VmView:
    matching = [v for v in vms if matches_vm(v, wanted)]
    groups_, silent, all_groups = groups(matching, by, opened, now, silent_after)
    return VmView(len(matching), silent, groups_, all_groups - len(groups_))


def groups(
    vms: Sequence[VmRow], by: str, opened: Sequence[str], now: float, silent_after: float
) -> tuple[list[dict[str, object]], int, int]:
    """The VM groups by ``by`` (one of GROUP_BY), at most MAX_GROUPS, each with its size, how many of
    its VMs need a look, and, for the groups shown open, its VMs; how many VMs are silent, and how
    many groups there are in all."""
    attribute = GROUP_BY.get(by, "resource_group")
    members: dict[str, list[VmRow]] = {}
    look: dict[str, list[VmRow]] = {}
    silent = 0
    for vm in vms:
        name = getattr(vm, attribute) or "(none)"
        members.setdefault(name, []).append(vm)
        if vm.silent(now, silent_after):
            silent += 1
        if _needs_look(vm, now, silent_after):
            look.setdefault(name, []).append(vm)
    to_look = sum(len(v) for v in look.values())
    wanted_open = set(opened[:MAX_OPEN])
    answer: list[dict[str, object]] = []
    for name in sorted(members)[:MAX_GROUPS]:
        interesting = look.get(name, [])
        group: dict[str, object] = {"name": name, "vms": len(members[name]), "toLook": len(interesting)}
        if name in wanted_open or (interesting and to_look <= OPEN_UP_TO):
            listed = interesting or members[name]
            group["open"] = True
            group["listed"] = [vm.to_json(now, silent_after) for vm in listed[:MAX_LISTED]]
        answer.append(group)
    return answer, silent, len(members)
