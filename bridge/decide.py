"""``se-bridge decide``: build, sign and publish one decision (the ops tool, and what tests use).

It reuses the sink implementations, so it can publish to every transport the agent supports and
reports failure honestly: it exits non-zero unless the transport confirmed the decision.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import socket
import sys
import threading
import time

import orjson

from bridge.decisions import load_signing_key, new_decision, sign
from bridge.pipeline import Entry, RecordMeta
from bridge.sinks import SinkError, create_sink

#: The longest ``--max-ttl`` an approver accepts (bridge.config): a decision living longer is refused
#: by every approver; one living longer than the default is refused by approvers left at the default.
LONGEST_TTL = 7 * 86400.0
DEFAULT_MAX_TTL = 86400.0


def decide(args: argparse.Namespace) -> int:
    try:
        key = load_signing_key(args.key_file)
    except ValueError as exc:
        return _fail(str(exc))
    issued_by = args.issued_by or f"{getpass.getuser()}@{socket.gethostname()}"
    decision = sign(
        new_decision(args.event_id, args.target, issued_by, args.ttl, args.reason), args.key_id, key
    )
    doomed = _doomed(decision, args.ttl)
    if doomed:
        return _fail(f"not published, every approver would refuse it: {doomed}", code=2)
    if args.ttl > DEFAULT_MAX_TTL:
        print(f"se-bridge decide: --ttl {args.ttl:g} is refused by approvers at the default --max-ttl "
              f"({DEFAULT_MAX_TTL:g} s)", file=sys.stderr)  # fmt: skip
    try:
        publisher = DecisionPublisher(args.sink)
    except SinkError as exc:
        return _fail(str(exc))
    try:
        publisher.publish(decision, args.timeout)
    except SinkError as exc:
        return _fail(str(exc))
    finally:
        publisher.close()
    print(orjson.dumps({"published": True, "decisionId": decision["decisionId"], "eventId": args.event_id,
                        "target": args.target, "issuedAt": decision["issuedAt"]}).decode())  # fmt: skip
    return 0


class DecisionPublisher:
    """One decisions topic, opened once, a decision at a time until its transport confirms it: what
    ``se-bridge decide`` does once and the ops console for every approval."""

    def __init__(self, spec: str) -> None:
        self.sink = create_sink(spec)
        self._lock = threading.Lock()
        self._opened = False
        self._seq = 0

    @property
    def name(self) -> str:
        return self.sink.name

    def publish(self, decision: dict[str, object], timeout: float = 30.0) -> None:
        """Return once the transport confirmed ``decision``; :class:`SinkError` otherwise."""
        with self._lock:
            if not self._opened:
                self.sink.open()
                self._opened = True
            self._seq += 1
            # A decision is keyed by its target VM, so one VM's decisions stay in order on one partition.
            key = str(decision.get("target") or decision.get("eventId"))
            meta = RecordMeta(str(decision["decisionId"]), "decision", key)
            self.sink.submit(Entry(self._seq, meta, time.time(), orjson.dumps(decision)))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for outcome in self.sink.poll(0.2):
                    if outcome.error is not None:
                        raise SinkError(f"publishing to {self.sink.name} failed: {outcome.error}")
                    return
            raise SinkError(f"{self.sink.name} did not confirm the decision within {timeout:g} s")

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing must not hide the outcome already known
            self.sink.close(timeout=5.0)


def _doomed(decision: dict[str, object], ttl: float) -> str | None:
    """Why no approver could ever accept ``decision`` (the decision schema every approver checks,
    the lifetime bounds), or None. Publishing it would only produce a refusal."""
    from bridge.schemas import validate_document

    if not 1 <= ttl <= LONGEST_TTL:
        return f"--ttl must be from 1 to {LONGEST_TTL:g} seconds (got {ttl:g})"
    errors = validate_document(decision, "decision.v1.schema.json")
    if errors:
        field, _, message = errors[0].partition(": ")
        flag = {"eventId": "--event-id", "target": "--target", "issuedBy": "--issued-by",
                "reason": "--reason", "signature/keyId": "--key-id"}.get(field, field)  # fmt: skip
        if field == "eventId":
            message = f"{decision['eventId']!r} is not a GUID (an EventId as the event record shows it)"
        return f"{flag}: {message}"
    return None


def _fail(message: str, code: int = 1) -> int:
    print(f"se-bridge decide: {message}", file=sys.stderr)
    return code
