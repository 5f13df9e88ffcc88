"""The table of secret shapes (bridge/support/redaction.py): every shape masked, the structure around it kept,
on raw text and on JSON log lines; and what reaches an operator from a sink (its name, its errors,
the dead-letter file, the sink-info metric label) carries none of them.

The property tests generate secrets from realistic alphabets (base64, hex, URL-safe, and ones with
``/ " = % +``; ``@`` and ``:`` too in a URL password) of at least 8 characters, so a secret can only
appear in the output if redaction left it there.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import re
import string
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from peers.http_receiver import Answer, HttpReceiver
from procs import wait_until
from prometheus_client import generate_latest

import bridge.support.redaction
from bridge.pipeline import DeliveryWorker, Outbox, PipelineMetrics, RecordMeta, Sink, SinkError
from bridge.sinks import create_sink
from bridge.support.observability import JsonFormatter
from bridge.support.observability import redact as redact_from_observability
from bridge.support.redaction import SHAPES, is_secret_name, redact, secrets_in
from bridge.support.retry import Backoff

GUID = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
TEAMS_PREFIX = f"https://contoso.webhook.office.com/webhookb2/{GUID}@{GUID}/IncomingWebhook/"


def json_escaped(secret: str) -> str:
    """How ``secret`` appears inside a JSON string."""
    return orjson.dumps(secret).decode()[1:-1]


def assert_masked(text: str, secret: str, kept: tuple[str, ...] = ()) -> str:
    out = redact(text)
    assert secret not in out, (text, out)
    assert json_escaped(secret) not in out, (text, out)
    for part in kept:
        assert part in out, (part, text, out)
    assert redact(out) == out, ("not idempotent", text, out, redact(out))
    return out


# --------------------------------------------------------------------------------------------------
# Table-driven: every shape the security review found, and the ones tests/unit/test_observability.py covers
# --------------------------------------------------------------------------------------------------

# (text, secret, parts that must stay)
CASES: list[tuple[str, str, tuple[str, ...]]] = [
    # query and connection-string parameters
    (
        "https://prod-12.westeurope.logic.azure.com/workflows/x/triggers/manual/paths/invoke?api-version=2016-10-01"
        "&sp=%2Ftriggers&sv=1.0&sig=AbCdEf0123456789AbCdEf0123456789#format=cloudevents",
        "AbCdEf0123456789AbCdEf0123456789",
        (
            "prod-12.westeurope.logic.azure.com",
            "api-version=2016-10-01",
            "sp=%2Ftriggers",
            "sig=***",
            "#format",
        ),
    ),
    (
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0a2V5MTIzNDU2Nzg=",
        "c2VjcmV0a2V5MTIzNDU2Nzg=",
        ("sb://ns.servicebus.windows.net/", "SharedAccessKeyName=send", "SharedAccessKey=***"),
    ),
    (
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature sr=ns"
        "&sig=U0lHTkFUVVJF&se=1700000000&skn=send",
        "U0lHTkFUVVJF",
        ("ns.servicebus.windows.net", "skn=send", "se=1700000000"),
    ),
    (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=QUNDT1VOVEtFWQ==;EndpointSuffix=core.windows.net",
        "QUNDT1VOVEtFWQ==",
        ("AccountName=acct", "AccountKey=***", "EndpointSuffix=core.windows.net"),
    ),
    ("kafka://user:hunter2@broker:9093/topic", "hunter2", ("kafka://user:***@broker:9093/topic",)),
    ("sasl.password=topsecret", "topsecret", ("sasl.password=***",)),
    ("https://x.example/hook?token=abc123def", "abc123def", ("x.example/hook?token=***",)),
    ("https://api.example.com/v1?api_key=APIKEY0001&x=1", "APIKEY0001", ("api_key=***", "x=1")),
    ("https://api.example.com/v1?x-api-key=APIKEY0002", "APIKEY0002", ("x-api-key=***",)),
    ("https://apim.azure-api.net/v1?subscription-key=APIMKEY003", "APIMKEY003", ("subscription-key=***",)),
    ("https://apim.azure-api.net/v1?subscription_key=APIMKEY004", "APIMKEY004", ("subscription_key=***",)),
    ("https://h.example/cb?access-token=ACCESSTOK5", "ACCESSTOK5", ("access-token=***",)),
    ("https://h.example/cb?auth_token=AUTHTOKEN6", "AUTHTOKEN6", ("auth_token=***",)),
    ("client_id=app&client_secret=CLIENTSECRET7", "CLIENTSECRET7", ("client_id=app", "client_secret=***")),
    ("grant_type=refresh_token&refresh_token=REFRESHTOK8", "REFRESHTOK8", ("grant_type=refresh_token",)),
    ("id_token=IDTOKEN000009&state=abc", "IDTOKEN000009", ("id_token=***", "state=abc")),
    ("private_key=PRIVATEKEY10 user=me", "PRIVATEKEY10", ("private_key=***", "user=me")),
    ("https://fn.azurewebsites.net/api/hook?code=FUNCTIONKEY11==", "FUNCTIONKEY11", ("code=***",)),
    # webhook URLs whose path is the secret
    (
        "https://hooks.slack.com/services/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",
        "SLACKSECRETSLACKSECRET12",
        ("https://hooks.slack.com/services/***",),
    ),
    (
        "https://hooks.slack.com/workflows/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",
        "WORKFLOWSECRET13",
        ("https://hooks.slack.com/workflows/***",),
    ),
    (
        f"{TEAMS_PREFIX}TEAMSSECRET0123456789abcdef14/{GUID}/V2abcdefghijklmnop",
        "TEAMSSECRET0123456789abcdef14",
        ("https://contoso.webhook.office.com/webhookb2/***",),
    ),
    (
        f"https://outlook.office.com/webhook/{GUID}@{GUID}/IncomingWebhook/OUTLOOKSECRET15/{GUID}",
        "OUTLOOKSECRET15",
        ("https://outlook.office.com/webhook/***",),
    ),
    (
        "https://discord.com/api/webhooks/1234567890123456789/DISCORD-token_secret16",
        "DISCORD-token_secret16",
        ("https://discord.com/api/webhooks/***",),
    ),
    (
        "https://discordapp.com/api/webhooks/1234567890123456789/DISCORDAPP-secret17",
        "DISCORDAPP-secret17",
        ("https://discordapp.com/api/webhooks/***",),
    ),
    (
        "https://chat.googleapis.com/v1/spaces/AAAAspace/messages?key=AIzaGOOGLEKEY18&token=GCHATTOKEN19%3D",
        "AIzaGOOGLEKEY18",
        ("chat.googleapis.com/v1/spaces/AAAAspace/messages?key=***&token=***",),
    ),
    (
        "https://chat.googleapis.com/v1/spaces/AAAAspace/messages?key=AIzaGOOGLEKEY18&token=GCHATTOKEN19%3D",
        "GCHATTOKEN19",
        (),
    ),
    (
        "https://mattermost.example.com/hooks/MATTERMOSTTOKEN20",
        "MATTERMOSTTOKEN20",
        ("mattermost.example.com/hooks/***",),
    ),
    (
        "https://hooks.zapier.com/hooks/catch/123/ZAPIERSECRET21/",
        "ZAPIERSECRET21",
        ("hooks.zapier.com/hooks/***",),
    ),
    (
        "https://api.telegram.org/bot123456:TELEGRAM-secret_22/sendMessage",
        "TELEGRAM-secret_22",
        ("https://api.telegram.org/bot***",),
    ),
    # user info: a password with '/', '@', ':' (raw or %-encoded)
    ("https://user:pa/ss@host.example/x", "pa/ss", ("https://user:***@host.example/x",)),
    ("https://user:p@ss:w/rd23@host.example/x", "p@ss:w/rd23", ("https://user:***@host.example/x",)),
    ("amqps://user:p%40ss%3Aw%2Frd24@host.example", "p%40ss%3Aw%2Frd24", ("amqps://user:***@host.example",)),
    ("https://:TOKENONLY25@host.example/x", "TOKENONLY25", ("@host.example/x",)),
    # values with quotes, raw and JSON-escaped
    ('password="abc\\"def26" next', 'abc\\"def26', ('password="***" next',)),
    ('{"password": "a\\"b27secret", "user": "me"}', 'a\\"b27secret', ('{"password": "***", "user": "me"}',)),
    ("{'password': 'it\"s28secret', 'user': 'me'}", 'it"s28secret', ("{'password': '***', 'user': 'me'}",)),
    ('password=raw"quote29 next', 'raw"quote29', ("password=*** next",)),
    # HTTP headers as text
    (
        "Authorization: Bearer eyJhbGciOiJSUzI1NiJ9-not-a-jwt30",
        "eyJhbGciOiJSUzI1NiJ9-not-a-jwt30",
        ("Authorization: Bearer ***",),
    ),
    ("Authorization: Basic dXNlcjpwYXNzd29yZDMx", "dXNlcjpwYXNzd29yZDMx", ("Authorization: Basic ***",)),
    ("proxy-authorization: Basic UFJPWFlTRUNSRVQ=", "UFJPWFlTRUNSRVQ=", ("proxy-authorization: Basic ***",)),
    (
        "Authorization: SharedAccessSignature sr=ns&sig=SASSIG32&se=1&skn=send",
        "SASSIG32",
        ("Authorization: SharedAccessSignature ***",),
    ),
    (
        "x-api-key: APIKEYHEADER33\r\nHost: h.example",
        "APIKEYHEADER33",
        ("x-api-key: ***\r\nHost: h.example",),
    ),
    (
        "Ocp-Apim-Subscription-Key: 0123456789abcdef34",
        "0123456789abcdef34",
        ("Ocp-Apim-Subscription-Key: ***",),
    ),
    ("aeg-sas-key: EVENTGRIDKEY35=", "EVENTGRIDKEY35=", ("aeg-sas-key: ***",)),
    ("aeg-sas-token: r=https%3a%2f%2ft&e=1&s=EGSIG36", "EGSIG36", ("aeg-sas-token: ***",)),
    ("Cookie: theme=dark; session=COOKIESESSION37", "COOKIESESSION37", ("Cookie: ***",)),
    (
        '{"Authorization": "Bearer JSONBEARER38", "b": 1}',
        "JSONBEARER38",
        ('"Authorization": "Bearer ***", "b": 1',),
    ),
    # any case; and a text whose lower case is longer ('İ' -> 'i̇') still lines up
    ("AUTHORIZATION: BEARER UPPERCASETOKEN41", "UPPERCASETOKEN41", ("AUTHORIZATION: BEARER ***",)),
    (
        "İzmir: SHAREDACCESSKEY=UNICODEKEY42;ENTITYPATH=x",
        "UNICODEKEY42",
        ("İzmir: SHAREDACCESSKEY=***;ENTITYPATH=x",),
    ),
    # bearer tokens and keys with no name
    (
        "token refused: eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJlMzk",
        "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJlMzk",
        ("token refused: ***",),
    ),
    (
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC40\n-----END PRIVATE KEY-----",
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC40",
        ("-----BEGIN PRIVATE KEY-----***-----END PRIVATE KEY-----",),
    ),
]


@pytest.mark.parametrize(("text", "secret", "kept"), CASES)
def test_every_shape_is_masked_and_its_structure_kept(text: str, secret: str, kept: tuple[str, ...]) -> None:
    assert_masked(text, secret, kept)
    # The same text as a field of a JSON log line: still masked, still valid JSON.
    line = orjson.dumps({"msg": f"failed: {text}", "n": 1}).decode()
    out = assert_masked(line, secret)
    assert json.loads(out)["n"] == 1


# Non-secret text and spec options that must come out unchanged: a sink's id is a hash of its redacted
# spec, so masking a harmless option would also move its cursor.
HARMLESS = [
    "file:///var/log/se-bridge/records.jsonl",
    "stdout:",
    "http://127.0.0.1:8080/hook#format=json&timeout=5",
    "https://h.example:8443/a@b",
    "https://[::1]:8443/x",
    "eventhubs://ns.servicebus.windows.net/hub?credential=managed&client_id=" + GUID,
    "eventhubs://ns.servicebus.windows.net/hub?connection_string_env=EH_CONN",
    "kafka://b1:9093,b2:9093/topic?security_protocol=SASL_SSL&sasl_mechanism=PLAIN"
    "&sasl_username=$ConnectionString&sasl_password_env=KAFKA_PASSWORD",
    "https://h.example/x#hmac_key_env=HMAC&aeg_key_file=/etc/k&header_env.Authorization=TOKEN_VAR",
    "https://h.example/x#header_file.X-Api-Key=/run/secrets/key&header.X-Note=a",
    "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;EntityPath=hub",
    "exit code=1, status code: 500, api-version=2016-10-01",
    "invalid credentials: *** is expired",
    # prose: a secret word alone before ':' names no value
    "webhook sink https://h.example/x: HMAC key: environment variable HMAC is not set",
    "no OAUTHBEARER token: Local: Broker transport failure",
    "key: at least one --key KEYID=PATH is required",
    "webhook sink https://h.example/x: for header Authorization, environment variable T is not set",
    '{"ts":"2026-01-01T00:00:00Z","level":"info","msg":"delivered","sink":"https-0123456789ab","records":3}',
]


@pytest.mark.parametrize("text", HARMLESS)
def test_harmless_text_and_spec_options_are_left_alone(text: str) -> None:
    assert redact(text) == text


def test_secret_names() -> None:
    for name in (
        "password",
        "api_key",
        "x-api-key",
        "SharedAccessKey",
        "AccountKey",
        "client_secret",
        "sasl.password",
        "refresh_token",
        "Ocp-Apim-Subscription-Key",
        "sig",
        "apiKey",
    ):
        assert is_secret_name(name), name
    for name in (
        "SharedAccessKeyName",
        "api-version",
        "sasl_password_env",
        "hmac_key_file",
        "credential",
        "keyId",
        "signal",
        "errorKind",
        "sink",
        "header_env.Authorization",
    ):
        assert not is_secret_name(name), name


def test_the_table_is_well_formed_and_observability_reexports_redact() -> None:
    names = [shape.name for shape in SHAPES]
    assert len(names) == len(set(names))
    for shape in SHAPES:
        assert shape.keeps and shape.hints and shape.secret_groups
        assert all(h == h.lower() for h in shape.hints)  # compared with the lower-cased text
    assert redact_from_observability is redact


def test_redaction_is_a_leaf_of_the_standard_library() -> None:
    tree = ast.parse(Path(bridge.support.redaction.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    top = {name.partition(".")[0] for name in imported}
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, top


def test_secrets_in_returns_what_redact_masks() -> None:
    url = "https://hooks.slack.com/services/T0/B0/SLACKTOKEN?x=1&sig=SIGVALUE"
    assert secrets_in(url) == ["T0/B0/SLACKTOKEN", "SIGVALUE"]
    assert secrets_in("nothing to see") == []


def test_pathological_input_stays_linear() -> None:
    # No nested repetition can blow up: long runs of what patterns repeat over, and no match at the end.
    for text in ("a" * 100_000, "https://u:" + "a" * 50_000, "key=" + '"a' * 30_000, "x://" + "a:" * 30_000):
        started = time.process_time()
        redact(text)
        assert time.process_time() - started < 5, text[:20]  # ms in practice; seconds would be a blow-up


# --------------------------------------------------------------------------------------------------
# JSON log lines
# --------------------------------------------------------------------------------------------------


def format_line(msg: str, *args: object, **extra: object) -> str:
    record = logging.LogRecord("test.redaction", logging.WARNING, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return JsonFormatter().format(record)


def test_json_log_lines_mask_credential_fields_of_any_type_and_stay_json() -> None:
    line = format_line(
        "posting to %s",
        "https://hooks.slack.com/services/T0/B0/SLACKLOGSECRET",
        token=12345678901234,
        password=["PASSWORDINLIST"],
        sasKey={"primary": "NESTEDKEYVALUE"},
        body='{"client_secret": "a\\"BODYSECRET"}',
        enabled=True,
        nothing=None,
    )
    for secret in ("SLACKLOGSECRET", "12345678901234", "PASSWORDINLIST", "NESTEDKEYVALUE", "BODYSECRET"):
        assert secret not in line, line
    out = json.loads(line)
    assert out["token"] == out["password"] == out["sasKey"] == "***"
    assert out["msg"] == "posting to https://hooks.slack.com/services/***"
    assert out["enabled"] is True and out["nothing"] is None


# --------------------------------------------------------------------------------------------------
# Property: generated secrets in every supported position
# --------------------------------------------------------------------------------------------------

ALNUM = string.ascii_letters + string.digits
B64 = st.builds(
    lambda body, pad: body + "=" * pad, st.text(ALNUM + "+/", min_size=8, max_size=44), st.integers(0, 2)
)
SECRETS = st.one_of(
    B64,
    st.text("0123456789abcdef", min_size=8, max_size=64),
    st.text(ALNUM + "-_", min_size=8, max_size=48),
    st.text(ALNUM + '/"=%+', min_size=8, max_size=48),
)
# A URL password may also hold '@' and ':' unencoded.
PASSWORDS = st.one_of(SECRETS, st.text(ALNUM + '/"=%+@:', min_size=8, max_size=48))


@dataclass(frozen=True)
class Position:
    template: str  # `{s}` is the secret
    kept: tuple[str, ...]
    secrets: st.SearchStrategy[str] = SECRETS
    escape: Callable[[str], str] = str  # how the secret is written in this text


POSITIONS: dict[str, Position] = {
    "query sig": Position(
        "https://prod-1.westeurope.logic.azure.com/workflows/w/invoke?api-version=2016-10-01&sp=%2Ft&sv=1.0"
        "&sig={s}#format=cloudevents",
        ("prod-1.westeurope.logic.azure.com", "api-version=2016-10-01", "sig="),
    ),
    "query sig mid": Position(
        "https://acct.blob.core.windows.net/c?sv=2022&sig={s}&se=2030", ("acct.blob", "sig=")
    ),
    "query code": Position("https://fn.azurewebsites.net/api/h?code={s}", ("fn.azurewebsites.net", "code=")),
    "query api_key": Position("https://api.example.com/v1?api_key={s}&x=1", ("api.example.com", "api_key=")),
    "query subscription-key": Position(
        "https://a.azure-api.net/x?subscription-key={s}", ("subscription-key=",)
    ),
    "query access-token": Position("https://a.example/cb?access-token={s}", ("a.example", "access-token=")),
    "google chat key": Position(
        "https://chat.googleapis.com/v1/spaces/SP/messages?key={s}&token=t", ("chat.googleapis.com", "key=")
    ),
    "google chat token": Position(
        "https://chat.googleapis.com/v1/spaces/SP/messages?key=k&token={s}", ("chat.googleapis.com", "token=")
    ),
    "slack": Position(
        "https://hooks.slack.com/services/T0AAA/B0BBB/{s}", ("https://hooks.slack.com/services/",)
    ),
    "slack workflow": Position(
        "https://hooks.slack.com/workflows/T0/A0/1/{s}", ("hooks.slack.com/workflows/",)
    ),
    "teams": Position(TEAMS_PREFIX + "{s}/" + GUID, ("https://contoso.webhook.office.com/webhookb2/",)),
    "outlook": Position(
        f"https://outlook.office.com/webhook/{GUID}@{GUID}/IncomingWebhook/{{s}}/{GUID}",
        ("outlook.office.com",),
    ),
    "discord": Position(
        "https://discord.com/api/webhooks/1234567890/{s}", ("https://discord.com/api/webhooks/",)
    ),
    "mattermost": Position("https://mm.example.com/hooks/{s}", ("https://mm.example.com/hooks/",)),
    "telegram": Position("https://api.telegram.org/bot{s}/sendMessage", ("https://api.telegram.org/bot",)),
    "user info": Position(
        "https://user:{s}@host.example/path?x=1", ("https://user:", "@host.example/path"), PASSWORDS
    ),
    "user info kafka": Position(
        "kafka://svc:{s}@broker.example:9093/topic", ("@broker.example:9093/topic",), PASSWORDS
    ),
    "event hubs key": Position(
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=n;SharedAccessKey={s}",
        ("sb://ns.servicebus.windows.net/", "SharedAccessKeyName=n", "SharedAccessKey="),
    ),
    "event hubs key mid": Position(
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=n;SharedAccessKey={s};EntityPath=hub",
        ("SharedAccessKeyName=n", "SharedAccessKey="),
    ),
    "event hubs sas": Position(
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature sr=ns"
        "&sig={s}&se=1",
        ("sb://ns.servicebus.windows.net/",),
    ),
    "storage key": Position(
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={s};EndpointSuffix=core.windows.net",
        ("AccountName=acct", "AccountKey="),
    ),
    "sql password": Position("Server=tcp:db;User ID=u;Password={s};Encrypt=true", ("User ID=u", "Password=")),
    "sasl.password": Position("sasl.mechanism=PLAIN sasl.password={s} sasl.username=u", ("sasl.password=",)),
    "client_secret": Position("client_id=app&client_secret={s}&scope=x", ("client_id=app", "client_secret=")),
    "refresh_token": Position("refresh_token: {s}", ("refresh_token",)),
    "private_key": Position("private_key={s}", ("private_key=",)),
    "quoted escaped": Position(
        'password="{s}" user=me', ('password="', "user=me"), escape=lambda s: s.replace('"', '\\"')
    ),
    "json field": Position(
        '{{"client_secret": "{s}", "user": "me"}}',
        ('"client_secret": "', '"user": "me"'),
        escape=json_escaped,
    ),
    "authorization bearer": Position(
        "POST /x HTTP/1.1\r\nAuthorization: Bearer {s}\r\nHost: h", ("Bearer", "Host: h")
    ),
    "authorization basic": Position("Authorization: Basic {s}", ("Authorization: Basic",)),
    "x-api-key header": Position("x-api-key: {s}\r\nAccept: */*", ("x-api-key:", "Accept: */*")),
    "apim header": Position("Ocp-Apim-Subscription-Key: {s}", ("Ocp-Apim-Subscription-Key:",)),
    "event grid header": Position("aeg-sas-key: {s}", ("aeg-sas-key:",)),
    "event grid token header": Position("aeg-sas-token: r=x&e=1&s={s}", ("aeg-sas-token:",)),
    "upper-case header": Position("X-API-KEY: {s}", ("X-API-KEY:",)),
    "upper-case key after İ": Position("İ ACCOUNTKEY={s};X=1", ("İ ACCOUNTKEY=",)),
}

# `scheme://name:1234/...@host` is read as a host and its port (RFC 3986), not as a password: a
# generated password of digits before '/', '?' or '#' is outside what can be told apart.
_PORT_LIKE = re.compile(r"\d{1,5}(?:[/?#]|$)")


@st.composite
def placed(draw: st.DrawFn) -> tuple[str, str, str, Position]:
    name = draw(st.sampled_from(sorted(POSITIONS)))
    position = POSITIONS[name]
    secret = draw(position.secrets)
    if name.startswith("user info"):
        assume(not _PORT_LIKE.match(secret))
    written = position.escape(secret)
    return name, secret, position.template.replace("{s}", written), position


@given(placed())
def test_a_generated_secret_never_survives_in_any_position(case: tuple[str, str, str, Position]) -> None:
    _name, secret, text, position = case
    written = position.escape(secret)
    out = assert_masked(text, secret, position.kept)
    assert written not in out
    # The same text inside a JSON log line, redacted as a whole line (the formatter's last step) ...
    line = orjson.dumps({"msg": f"POST failed: {text}", "sink": text, "n": 1}).decode()
    out = assert_masked(line, secret)
    assert json.loads(out)["n"] == 1, out
    # ... and through the formatter, as message, field and nested field.
    formatted = format_line("POST failed: %s", text, sink=text, nested={"errors": [text]}, n=1)
    assert secret not in formatted and json_escaped(secret) not in formatted, formatted
    assert json.loads(formatted)["n"] == 1


@given(st.text(string.printable, max_size=200), SECRETS)
def test_redact_is_idempotent_on_any_text(text: str, secret: str) -> None:
    for sample in (
        text,
        f"{text}?sig={secret}",
        f'{text} password="{secret}"',
        f"Authorization: Bearer {text}",
    ):
        once = redact(sample)
        assert redact(once) == once, (sample, once)


# --------------------------------------------------------------------------------------------------
# What a sink shows: its name (metric label, dead letters, logs) and its errors
# --------------------------------------------------------------------------------------------------

# A webhook sink is shown as scheme://host/<hidden:fingerprint> (bridge.sinks.webhook.display_name):
# the second element is what must be shown, the path never.
WEBHOOK_SPECS = {
    "slack": (
        "https://hooks.slack.com/services/T0AAAA/B0BBBB/{t}#format=json",
        "https://hooks.slack.com/<hidden:",
    ),
    "teams": (TEAMS_PREFIX + "{t}/" + GUID + "#format=json", "https://contoso.webhook.office.com/<hidden:"),
    "discord": ("https://discord.com/api/webhooks/1234567890/{t}", "https://discord.com/<hidden:"),
    "logic apps": (
        "https://prod-1.westeurope.logic.azure.com/workflows/w/triggers/manual/paths/invoke?api-version=2016-10-01"
        "&sp=%2Ft&sv=1.0&sig={t}#format=cloudevents",
        "https://prod-1.westeurope.logic.azure.com/<hidden:",
    ),
    "unknown host": ("https://chat.example.com/services/T000/B000/{t}", "https://chat.example.com/<hidden:"),
}


def sink_info_label(sink: Sink) -> str:
    metrics = PipelineMetrics()
    metrics.sink_info.labels(sink.id, sink.name).set(1)  # as the agent does for every sink
    return generate_latest(metrics.registry).decode()


@pytest.mark.parametrize("kind", sorted(WEBHOOK_SPECS))
def test_webhook_sink_names_carry_no_token(kind: str) -> None:
    token = "TOKEN" + "x1Y2z3" * 4
    template, shown = WEBHOOK_SPECS[kind]
    sink = create_sink(template.format(t=token))
    assert shown in sink.name and token not in sink.name and token not in sink.id
    assert token not in sink_info_label(sink)
    if kind != "unknown host":  # free text: only the shapes the table knows (the second defence)
        assert token not in str(SinkError(f"POST to {sink.spec} failed"))


def built_sinks(tb: TracebackType | None) -> Iterator[Sink]:
    """The sink objects whose construction raised (their ``name`` was set before the refusal)."""
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if isinstance(candidate, Sink):
            yield candidate
        tb = tb.tb_next


@pytest.mark.parametrize(
    "spec",
    [
        "kafka://broker.example:9093/topic?security_protocol=SASL_SSL&sasl_password={t}",
        "kafka://broker.example:9093/topic?sasl.password={t}",
        "kafka://user:{t}@broker.example:9093/topic",
    ],
)
def test_a_kafka_spec_with_an_inline_password_is_refused_without_showing_it(spec: str) -> None:
    pytest.importorskip("confluent_kafka")
    secret = "KAFKAPW" + "a/b=c%d+e" * 2
    with pytest.raises(SinkError) as info:
        create_sink(spec.format(t=secret))
    assert not info.value.retryable and secret not in str(info.value)
    sinks = list(built_sinks(info.tb))
    assert sinks, "the kafka sink refuses its spec from inside its constructor"
    for sink in sinks:
        assert secret not in sink.name and "broker.example" in sink.name
        assert secret not in sink_info_label(sink)


def test_dead_letters_logs_and_metrics_never_carry_a_webhook_token(
    tmp_path: Path, receiver: HttpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A Slack URL (reached through the receiver as a proxy: nothing leaves the machine) refuses the
    record with 404 and echoes the token, alone and in the URL: the dead-letter file, the log lines
    and the metrics show neither."""
    token = "SLACKtoken" + "Q9w8E7r6" * 3
    url = f"http://hooks.slack.com/services/T0AAAA/B0BBBB/{token}"
    receiver.default = Answer(404, f"no_service: {token} is not a webhook ({url})".encode())
    sink = create_sink(f"{url}#allow_http=true&proxy={receiver.url}&timeout=5")
    metrics = PipelineMetrics()
    metrics.sink_info.labels(sink.id, sink.name).set(1)
    outbox = Outbox(tmp_path / "outbox", [sink.id])
    outbox.append(RecordMeta("00000000-0000-5000-8000-000000000001", "scheduledEvents", "vm"), b'{"n":1}')
    worker = DeliveryWorker(
        sink, outbox, metrics, tmp_path / "dead-letter", backoff=Backoff(base=0.01, cap=0.05)
    )
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logging.getLogger("bridge").addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, "bridge"):
            worker.start()
            wait_until(lambda: worker.dead_letter_path.exists(), what="the record in the dead-letter file")
            worker.stop(1)
            worker.join(5)
    finally:
        logging.getLogger("bridge").removeHandler(handler)
        outbox.close()
    assert receiver.requests()[0].target == url  # the real URL was used ...
    dead = worker.dead_letter_path.read_text()
    (letter,) = [orjson.loads(line) for line in dead.splitlines()]
    assert letter["sink"] == sink.name and letter["sink"].startswith("http://hooks.slack.com/<hidden:")
    assert "404" in letter["reason"]
    logged = stream.getvalue()
    assert "moved to dead-letter file" in logged
    for text in (dead, logged, generate_latest(metrics.registry).decode()):
        assert token not in text  # ... and shown nowhere


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as r:
        yield r


