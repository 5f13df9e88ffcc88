"""The transports layer: one secret reader for every ``*_env`` / ``*_file`` option, and one spec per
system read the same way by its sink and its decision source, each in its own words.

No broker, no network: specs are refused while they are parsed, secrets are read from this process's
environment and from files under ``tmp_path``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bridge.errors import BridgeError
from bridge.sinks import SinkError, create_sink
from bridge.streams import SourceError, create_source
from bridge.transports.base import Owner
from bridge.transports.secrets import SecretError, SecretRef

# Derived, not random: pytest-xdist workers must agree on test ids.
SECRET = "s3cr3t-" + uuid.uuid5(uuid.NAMESPACE_URL, "se-bridge-tests/transports").hex
OWNER = Owner("test sink", SecretError)


# --------------------------------------------------------------------------------------------------
# SecretRef
# --------------------------------------------------------------------------------------------------


def test_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SE_TEST_TRANSPORT_SECRET", SECRET)
    ref = SecretRef.from_options(OWNER, "password", "SE_TEST_TRANSPORT_SECRET", None)
    assert ref is not None and ref.option == "password_env"
    assert ref.resolve(OWNER) == SECRET
    assert SECRET not in repr(ref)  # the reference holds a name, never the value


def test_secret_from_a_file_loses_its_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(f"{SECRET}\r\n")
    ref = SecretRef.from_options(OWNER, "password", None, str(path))
    assert ref is not None and ref.option == "password_file"
    assert ref.resolve(OWNER) == SECRET
    path.write_text(f"{SECRET}-rotated\n")
    assert ref.resolve(OWNER) == f"{SECRET}-rotated"  # read at each resolve: a rotation is picked up


def test_missing_secrets_are_permanent_and_name_the_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SE_TEST_TRANSPORT_UNSET", raising=False)
    monkeypatch.setenv("SE_TEST_TRANSPORT_BLANK", "  \n")
    (tmp_path / "empty").write_text("\n")
    cases = [
        (SecretRef("password_env", env="SE_TEST_TRANSPORT_UNSET"), "SE_TEST_TRANSPORT_UNSET is not set"),
        (SecretRef("password_env", env="SE_TEST_TRANSPORT_BLANK"), "SE_TEST_TRANSPORT_BLANK is not set"),
        (SecretRef("password_file", path=str(tmp_path / "none")), "cannot read password_file"),
        (SecretRef("password_file", path=str(tmp_path / "empty")), "password_file"),
    ]
    for ref, expected in cases:
        with pytest.raises(SecretError) as caught:
            ref.resolve(OWNER)
        error = caught.value
        assert isinstance(error, BridgeError) and not error.retryable and error.kind == "config"
        message = str(error)
        assert message.startswith("test sink: ") and expected in message, message
        assert ref.option in message, message
    # Without an owner the reader still speaks clearly.
    with pytest.raises(SecretError, match=r"^secret reference: environment variable SE_TEST_TRANSPORT_UNSET"):
        SecretRef("password_env", env="SE_TEST_TRANSPORT_UNSET").resolve()


def test_unreadable_secrets_are_refused_without_echoing_the_value(tmp_path: Path) -> None:
    not_text = tmp_path / "binary"
    not_text.write_bytes(SECRET.encode() + b"\xff\xfe")
    for path, expected in [
        (not_text, "is not UTF-8 text"),
        (tmp_path, "cannot read password_file"),  # a directory: the OS refuses to read it
    ]:
        with pytest.raises(SecretError) as caught:
            SecretRef("password_file", path=str(path), what="the broker password").resolve(OWNER)
        message = str(caught.value)
        assert expected in message and "for the broker password, " in message, message
        assert SECRET not in message


def test_a_value_that_reaches_a_check_is_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Kafka sink checks an Event Hubs connection string it read through a SecretRef: the refusal
    names the variable, never the value."""
    monkeypatch.setenv("SE_TEST_TRANSPORT_CS", f"SharedAccessKey={SECRET}")
    sink = create_sink(
        "kafka://ns.servicebus.windows.net:9093/hub?security_protocol=SASL_SSL&sasl_mechanism=PLAIN"
        "&sasl_username=$ConnectionString&sasl_password_env=SE_TEST_TRANSPORT_CS"
    )
    with pytest.raises(SinkError) as caught:
        sink.open()
    message = str(caught.value)
    assert "SE_TEST_TRANSPORT_CS" in message and "Endpoint=sb://" in message
    assert SECRET not in message


