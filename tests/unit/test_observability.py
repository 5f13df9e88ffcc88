"""Redaction, JSON logs and once-per-streak logging."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from bridge.support.observability import ErrorStreak, JsonFormatter, redact


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (
            "https://prod-12.westeurope.logic.azure.com/workflows/x/triggers/manual/paths/invoke?api-version=2016-10-01"
            "&sp=%2Ftriggers&sv=1.0&sig=AbCdEf0123456789AbCdEf0123456789",
            "AbCdEf0123456789AbCdEf0123456789",
        ),
        (
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0a2V5MTIzNDU2Nzg=",
            "c2VjcmV0a2V5MTIzNDU2Nzg=",
        ),
        ("kafka://user:hunter2@broker:9093/topic", "hunter2"),
        ("sasl.password=topsecret", "topsecret"),
        ("https://x.example/hook?token=abc123def", "abc123def"),
    ],
)
def test_redact_masks_credentials(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and "***" in out


def test_redact_keeps_harmless_text() -> None:
    assert redact("file:///var/log/se-bridge/records.jsonl") == "file:///var/log/se-bridge/records.jsonl"


def test_json_log_lines_are_redacted() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("test.json")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.propagate = False
    logger.warning(
        "posting to %s",
        "https://h/x?sig=SECRETSECRET",
        extra={"sink": "https://h/x?sig=SECRETSECRET", "nested": {"sinks": ["https://h/y?sig=NESTEDSECRET"]}},
    )
    line = orjson.loads(stream.getvalue())
    assert line["level"] == "warning" and line["ts"].endswith("Z")
    assert "SECRETSECRET" not in stream.getvalue() and "NESTEDSECRET" not in stream.getvalue()
    assert line["nested"] == {"sinks": ["https://h/y?sig=***"]}  # nested values are masked too


def test_error_streak_logs_once_then_recovery(caplog: pytest.LogCaptureFixture) -> None:
    streak = ErrorStreak(logging.getLogger("test.streak"), "polling")
    with caplog.at_level(logging.INFO, "test.streak"):
        for _ in range(50):
            streak.failure("http_500", "IMDS answered 500")
        streak.failure("timeout", "no answer")  # another kind: said again
        streak.success()
        streak.success()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "polling failing: IMDS answered 500",
        "polling failing: no answer",
        "polling recovered",
    ]
    assert caplog.records[-1].failures == 51  # type: ignore[attr-defined]
