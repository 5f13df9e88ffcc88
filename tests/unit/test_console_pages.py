"""The fleet page's data in pages (issue 33): the first answer is small whatever the fleet, the pages
after it bring every open event exactly once, in order, and the groups list VMs only when shown open.

Before: ``/api/fleet`` was every VM and every open event in one answer (3.4 MB at 10 000 VMs); these
tests fail on it (no ``groups``, no ``next``, no ``/api/fleet/events``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from records import event, heartbeat, scheduled_events, vm_block

from bridge.console import fleet_pages
from bridge.console.board import Board

NOW = time.time()


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def take(board: Board, raw: dict[str, Any], now: float = NOW) -> None:
    board.take(board.reader.read(raw), now)


def fleet(vms: int, per_event: int = 5, groups_of: int = 1000) -> tuple[Board, list[str]]:
    """``vms`` VMs reporting now, one Scheduled event per ``per_event`` of them (NotBefore spread)."""
    board = Board(silent_after=900)
    ids = []
    for first in range(0, vms, per_event):
        names = [f"vm-{i:06d}" for i in range(first, min(first + per_event, vms))]
        event_id = str(uuid.UUID(int=first + 1)).upper()
        ids.append(event_id)
        shown = event(event_id, *names, not_before=iso(NOW + 600 + (first * 7919) % 3600))
        for name in names:
            block = vm_block(name, resource_group=f"rg-{int(name[3:]) // groups_of}")
            take(board, scheduled_events(block, [shown], at=iso(NOW)))
    return board, ids


def walk(board: Board, first_limit: int = 100, limit: int = 500) -> list[str]:
    """Every event as the page loads them: the first answer, then by cursor."""
    answer = board.fleet(now=NOW, limit=first_limit)
    seen = [e["eventId"] for e in answer["events"]]  # type: ignore[attr-defined]
    after = answer["next"]
    while after is not None:
        page = board.fleet_events(after=str(after), limit=limit)
        seen += [e["eventId"] for e in page["events"]]  # type: ignore[attr-defined]
        after = page["next"]
    return seen


def test_the_first_answer_is_small_and_the_pages_bring_every_event_once_in_order() -> None:
    board, ids = fleet(10_000)  # 2 000 open events: docs/console.md's scale case
    first = board.fleet(now=NOW)
    assert len(first["events"]) == fleet_pages.FIRST_EVENTS  # type: ignore[arg-type]
    assert first["counts"] == {"vms": 10_000, "silent": 0, "openEvents": 2_000}
    # 10 000 VMs need a look (each shows an event): no group is listed by itself.
    assert all("listed" not in g for g in first["groups"])  # type: ignore[attr-defined]
    assert len(orjson.dumps(first)) < 100_000  # was 3.4 MB, every VM and event
    seen = walk(board)
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    keys = [fleet_pages.sort_key(board._events[i]) for i in seen]
    assert keys == sorted(keys)


def test_events_added_and_ended_between_pages_are_neither_lost_nor_doubled() -> None:
    """The page places a live event itself when it sorts before the last row loaded; a page after
    the cursor brings the others. Together: each open event once."""
    board, _ = fleet(1_000)
    answer = board.fleet(now=NOW, limit=50)
    frontier = fleet_pages.parse_cursor(str(answer["next"]))
    assert frontier is not None
    early = event("E0000000-0000-0000-0000-000000000001", "vm-new-a", not_before=iso(NOW + 1))
    late = event("E0000000-0000-0000-0000-000000000002", "vm-new-b", not_before=iso(NOW + 86_400))
    take(board, scheduled_events(vm_block("vm-new-a"), [early], at=iso(NOW)))
    take(board, scheduled_events(vm_block("vm-new-b"), [late], at=iso(NOW)))
    after = answer["next"]
    rest: list[str] = []
    while after is not None:
        page = board.fleet_events(after=str(after), limit=100)
        rest += [e["eventId"] for e in page["events"]]  # type: ignore[attr-defined]
        after = page["next"]
    assert early["eventId"] not in rest  # before the frontier: the live message places it
    assert late["eventId"] in rest
    assert fleet_pages.sort_key(board._events[early["eventId"]]) < frontier
    assert len(rest) == len(set(rest)) == 1_000 // 5 - 50 + 1


def test_groups_list_their_vms_only_when_shown_open() -> None:
    board, _ = fleet(2_000, per_event=200)  # every VM shows an open event: all need a look
    for i in range(2_000, 2_600):  # 600 quiet VMs in their own groups
        take(board, heartbeat(vm_block(f"vm-{i:06d}", resource_group=f"quiet-{i // 300}"), at=iso(NOW)))
    answer = board.fleet(now=NOW, opened=["quiet-7"])
    groups = {g["name"]: g for g in answer["groups"]}  # type: ignore[attr-defined]
    assert groups["rg-0"]["toLook"] == 1000 and "listed" not in groups["rg-0"]  # 2 000 > OPEN_UP_TO
    assert len(groups["quiet-7"]["listed"]) == 300 and groups["quiet-7"]["toLook"] == 0  # asked for
    assert "listed" not in groups["quiet-8"]
    # Few VMs to look at: their groups open by themselves, listing those VMs only.
    small, _ = fleet(50, per_event=5, groups_of=10)
    for i in range(50, 80):
        take(small, heartbeat(vm_block(f"vm-{i:06d}", resource_group="rg-0"), at=iso(NOW)))
    shown = {g["name"]: g for g in small.fleet(now=NOW)["groups"]}  # type: ignore[attr-defined]
    assert len(shown["rg-0"]["listed"]) == 10 and shown["rg-0"]["vms"] == 40
    # A silent VM needs a look too (its agent is dead: that VM will be surprised).
    later = small.fleet(now=NOW + 1000)
    assert later["counts"]["silent"] == 80  # type: ignore[index]


def test_the_answer_is_bounded_whatever_the_stream_and_the_page_asks() -> None:
    board = Board()
    for i in range(fleet_pages.MAX_GROUPS + 50):
        take(board, heartbeat(vm_block(f"vm-{i}", resource_group=f"rg-{i:05d}")))
    answer = board.fleet(now=NOW, opened=[f"rg-{i:05d}" for i in range(100)])
    assert len(answer["groups"]) == fleet_pages.MAX_GROUPS and answer["groupsOmitted"] == 50  # type: ignore[arg-type]
    assert sum("listed" in g for g in answer["groups"]) == fleet_pages.MAX_OPEN  # type: ignore[attr-defined]
    # A cursor that is not one of ours starts from the beginning; never an error.
    take(board, scheduled_events(vm_block("vm-0"), [event("E1", "vm-0", not_before=iso(NOW))], at=iso(NOW)))
    for junk in ("", "x", "nan~", "1e999~Z", "-inf~", "~~~"):
        assert fleet_pages.parse_cursor(junk) is None
        assert [e["eventId"] for e in board.fleet_events(after=junk)["events"]] == ["E1"]  # type: ignore[attr-defined]


def test_vm_views_are_built_at_most_once_a_second_per_question_and_kept_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """docs/console.md: every open page asks for the groups every 2 s; the server builds a view at most
    once a second per (search, grouping, groups open), and keeps at most MAX_VIEWS of them."""
    board, _ = fleet(50)
    built: list[str] = []
    real = fleet_pages.vm_view

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(fleet_pages, "vm_view", counting)
    board.fleet(now=NOW)
    board.fleet(now=NOW + 0.5)  # a second page, half a second later: the same view
    assert len(built) == 1
    board.fleet(now=NOW + 1.5)  # a second on: built again (a VM may have fallen silent)
    board.fleet(now=NOW + 1.6, query="vm-000001")  # another question: its own view
    assert len(built) == 3
    for i in range(fleet_pages.MAX_VIEWS + 10):
        board.fleet(now=NOW + 2, query=f"q{i}")
    assert len(board._pages._views) <= fleet_pages.MAX_VIEWS