@pytest.mark.parametrize(
    ("env", "path", "expected"),
    [
        ("A", "/b", "give either password_env or password_file, not both"),
        ("", None, "password_env needs the name of an environment variable"),
        ("1BAD", None, "password_env must be an environment variable name"),
        (None, "relative/secret", "password_file must be an absolute path"),
    ],
)
def test_secret_options_are_checked_when_the_spec_is_read(
    env: str | None, path: str | None, expected: str
) -> None:
    with pytest.raises(SecretError, match=expected):
        SecretRef.from_options(OWNER, "password", env, path)
    assert SecretRef.from_options(OWNER, "password", None, None) is None


def test_lenient_references_leave_names_and_relative_paths_to_resolve() -> None:
    """The webhook sink has always accepted relative paths; ``strict=False`` keeps that."""
    ref = SecretRef.from_options(OWNER, "hmac_key", None, "relative/key", strict=False)
    assert ref is not None and ref.path == "relative/key"


# --------------------------------------------------------------------------------------------------
# One spec, two directions, two wordings
# --------------------------------------------------------------------------------------------------

BAD_OPTIONS = [
    ("kafka://h:9092/t?linger_ms=soon", "kafka", "linger_ms must be an integer"),
    ("kafka://h:9092/t?colour=blue", "kafka", "unknown option 'colour'"),
    ("kafka://h:9092/t?security_protocol=SASL_SSL", "kafka", "needs sasl_mechanism"),
    (
        "kafka://h:9092/t?security_protocol=SASL_SSL&sasl_mechanism=PLAIN&sasl_username=u"
        "&sasl_password_env=not-a-name",
        "kafka",
        "sasl_password_env must be an environment variable name",
    ),
    (f"kafka://h:9092/t?password={SECRET}", "kafka", "never put a secret"),
    (
        "eventhubs://ns.servicebus.windows.net/hub?send_timeout=soon",
        "eventhubs",
        "send_timeout must be a number",
    ),
    ("eventhubs://ns/hub?connection_string_env=1BAD", "eventhubs", "environment variable name"),
    ("eventhubs://ns/hub?connection_string_env=A&connection_string_file=/b", "eventhubs", "not both"),
    ("eventhubs://ns.servicebus.windows.net/hub?client_id=nope", "eventhubs", "client_id must be a UUID"),
    (
        f"eventhubs://ns.servicebus.windows.net/hub?SharedAccessKey={SECRET}",
        "eventhubs",
        "never put a secret",
    ),
]


@pytest.mark.parametrize(("spec", "system", "expected"), BAD_OPTIONS)
def test_sink_and_source_refuse_the_same_option_each_in_its_own_words(
    spec: str, system: str, expected: str, tmp_path: Path
) -> None:
    with pytest.raises(SinkError) as by_sink:
        create_sink(spec)
    with pytest.raises(SourceError) as by_source:
        create_source(spec, tmp_path)
    for caught, words in ((by_sink.value, f"{system} sink: "), (by_source.value, f"{system} source: ")):
        message = str(caught)
        assert message.startswith(words) and expected in message, message
        assert not caught.retryable and SECRET not in message
    assert str(by_sink.value).removeprefix(f"{system} sink: ").replace("sink spec", "") == str(
        by_source.value
    ).removeprefix(f"{system} source: ").replace("source spec", "")


