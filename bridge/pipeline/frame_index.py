"""The outbox's in-memory index of its frames: where each record's frame is, by sequence number.

Kept sorted by ``seq`` (appends only ever add at the end; recovery adds segment by segment, in
order), so finding "the first record after a cursor" is a bisection and a read run is a slice.
"""

from __future__ import annotations

import bisect

from bridge.pipeline import frames

Loc = frames.Span  # the index keeps, per record, what the frame scan or the append found


class FrameIndex:
    """The frames some sink has not confirmed, in seq order; found by bisection, not by arithmetic."""

    def __init__(self) -> None:
        self._locs: list[Loc] = []
        self._seqs: list[int] = []
        self._head = 0  # frames before it were confirmed by every sink (compacted lazily)
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._seqs) - self._head

    def add(self, loc: Loc) -> None:
        self._locs.append(loc)
        self._seqs.append(loc.seq)
        self.bytes += loc.length

    def after(self, seq: int) -> int:
        """Position of the first frame with a seq above ``seq``."""
        return bisect.bisect_right(self._seqs, seq, self._head)

    def at(self, position: int) -> Loc | None:
        return self._locs[position] if position < len(self._locs) else None

    def slice(self, position: int, limit: int) -> list[Loc]:
        return self._locs[position : position + limit]

    def last_seq(self) -> int | None:
        return self._seqs[-1] if len(self) else None

    def drop_through(self, seq: int) -> None:
        """Forget every frame with a seq up to ``seq`` (all sinks confirmed them)."""
        end = self.after(seq)
        for loc in self._locs[self._head : end]:
            self.bytes -= loc.length
        self._head = end
        if self._head > 1024 and self._head * 2 > len(self._seqs):
            del self._locs[: self._head], self._seqs[: self._head]
            self._head = 0

    def count_after(self, seq: int) -> int:
        return len(self._seqs) - self.after(seq)

    def remove(self, loc: Loc) -> None:
        """Take out one frame found damaged when read back."""
        position = bisect.bisect_left(self._seqs, loc.seq, self._head)
        if position < len(self._seqs) and self._locs[position] is loc:
            del self._locs[position], self._seqs[position]
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
