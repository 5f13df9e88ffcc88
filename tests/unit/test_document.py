"""Parsing and normalization of every api-version's document shape."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridge.imds.document import DocumentError, content_digest, parse_document

# The documentation's own example (current English page), verbatim shape.
DOC_2020 = {
    "DocumentIncarnation": 2,
    "Events": [
        {
            "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
            "EventStatus": "Scheduled",
            "EventType": "Freeze",
            "ResourceType": "VirtualMachine",
            "Resources": ["WestNO_0", "WestNO_1"],
            "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
            "Description": "Virtual machine is being paused because of a memory-preserving Live Migration "
            "operation.",
            "EventSource": "Platform",
            "DurationInSeconds": 5,
        }
    ],
}


def test_current_api_version_is_normalized() -> None:
    doc = parse_document(orjson.dumps(DOC_2020))
    assert doc.incarnation == 2
    (e,) = doc.events
    assert e.event_id == "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
    assert e.not_before == "2022-04-11T22:26:58Z"
    assert e.resources == ("WestNO_0", "WestNO_1")
    assert e.duration_in_seconds == 5
    assert e.event_source == "Platform"
    assert doc.raw == DOC_2020  # the raw document is kept exactly


def test_2017_03_01_shape_iso_time_underscore_names_string_incarnation() -> None:
    body = b"""{"DocumentIncarnation": "5", "Events": [{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
      "EventType": "Reboot", "ResourceType": "VirtualMachine", "Resources": ["_vm-a", "_vm-b"],
      "EventStatus": "Scheduled", "NotBefore": "2016-09-19T18:29:47Z"}]}"""
    doc = parse_document(body, "2017-03-01")
    (e,) = doc.events
    assert doc.incarnation == 5
    assert e.resources == ("vm-a", "vm-b")
    assert e.not_before == "2016-09-19T18:29:47Z"
    assert (e.description, e.event_source, e.duration_in_seconds) == (None, None, None)
    assert doc.raw["Events"][0]["Resources"] == ["_vm-a", "_vm-b"]  # raw keeps the original


def test_underscore_kept_for_later_api_versions() -> None:
    raw = {"DocumentIncarnation": 1, "Events": [{**DOC_2020["Events"][0], "Resources": ["_odd"]}]}
    assert parse_document(orjson.dumps(raw), "2019-01-01").events[0].resources == ("_odd",)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("NotBefore", "", None),  # Started events carry an empty NotBefore
        ("NotBefore", "Tue, 22 Nov 2026 10:00:00 GMT", "2026-11-22T10:00:00Z"),
        ("NotBefore", "2026-11-22T11:00:00+01:00", "2026-11-22T10:00:00Z"),
        ("DurationInSeconds", -1, None),
        ("DurationInSeconds", 0, 0),
    ],
)
def test_field_normalization(field: str, value: object, expected: object) -> None:
    raw = {"DocumentIncarnation": 1, "Events": [{**DOC_2020["Events"][0], field: value}]}
    event = parse_document(orjson.dumps(raw)).events[0]
    attr = {"NotBefore": "not_before", "DurationInSeconds": "duration_in_seconds"}[field]
    assert getattr(event, attr) == expected


def test_unknown_type_and_status_are_kept() -> None:
    raw = {
        "DocumentIncarnation": 1,
        "Events": [{**DOC_2020["Events"][0], "EventType": "Hibernate", "EventStatus": "Paused"}],
    }
    e = parse_document(orjson.dumps(raw)).events[0]
    assert (e.event_type, e.event_status) == ("Hibernate", "Paused")


def test_unreadable_not_before_keeps_the_event_with_a_warning() -> None:
    raw = {"DocumentIncarnation": 1, "Events": [{**DOC_2020["Events"][0], "NotBefore": "soon"}]}
    doc = parse_document(orjson.dumps(raw))
    assert doc.events[0].not_before is None
    assert doc.warnings and "soon" in doc.warnings[0]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<html>502 Bad Gateway</html>", "invalid_json"),
        (b'{"DocumentIncarnation": 1, "Events": [', "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        (b"[]", "not_an_object"),
        (b'{"Events": []}', "missing_incarnation"),
        (b'{"DocumentIncarnation": true, "Events": []}', "bad_incarnation"),
        (b'{"DocumentIncarnation": "x1", "Events": []}', "bad_incarnation"),
        (b'{"DocumentIncarnation": 1.5, "Events": []}', "bad_incarnation"),
        (
            '{"DocumentIncarnation": "\u00b2", "Events": []}'.encode(),
            "bad_incarnation",
        ),  # found by hypothesis
        (b'{"DocumentIncarnation": 1}', "missing_events"),
        (b'{"DocumentIncarnation": 1, "Events": {}}', "bad_events"),
    ],
)
def test_malformed_documents_are_refused_with_a_reason(body: bytes, reason: str) -> None:
    with pytest.raises(DocumentError) as info:
        parse_document(body)
    assert info.value.reason == reason
    assert str(info.value)  # a human explanation, for the log line


@pytest.mark.parametrize(
    ("bad", "readable_id"),
    [
        (1, None),
        ({"EventId": "a"}, "a"),
        ({"EventId": "a", "EventType": "Freeze", "EventStatus": "Scheduled", "Resources": "vm"}, "a"),
        ({**DOC_2020["Events"][0]}, DOC_2020["Events"][0]["EventId"]),  # a repeated EventId
    ],
)
def test_one_bad_element_is_left_out_and_the_other_events_kept(bad: object, readable_id: str | None) -> None:
    """Issue 23: one unreadable element hid every event of the document while it lasted."""
    raw = {"DocumentIncarnation": 1, "Events": [DOC_2020["Events"][0], bad]}
    doc = parse_document(orjson.dumps(raw))
    assert [e.event_id for e in doc.events] == [DOC_2020["Events"][0]["EventId"]]
    ((index, event_id, why),) = doc.rejected
    assert (index, event_id) == (1, readable_id) and why and doc.warnings


def test_an_event_gone_bad_for_a_moment_keeps_its_last_good_version() -> None:
    """An element that cannot be read is not an event that left: no canceled/completed for it."""
    good = parse_document(orjson.dumps(DOC_2020))
    broken = {**DOC_2020["Events"][0], "Resources": "vm"}
    bad = parse_document(orjson.dumps({"DocumentIncarnation": 2, "Events": [broken]}))
    assert bad.events == () and bad.keeping(good).events == good.events
    assert bad.keeping(good).digest == good.digest  # no content change to report
    assert bad.keeping(None).events == ()


def test_digest_ignores_event_order_but_not_content() -> None:
    a = parse_document(
        orjson.dumps(
            {
                "DocumentIncarnation": 1,
                "Events": [
                    {**DOC_2020["Events"][0], "EventId": "1"},
                    {**DOC_2020["Events"][0], "EventId": "2"},
                ],
            }
        )
    )
    b = parse_document(
        orjson.dumps(
            {
                "DocumentIncarnation": 1,
                "Events": [
                    {**DOC_2020["Events"][0], "EventId": "2"},
                    {**DOC_2020["Events"][0], "EventId": "1"},
                ],
            }
        )
    )
    assert a.digest == b.digest
    moved = list(a.events)
    moved[0] = parse_document(
        orjson.dumps(
            {
                "DocumentIncarnation": 1,
                "Events": [
                    {**DOC_2020["Events"][0], "EventId": "1", "NotBefore": "Mon, 11 Apr 2022 22:30:00 GMT"}
                ],
            }
        )
    ).events[0]
    assert content_digest(moved) != a.digest


# -- property: nothing but DocumentError ever escapes the parser -------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
event_like = st.fixed_dictionaries(
    {},
    optional={
        "EventId": st.text(max_size=8) | st.integers(),
        "EventType": st.sampled_from(["Freeze", "Reboot", "", "X"]) | st.integers(),
        "EventStatus": st.sampled_from(["Scheduled", "Started", ""]) | st.none(),
        "Resources": st.lists(st.text(max_size=6) | st.integers(), max_size=3) | st.text(max_size=5),
        "NotBefore": st.text(max_size=30) | st.integers() | st.just("Mon, 11 Apr 2022 22:26:58 GMT"),
        "DurationInSeconds": st.integers() | st.text(max_size=4) | st.floats(allow_nan=False),
        "Description": json_values,
        "EventSource": json_values,
        "ResourceType": json_values,
    },
)
document_like = st.fixed_dictionaries(
    {},
    optional={
        "DocumentIncarnation": st.integers() | st.text(max_size=6) | st.booleans() | st.none(),
        "Events": st.lists(event_like, max_size=3) | json_values,
    },
)
api_versions = st.sampled_from(["2017-03-01", "2019-08-01", "2020-07-01"])


def _parse_or_refuse(body: bytes, version: str) -> None:
    try:
        doc = parse_document(body, version)
    except DocumentError as err:
        assert err.reason in {
            "invalid_json",
            "not_an_object",
            "missing_incarnation",
            "bad_incarnation",
            "missing_events",
            "bad_events",
            "bad_event",
        }
    else:
        assert isinstance(doc.incarnation, int)
        for event in doc.events:
            assert event.not_before is None or event.not_before.endswith("Z")
            assert event.duration_in_seconds is None or event.duration_in_seconds >= 0


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300), api_versions)
def test_arbitrary_bytes_never_raise_anything_else(body: bytes, version: str) -> None:
    _parse_or_refuse(body, version)


@settings(max_examples=400, deadline=None)
@given(json_values, api_versions)
def test_arbitrary_json_never_raises_anything_else(value: object, version: str) -> None:
    _parse_or_refuse(json.dumps(value).encode(), version)


@settings(max_examples=600, deadline=None)
@given(document_like, api_versions)
@example({"DocumentIncarnation": "0\x1f"}, "2017-03-01")  # found by hypothesis: int() refused \x1f
def test_document_shaped_json_never_raises_anything_else(value: object, version: str) -> None:
    _parse_or_refuse(json.dumps(value).encode(), version)
