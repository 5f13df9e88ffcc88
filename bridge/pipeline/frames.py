"""The outbox's on-disk frame format: encoding, checking and scanning a segment.

A frame is one line, so a damaged region can be stepped over and the frames after it found again::

    #2 <crc32 hex8> <seq> <appendedAtMs> <headerLen> <payloadLen> <header JSON><payload>\\n

The CRC covers everything from ``<seq>`` to the end of the payload, the header included: a flipped
digit in a seq is as detectable as one in the payload. The header is the record's routing metadata
(:class:`~bridge.pipeline.entry.RecordMeta`). Payloads are one line of JSON (no raw newline), so the
only newline of a frame is its last byte and ``#2`` at a line start or anywhere inside a damaged
region is where the next frame may begin; a candidate counts only once its lengths, newline and CRC
agree.

Format 1 frames (``<seq> <recordId> <appendedAtMs> <crc32 hex> <length> <payload>\\n``, CRC over the
payload only) are still read, so an outbox written by an earlier version is delivered after an
upgrade; their metadata is read from the payload.
"""

from __future__ import annotations

import re
import zlib
from typing import NamedTuple

import orjson

from bridge.pipeline.entry import Entry, RecordMeta

MAGIC = b"#2 "
_NEWLINE = 0x0A
_FIELDS_AT = len(MAGIC) + 9  # "#2 " + 8 hex digits of CRC + " ": where the CRC's coverage starts
FORMAT_1 = -1  # Span.header_len of a frame of the previous format


class Span(NamedTuple):
    """Where an intact frame is and what it holds: what the outbox's index keeps per record.

    Finding a frame checks its structure and CRC only; its header and payload are decoded when a
    sink reads it, so recovering a large outbox stays cheap, and a read proves the bytes against the
    CRC kept here without parsing anything again (:func:`read_indexed`)."""

    segment: int  # first seq of the segment file (the caller's; 0 when unknown)
    offset: int
    length: int  # the whole frame, newline included
    seq: int
    appended_ms: int
    header_len: int  # FORMAT_1 for a frame of the previous format
    payload_len: int
    crc: int

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def appended_at(self) -> float:
        return self.appended_ms / 1000.0


class Damage(NamedTuple):
    """A region of a segment that holds no intact frame (corrupt bytes or a torn write)."""

    start: int
    end: int
    markers: int  # frame starts (``#2``) or ends (newlines) seen inside it, whichever are more: a
    # lower bound of the frames it cost (payloads hold no raw newline)


def encode(
    segment: int, offset: int, seq: int, appended_ms: int, meta: RecordMeta, payload: bytes
) -> tuple[bytes, Span]:
    """One frame for ``payload`` (to be written at ``offset`` of ``segment``) and its span.
    ``ValueError`` if the payload is not one line."""
    if b"\n" in payload:
        raise ValueError("a payload must be one line")
    header = orjson.dumps(meta.to_header())
    fields = b"%d %d %d %d " % (seq, appended_ms, len(header), len(payload))
    crc = zlib.crc32(payload, zlib.crc32(header, zlib.crc32(fields)))  # no copy of the body for it
    frame = b"".join((MAGIC, b"%08x " % crc, fields, header, payload, b"\n"))
    return frame, Span(segment, offset, len(frame), seq, appended_ms, len(header), len(payload), crc)


def check_at(buf: bytes, pos: int, segment: int = 0) -> Span | None:
    """The intact frame starting at ``pos``, or None (damaged, torn, or not a frame start)."""
    if buf.startswith(MAGIC, pos):
        return _check_v2(buf, pos, segment)
    if pos < len(buf) and 0x30 <= buf[pos] <= 0x39:
        return _check_v1(buf, pos, segment)
    return None


def read_indexed(buf: bytes, at: int, span: Span) -> Entry | None:
    """The entry of the frame ``span`` describes, read back into ``buf`` at ``at``; None if the bytes
    there are no longer that intact frame.

    The hot read path (every record, every sink): the index kept the frame's CRC and field lengths,
    so the check is the newline and one CRC over the bytes, and the header and payload are cut out
    where they must be; nothing is searched for or parsed. The header is decoded only if the sink
    asks for the metadata (:attr:`Entry.meta`)."""
    end = at + span.length - 1
    if span.header_len == FORMAT_1:
        return _read_v1(buf[at : end + 1], span)
    if end >= len(buf) or buf[end] != _NEWLINE:
        return None
    # The marker and the CRC text too: a frame that recovery would not find is not delivered now.
    if buf[at : at + _FIELDS_AT] != b"%s%08x " % (MAGIC, span.crc):
        return None
    if zlib.crc32(memoryview(buf)[at + _FIELDS_AT : end]) != span.crc:
        return None
    header_at = end - span.payload_len - span.header_len
    header_end = header_at + span.header_len
    return Entry(span.seq, None, span.appended_ms / 1000.0, buf[header_end:end], buf[header_at:header_end])