def test_the_source_reads_its_secret_in_its_own_words(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SE_TEST_TRANSPORT_UNSET", raising=False)
    source = create_source(
        "kafka://h:9092/decisions?security_protocol=SASL_PLAINTEXT&sasl_mechanism=SCRAM-SHA-256"
        "&sasl_username=approver&sasl_password_env=SE_TEST_TRANSPORT_UNSET",
        tmp_path,
    )
    with pytest.raises(SourceError) as caught:
        source.open()
    assert not caught.value.retryable
    assert str(caught.value).startswith(
        "kafka source: environment variable SE_TEST_TRANSPORT_UNSET is not set"
    )


def test_one_spec_serves_both_directions(tmp_path: Path) -> None:
    """The sink's delivery options are part of the spec: a source checks them and ignores them."""
    kafka = "kafka://h:9092/decisions?linger_ms=20&compression=zstd&idempotence=false"
    assert create_sink(kafka).options.linger_ms == 20  # type: ignore[attr-defined]
    assert create_source(kafka, tmp_path).topic == "decisions"  # type: ignore[attr-defined]


def test_a_file_agent_loads_no_transport_sdk() -> None:
    """Cloud SDKs and librdkafka are imported only when a spec names them."""
    code = (
        "import sys, bridge.sinks, bridge.sinks.file, bridge.streams, bridge.streams.file, "
        "bridge.transports.secrets, bridge.transports.azure, bridge.transports.eventhubs; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('confluent_kafka', 'azure')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ}
    ).stdout
    assert out.strip() == "[]"


def test_arm_acknowledge_answers_are_read_as_microsofts_cli_models_them() -> None:
    """Issue 34: any 2xx was audited approved. Microsoft's CLI extension for this API models 207 with
    an ``{"Error": {"Code": ...}}`` body, 204 empty, 404 bodies in ``error`` and ``Error`` casing and
    405 ``NotImplemented``: only what means approved is approved."""
    import json as _json

    from bridge.approver.arm import _answer

    class Response:
        def __init__(self, status: int, body: object = None) -> None:
            self.status_code, self._body = status, body
            self.headers = {"x-ms-correlation-request-id": "corr-1"}

        def json(self) -> object:
            if self._body is None:
                raise ValueError("no body")
            return _json.loads(_json.dumps(self._body))

    def read(status: int, body: object = None) -> tuple[str, str | None]:
        answer = _answer(Response(status, body))
        assert answer is not None
        return answer.outcome, answer.reason

    assert read(200, {"value": "Successfully Approved"}) == ("approved", None)
    assert read(204) == ("approved", None)
    assert read(207, {"value": "Successfully Approved"}) == ("approved", None)
    assert read(207, {"Error": {"Code": "EventNotFound", "Message": "x"}}) == ("refused", "armPartial")
    assert read(202) == ("unknown", "armUnexpected")
    assert read(404, {"Error": {"Code": "NotFound"}}) == ("refused", "armNotFound")
    assert read(405, {"error": {"code": "NotImplemented", "message": "not supported in the region"}}) == (
        "refused", "armNotSupported",
    )  # fmt: skip
    answer = _answer(Response(404, {"Error": {"Code": "ResourceNotFound", "Message": "gone"}}))
    assert answer is not None and answer.detail == "ResourceNotFound: gone"
    assert _answer(Response(429)) is None and _answer(Response(503)) is None


def test_kafka_readers_are_lean_unless_a_person_waits_on_the_backlog(tmp_path: Path) -> None:
    """Issue 33: librdkafka's fetch defaults (50 MiB a response, 64 MiB prefetched) took a restarted
    fleet approver past its 200 MB budget, and the 4 MiB limits that fixed it halved the console's
    backlog read. Every reader is lean but the console's, which asks for ``bulk``."""
    spec = "kafka://127.0.0.1:9/se-events"
    lean = create_source(spec, tmp_path, group="g").consumer_config()  # type: ignore[attr-defined]
    bulk = create_source(spec, tmp_path, group="g", bulk=True).consumer_config()  # type: ignore[attr-defined]
    assert lean["fetch.max.bytes"] == 4 * 1024 * 1024 and lean["queued.max.messages.kbytes"] == 4096
    assert bulk["fetch.max.bytes"] == 16 * 1024 * 1024 and bulk["queued.max.messages.kbytes"] == 16384
    console = (Path(__file__).resolve().parents[2] / "bridge" / "console" / "service.py").read_text()
    assert "bulk=True" in console
