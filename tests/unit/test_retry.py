"""Backoff and Retry-After: a server's answer can slow a retry down, never stop it for good."""

from __future__ import annotations

import email.utils
import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.imds.client import IMDS_MAX_RETRY_AFTER
from bridge.support.retry import Backoff, parse_retry_after


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("2", 2.0),
        (" 7 ", 7.0),
        ("1.5", 1.5),
        ("0", 0.0),
        ("86400", IMDS_MAX_RETRY_AFTER),  # a day: capped, polling goes on within 10 s
        ("9" * 400, IMDS_MAX_RETRY_AFTER),  # too large for a float: still only the cap
        ("inf", None),
        ("Infinity", None),
        ("nan", None),
        ("-5", None),
        ("+5", None),
        ("1e9", None),
        ("\uff15", None),  # FULLWIDTH DIGIT FIVE: isdigit() is true, but it is not ASCII
        ("soon", None),
        ("", None),
        (None, None),
        ("Mon, 32 Foo 2026 99:99:99 GMT", None),
    ],
)
def test_retry_after_values_imds_can_send(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, IMDS_MAX_RETRY_AFTER) == expected


def test_retry_after_http_dates() -> None:
    now = time.time()
    ahead = parse_retry_after(email.utils.formatdate(now + 5, usegmt=True), 300, now=now)
    assert ahead == pytest.approx(5, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), 300, now=now) == 0.0
    assert parse_retry_after(email.utils.formatdate(now + 86400, usegmt=True), 10, now=now) == 10
    assert parse_retry_after("Tue, 01 Dec 2026 10:00:00", 300) is None  # no zone: not an HTTP date


def test_backoff_honours_retry_after_only_up_to_its_bound() -> None:
    """The regression of issue 8: ``min(ra, max(cap, ra))`` was always ``ra``."""
    imds = Backoff(base=1.0, cap=10.0, floor=1.0, max_retry_after=10.0)
    assert imds.next_delay(86400.0) == 10.0
    assert imds.next_delay(3.0) >= 3.0
    sink = Backoff(base=0.5, cap=30.0, max_retry_after=300.0)
    assert sink.next_delay(120.0) == 120.0
    assert sink.next_delay(10_000.0) == 300.0


@given(
    retry_after=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    attempts=st.integers(0, 100),
)
def test_no_delay_is_ever_unbounded_or_not_a_number(retry_after: float | None, attempts: int) -> None:
    backoff = Backoff(base=1.0, cap=10.0, floor=1.0, max_retry_after=10.0)
    backoff.attempt = attempts
    delay = backoff.next_delay(retry_after)
    assert math.isfinite(delay) and 0.0 <= delay <= 10.0