@pytest.mark.parametrize(
    "path",
    [
        "/services/T0001/B0002/slacktokenslacktoken0001",
        "/webhookb2/1111-2222@3333/IncomingWebhook/teamssecret0002/4444",
        "/api/webhooks/123456789/discordtoken-0003",
        "/hooks/mattermosttoken0004",
        "/bot123456:telegramtoken0005/sendMessage",
    ],
)
def test_library_request_lines_at_debug_level_carry_no_token(path: str) -> None:
    """Issue 31: at ``--log-level debug`` urllib3 writes ``host:port "POST <path> HTTP/1.1" 200``,
    and the webhook shapes did not see a path without its host. A real POST through requests to a
    real local server, the log set up as every service sets it up: the token never appears."""
    import http.server
    import io
    import logging
    import threading

    import requests

    from bridge.support.observability import setup_logging

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("debug", out)
        url = f"http://127.0.0.1:{server.server_address[1]}{path}"
        assert requests.post(url, json={}, timeout=5, proxies={"http": ""}).status_code == 200
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
        server.shutdown()
    text = out.getvalue()
    assert '"POST /***' in text  # urllib3 did write its request line, masked
    token = path.strip("/").split("/")[1] if not path.startswith("/bot") else path[4:].split("/")[0]
    assert token not in text and path not in text
