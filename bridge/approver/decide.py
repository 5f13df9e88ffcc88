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
import time

import orjson

from bridge.approver.decision import new_decision, sign
from bridge.pipeline import Entry, RecordMeta
from bridge.signing import load_key
from bridge.sinks import SinkError, create_sink

#: The longest ``--max-ttl`` an approver accepts (bridge.config): a decision living longer is refused
#: by every approver; one living longer than the default is refused by approvers left at the default.
LONGEST_TTL = 7 * 86400.0
DEFAULT_MAX_TTL = 86400.0


def decide(args: argparse.Namespace) -> int:
    try:
        key = load_key(args.key_file)
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
    payload = orjson.dumps(decision)
    try:
        sink = create_sink(args.sink)
    except SinkError as exc:
        return _fail(str(exc))
    try:
        sink.open()
        # A decision is keyed by its target VM, so one VM's decisions stay in order on one partition.
        meta = RecordMeta(decision["decisionId"], "decision", decision.get("target") or args.event_id)
        sink.submit(Entry(1, meta, time.time(), payload))
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            outcomes = sink.poll(0.2)
            if outcomes:
                error = outcomes[0].error
                if error is not None:
                    return _fail(f"publishing to {sink.name} failed: {error}")
                print(
                    orjson.dumps(
                        {
                            "published": True,
                            "decisionId": decision["decisionId"],
                            "eventId": args.event_id,
                            "target": args.target,
                        }
                    ).decode()
                )
                return 0
        return _fail(f"{sink.name} did not confirm the decision within {args.timeout:g} s")
    except SinkError as exc:
        return _fail(str(exc))
    finally:
        with contextlib.suppress(Exception):  # closing must not hide the outcome already printed
            sink.close(timeout=5.0)


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
