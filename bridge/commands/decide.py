"""``se-bridge decide``: build, sign and publish one decision (the ops tool, and what tests use).

It reuses the sink implementations, so it can publish to every transport the agent supports and
reports failure honestly: it exits non-zero unless the transport confirmed the decision.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from collections.abc import Mapping

import orjson

from bridge.decisions import load_signing_key, new_decision, sign
from bridge.sinks import SinkError
from bridge.sinks.publisher import DecisionPublisher

#: The longest ``--max-ttl`` an approver accepts (bridge.approver.config): a decision living longer is refused
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


def _doomed(decision: Mapping[str, object], ttl: float) -> str | None:
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
