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

import zlib
from dataclasses import dataclass

import orjson

from bridge.pipeline.entry import Entry, RecordMeta

MAGIC = b"#2 "
_NEWLINE = 0x0A
_MAX_FIELD = 20  # digits of a 64-bit number


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame found in a buffer: where it is, and the entry it carries."""

    offset: int
    length: int  # the whole frame, newline included
    entry: Entry

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class Damage:
    """A region of a segment that holds no intact frame (corrupt bytes or a torn write)."""

    start: int
    end: int
    markers: int  # frame starts (``#2``) seen inside it: a lower bound of the frames it cost


def encode(seq: int, appended_ms: int, meta: RecordMeta, payload: bytes) -> bytes:
    """One frame for ``payload``. ``ValueError`` if the payload is not one line."""
    if b"\n" in payload:
        raise ValueError("a payload must be one line")
    header = orjson.dumps(meta.to_header())
    body = b"%d %d %d %d " % (seq, appended_ms, len(header), len(payload)) + header + payload
    return b"%s%08x %s\n" % (MAGIC, zlib.crc32(body), body)


def decode_at(buf: bytes, pos: int) -> Frame | None:
    """The intact frame starting at ``pos``, or None (damaged, torn, or not a frame start)."""
    if buf.startswith(MAGIC, pos):
        return _decode_v2(buf, pos)
    if pos < len(buf) and 0x30 <= buf[pos] <= 0x39:
        return _decode_v1(buf, pos)
    return None


def scan(buf: bytes) -> tuple[list[Frame], list[Damage]]:
    """Every intact frame of a segment in file order, and the damaged regions between them.

    A damaged region ends where the next intact frame starts (found again at a line start or at a
    ``#2`` marker), so one bad frame never hides the intact ones after it."""
    frames: list[Frame] = []
    damage: list[Damage] = []
    pos, size, bad_from = 0, len(buf), -1
    while pos < size:
        frame = decode_at(buf, pos)
        if frame is not None:
            if bad_from >= 0:
                damage.append(_damage(buf, bad_from, pos))
                bad_from = -1
            frames.append(frame)
            pos = frame.end
            continue
        if bad_from < 0:
            bad_from = pos
        pos = _next_candidate(buf, pos + 1)
    if bad_from >= 0:
        damage.append(_damage(buf, bad_from, size))
    return frames, damage


def _damage(buf: bytes, start: int, end: int) -> Damage:
    return Damage(start, end, buf.count(MAGIC, start, end))


def _next_candidate(buf: bytes, start: int) -> int:
    """The first position at or after ``start`` that may begin a frame."""
    found = len(buf)
    newline = buf.find(b"\n", start - 1)
    if newline >= 0:
        found = newline + 1
    marker = buf.find(MAGIC, start, found)
    return marker if marker >= 0 else found


def _numbers(buf: bytes, pos: int, count: int) -> tuple[list[int], int] | None:
    """``count`` space-terminated ASCII decimal numbers from ``pos``; (values, position after)."""
    values = []
    for _ in range(count):
        space = buf.find(b" ", pos, pos + _MAX_FIELD + 1)
        field = buf[pos:space]
        if space < 0 or not field or not field.isdigit():  # bytes.isdigit(): ASCII digits only
            return None
        values.append(int(field))
        pos = space + 1
    return values, pos


def _decode_v2(buf: bytes, pos: int) -> Frame | None:
    crc_at = pos + len(MAGIC)
    crc_text = buf[crc_at : crc_at + 8]
    body = crc_at + 9
    if len(crc_text) != 8 or buf[crc_at + 8 : body] != b" ":
        return None
    parsed = _numbers(buf, body, 4)
    if parsed is None:
        return None
    (seq, appended_ms, header_len, payload_len), header_at = parsed
    end = header_at + header_len + payload_len
    if end >= len(buf) or buf[end] != _NEWLINE:
        return None
    try:
        crc = int(crc_text, 16)
    except ValueError:
        return None
    if zlib.crc32(memoryview(buf)[body:end]) != crc:
        return None
    try:
        meta = RecordMeta.from_header(orjson.loads(buf[header_at : header_at + header_len]))
    except (orjson.JSONDecodeError, ValueError, AttributeError):
        return None
    payload = buf[header_at + header_len : end]
    return Frame(pos, end + 1 - pos, Entry(seq, meta, appended_ms / 1000.0, payload))


def _decode_v1(buf: bytes, pos: int) -> Frame | None:
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
    entry = Entry(int(seq), RecordMeta.of_payload(rid, payload), int(appended_ms) / 1000.0, payload)
    return Frame(pos, end + 1 - pos, entry)
