"""The relay API's one home (issue 24): both ends build and read a request with the same code, and
its limits are the decision schema's."""

from __future__ import annotations

import orjson
import pytest

from bridge import relay_api
from bridge.relay_api import FIELD_LIMITS, RelayDecision, RelayRequestError, parse_request, request_body
from bridge.schemas import load_schema

GUID = "8D10DA13-8125-4BA9-A717-BF7490507B3D"


def decision(n: int = 1, **extra: object) -> RelayDecision:
    return RelayDecision(f"decision-{n:04d}", (GUID,), target="vm-a", issued_by="alice", **extra)  # type: ignore[arg-type]


def test_the_limits_are_the_decision_schemas() -> None:
    properties = load_schema("decision.v1.schema.json")["properties"]
    for name in ("decisionId", "target", "issuedBy"):
        assert FIELD_LIMITS[name] == (properties[name].get("minLength", 1), properties[name]["maxLength"])
    assert FIELD_LIMITS["eventId"][1] == len(GUID)  # the schema's eventId is a GUID


def test_what_the_approver_sends_is_what_the_agent_reads() -> None:
    one = decision(expires_at="2026-11-25T18:00:00+00:00")
    parsed, many = parse_request(orjson.loads(orjson.dumps(request_body([one.to_json()]))))
    assert (parsed, many) == ([one], False)
    several = [decision(n) for n in range(3)]
    parsed, many = parse_request(orjson.loads(orjson.dumps(request_body([d.to_json() for d in several]))))
    assert (parsed, many) == (several, True)
    assert one.expires_epoch() == 1795629600.0


@pytest.mark.parametrize(
    "body, words",
    [
        ("text", "JSON object"),
        ({"decisionId": "short", "eventIds": [GUID]}, "decisionId must be a string of 8 to 128"),
        ({"decisionId": "d" * 129, "eventIds": [GUID]}, "decisionId"),
        ({"decisionId": "decision-1", "eventIds": []}, "eventIds"),
        ({"decisionId": "decision-1", "eventIds": [GUID + "0"]}, "eventIds"),  # longer than any GUID
        ({"decisionId": "decision-1", "eventIds": [GUID] * 21}, "eventIds"),
        ({"decisionId": "decision-1", "eventIds": [GUID], "expiresAt": "tomorrow"}, "expiresAt"),
        ({"decisions": []}, "decisions must be a list of 1 to 50"),
        ({"decisions": [{"decisionId": "decision-1", "eventIds": [GUID]}] * 2}, "appears twice"),
    ],
)
def test_a_request_the_agent_cannot_read_is_named(body: object, words: str) -> None:
    with pytest.raises(RelayRequestError, match=words):
        parse_request(body)


def test_the_audit_outcomes_are_the_approval_schemas() -> None:
    from typing import get_args

    schema = load_schema("approval.v1.schema.json")
    assert set(get_args(relay_api.Outcome)) <= set(schema["properties"]["outcome"]["enum"])
