"""The outbox's in-memory index of its frames: where each record's frame is, by sequence number.

Kept sorted by ``seq`` (appends only ever add at the end; recovery adds segment by segment, in
order), so finding "the first record after a cursor" is a bisection and a read run is a slice.
"""

from __future__ import annotations

import bisect
from array import array

from bridge.pipeline import frames

Loc = frames.Span  # the index keeps, per record, what the frame scan or the append found


class FrameIndex:
    """The frames some sink has not confirmed, in seq order; found by bisection, not by arithmetic.

    Kept in columns (one ``array('q')`` per field of :class:`Loc`), a Loc built only when asked:
    64 bytes a record instead of ~270 for a tuple of eight ints (issue 33: an Azure's channel reading
    a 40 000-delivery backlog held 10 000 unconfirmed records; an agent through a day-long broker
    outage holds hundreds of thousands)."""

    def __init__(self) -> None:
        self._columns = tuple(array("q") for _ in Loc._fields)
        self._seqs = self._columns[Loc._fields.index("seq")]
        self._head = 0  # frames before it were confirmed by every sink (compacted lazily)
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._seqs) - self._head

    def add(self, loc: Loc) -> None:
        for column, value in zip(self._columns, loc, strict=True):
            column.append(value)
        self.bytes += loc.length

    def after(self, seq: int) -> int:
        """Position of the first frame with a seq above ``seq``."""
        return bisect.bisect_right(self._seqs, seq, self._head)

    def at(self, position: int) -> Loc | None:
        return Loc(*(c[position] for c in self._columns)) if position < len(self._seqs) else None

    def slice(self, position: int, limit: int) -> list[Loc]:
        return list(map(Loc, *(c[position : position + limit] for c in self._columns)))

    def last_seq(self) -> int | None:
        return self._seqs[-1] if len(self) else None

    def drop_through(self, seq: int) -> None:
        """Forget every frame with a seq up to ``seq`` (all sinks confirmed them)."""
        end = self.after(seq)
        lengths = self._columns[Loc._fields.index("length")]
        self.bytes -= sum(lengths[self._head : end])
        self._head = end
        if self._head > 1024 and self._head * 2 > len(self._seqs):
            for column in self._columns:
                del column[: self._head]
            self._head = 0

    def count_after(self, seq: int) -> int:
        return len(self._seqs) - self.after(seq)

    def remove(self, loc: Loc) -> None:
        """Take out one frame found damaged when read back."""
        position = bisect.bisect_left(self._seqs, loc.seq, self._head)
        if position < len(self._seqs) and self.at(position) == loc:
            for column in self._columns:
                del column[position]
            self.bytes -= loc.length


def run_end(locs: list[Loc], start: int) -> int:
    """End (exclusive) of the run of frames from ``start`` that lie back to back in one segment."""
    end = start + 1
    while (
        end < len(locs)
        and locs[end].segment == locs[start].segment
        and locs[end].offset == locs[end - 1].offset + locs[end - 1].length
    ):
        end += 1
    return end