def decode(buf: bytes, span: Span) -> Entry:
    """The entry of a frame :func:`check_at` or :func:`scan` found intact in ``buf``."""
    entry = read_indexed(buf, span.offset, span)
    assert entry is not None, "decode() of a span that is not an intact frame of this buffer"
    return entry


def scan(buf: bytes, segment: int = 0) -> tuple[list[Span], list[Damage]]:
    """Every intact frame of a segment in file order, and the damaged regions between them.

    A damaged region ends where the next intact frame starts (found again at a line start or at a
    ``#2`` marker), so one bad frame never hides the intact ones after it."""
    found: list[Span] = []
    damage: list[Damage] = []
    pos, size, bad_from = 0, len(buf), -1
    while pos < size:
        span = check_at(buf, pos, segment)
        if span is not None:
            if bad_from >= 0:
                damage.append(_damage(buf, bad_from, pos))
                bad_from = -1
            found.append(span)
            pos = span.end
            continue
        if bad_from < 0:
            bad_from = pos
        pos = _next_candidate(buf, pos + 1)
    if bad_from >= 0:
        damage.append(_damage(buf, bad_from, size))
    return found, damage


def _damage(buf: bytes, start: int, end: int) -> Damage:
    return Damage(start, end, max(buf.count(MAGIC, start, end), buf.count(b"\n", start, end)))


def _next_candidate(buf: bytes, start: int) -> int:
    """The first position at or after ``start`` that may begin a frame."""
    found = len(buf)
    newline = buf.find(b"\n", start - 1)
    if newline >= 0:
        found = newline + 1
    marker = buf.find(MAGIC, start, found)
    return marker if marker >= 0 else found


# "#2 " crc, then seq, appendedAtMs, headerLen, payloadLen: ASCII only (bytes patterns: \d is [0-9]).
_V2_HEAD = re.compile(rb"#2 ([0-9a-f]{8}) ([0-9]{1,20}) ([0-9]{1,20}) ([0-9]{1,20}) ([0-9]{1,20}) ")


def _check_v2(buf: bytes, pos: int, segment: int) -> Span | None:
    head = _V2_HEAD.match(buf, pos)
    if head is None:
        return None
    crc_text, seq, appended_ms, header_len, payload_len = head.groups()
    end = head.end() + int(header_len) + int(payload_len)
    if end >= len(buf) or buf[end] != _NEWLINE:
        return None
    crc = int(crc_text, 16)
    if zlib.crc32(memoryview(buf)[pos + _FIELDS_AT : end]) != crc:
        return None
    fields = (int(seq), int(appended_ms), int(header_len), int(payload_len), crc)
    return Span(segment, pos, end + 1 - pos, *fields)


def _split_v1(buf: bytes, pos: int) -> tuple[int, str, int, bytes] | None:
    end = buf.find(b"\n", pos)
    if end < 0:
        return None
    parts = buf[pos:end].split(b" ", 5)
    if len(parts) != 6:
        return None
    seq, record_id, appended_ms, crc_text, length, payload = parts
    if not (seq.isdigit() and appended_ms.isdigit() and length.isdigit()):
        return None
    try:
        crc, rid = int(crc_text, 16), record_id.decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return None
    if len(payload) != int(length) or zlib.crc32(payload) != crc:
        return None
    return int(seq), rid, int(appended_ms), payload


def _check_v1(buf: bytes, pos: int, segment: int) -> Span | None:
    parts = _split_v1(buf, pos)
    if parts is None:
        return None
    seq, _, appended_ms, payload = parts
    length = buf.index(b"\n", pos) + 1 - pos
    return Span(segment, pos, length, seq, appended_ms, FORMAT_1, len(payload), zlib.crc32(payload))


def _read_v1(frame: bytes, span: Span) -> Entry | None:
    parts = _split_v1(frame, 0)
    if parts is None or parts[0] != span.seq:
        return None
    seq, record_id, appended_ms, payload = parts
    return Entry(seq, RecordMeta.of_payload(record_id, payload), appended_ms / 1000.0, payload)
