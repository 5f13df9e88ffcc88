"""The webhook sink against a real HTTP(S) server on loopback, in-process and through the agent process.

The receiver (tests/peers/http_receiver.py) is a stdlib ``ThreadingHTTPServer`` that records what
arrived and answers from a script (statuses, ``Retry-After``, answers slower than the sink's timeout,
connections closed without an answer). Signatures are checked with the consumer-side code of
docs/sink-webhook.md and CloudEvents are parsed with the ``cloudevents`` package, neither of which
shares code with the sink. No timing assertion: the one time check is a lower bound that the sink
must respect (it waited at least what ``Retry-After`` asked).
"""

from __future__ import annotations

import email.utils
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from peers.http_receiver import Answer, HttpReceiver, Received, TlsFiles, make_tls_files, verify_signature
from procs import Emulator, make_changes, wait_until

from bridge.pipeline import Entry, RecordMeta
from bridge.sinks import SinkError, create_sink
from bridge.sinks.webhook import EVENT_TYPE, MAX_RETRY_AFTER, WebhookSink, display_name

HMAC_KEY = secrets.token_hex(32)  # 64 ASCII bytes, like `openssl rand -hex 32`
LOGIC_APPS_QUERY = "api-version=2016-10-01&sp=%2Ftriggers%2Fmanual%2Frun&sv=1.0&sig={sig}"
LOGIC_APPS_PATH = "/workflows/3f1c9a7e0b2d4e6f8a1b2c3d4e5f6a7b/triggers/manual/paths/invoke"


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as r:
        yield r


@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    try:
        return make_tls_files(tmp_path / "tls")
    except ImportError:
        pytest.skip("the cryptography package is not installed (it comes with azure-identity)")


def record(n: int = 1, **vm: Any) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "recordType": "scheduledEvents",
        "recordId": f"00000000-0000-5000-8000-{n:012d}",
        "observedAt": "2026-11-22T09:36:23.510Z",
        "vm": {
            "vmId": "56a113c1-0feb-51aa-9c10-e190bf78f4e1",
            "name": "vm-bridge-0",
            "resourceId": None,
            **vm,
        },
        "documentIncarnation": n,
        "events": [],
    }


def entry(n: int = 1, **vm: Any) -> Entry:
    rec = record(n, **vm)
    return Entry(n, RecordMeta.of(rec), time.time(), orjson.dumps(rec))


def sink(spec: str) -> WebhookSink:
    s = create_sink(spec)
    assert isinstance(s, WebhookSink)
    s.open()
    return s


def accepted(reqs: list[Received], timeout: float | None = None) -> list[Received]:
    """Requests the receiver answered 2xx in time (a delayed answer past the client's timeout is not)."""
    return [
        r
        for r in reqs
        if r.answer.status < 300 and not r.answer.drop and (timeout is None or r.answer.delay < timeout)
    ]


def record_id(req: Received) -> str:
    return req.headers["x-se-bridge-record-id"]


# --------------------------------------------------------------------------------------------------
# In-process: configuration, classification, TLS, proxies
# --------------------------------------------------------------------------------------------------

REFUSED = {
    "http://192.0.2.10/hook": "allow_http=true",
    "https://hooks.example.invalid/x#format=xml": "format must be one of",
    "https://hooks.example.invalid/x#timeout=0": "timeout must be",
    "https://hooks.example.invalid/x#verify=false": "verify=false is not offered",
    "https://hooks.example.invalid/x#insecure_skip_verify=true": "insecure_skip_verify is not offered",
    "https://hooks.example.invalid/x#colour=blue": "unknown option 'colour'",
    "https://hooks.example.invalid/x#header.Authorization=Bearer%20s3cr3t-inline": "header_env.Authorization",
    "https://hooks.example.invalid/x#header.X-Api-Key=s3cr3t-inline": "looks like a credential",
    "https://hooks.example.invalid/x#header.Content-Type=text/plain": "set by the sink",
    "https://hooks.example.invalid/x#hmac_key_env=A&hmac_key_file=/k": "either hmac_key_env or hmac_key_file",
    "https://hooks.example.invalid/x#aeg_key_env=EG": "only apply to format=eventgrid",
    "https://hooks.example.invalid/x#proxy=http://user:pw@proxy:3128": "HTTPS_PROXY",
    "https://hooks.example.invalid/x#format=json&format=cloudevents": "given twice",
    "https://hooks.example.invalid/x#format": "name=value pairs",
}


@pytest.mark.parametrize("spec", sorted(REFUSED))
def test_unusable_specs_are_refused_permanently_without_echoing_secrets(spec: str) -> None:
    with pytest.raises(SinkError) as info:
        create_sink(spec)
    assert not info.value.retryable and info.value.kind == "config"
    assert REFUSED[spec] in str(info.value)
    assert "s3cr3t" not in str(info.value) and "pw@" not in str(info.value)


def test_secrets_from_the_environment_and_files_are_checked_at_open(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("SE_TEST_MISSING", raising=False)
    monkeypatch.setenv("SE_TEST_SHORT", "x" * 31)
    short = tmp_path / "short.key"
    short.write_text("y" * 31 + "\n")
    for spec, message in [
        ("https://h.example.invalid/x#hmac_key_env=SE_TEST_MISSING", "SE_TEST_MISSING is not set"),
        ("https://h.example.invalid/x#hmac_key_env=SE_TEST_SHORT", "31 bytes, at least 32"),
        (f"https://h.example.invalid/x#hmac_key_file={short}", "31 bytes, at least 32"),  # newline cut
        (f"https://h.example.invalid/x#hmac_key_file={tmp_path}/nope", "cannot read"),
        ("https://h.example.invalid/x#header_env.Authorization=SE_TEST_MISSING", "header Authorization"),
        (f"https://h.example.invalid/x#ca_file={tmp_path}/none.pem", "does not exist"),
        (f"https://h.example.invalid/x#ca_file={short}", "not a PEM CA bundle"),
    ]:
        with pytest.raises(SinkError) as info:
            create_sink(spec).open()  # no network: open only reads and checks the configuration
        assert not info.value.retryable, spec
        assert message in str(info.value), (spec, str(info.value))
    good = tmp_path / "good.key"
    good.write_text("z" * 32 + "\n")
    create_sink(f"https://h.example.invalid/x#hmac_key_file={good}").open()
    create_sink("http://192.0.2.10/hook#allow_http=true")  # explicitly allowed: accepted, never contacted


def test_logic_apps_url_is_posted_as_given_and_its_sig_never_shown(receiver: HttpReceiver) -> None:
    sig = secrets.token_urlsafe(32)
    query = LOGIC_APPS_QUERY.format(sig=sig)
    spec = f"{receiver.url}{LOGIC_APPS_PATH}?{query}#format=cloudevents&timeout=5"
    s = sink(spec)
    assert s.name == display_name(spec) and sig not in s.name and sig not in s.id
    assert "/workflows/" not in s.name and "sp=" not in s.name
    s.deliver(entry(1))
    (req,) = receiver.requests()
    assert req.target == f"{LOGIC_APPS_PATH}?{query}"  # sp stays %2F-encoded, the fragment is not sent
    # A failing server that echoes the URL (here unescaped and in a sentence) in its error body:
    receiver.queue(Answer(500, f"trigger failed for ...invoke?{query} (sig {sig})".encode()))
    with pytest.raises(SinkError) as info:
        s.deliver(entry(2))
    assert info.value.retryable and info.value.kind == "http_5xx"
    assert sig not in str(info.value) and "answered 500" in str(info.value)


def test_a_server_echoing_a_credential_header_does_not_leak_it(receiver: HttpReceiver, monkeypatch) -> None:
    token = secrets.token_urlsafe(24)
    monkeypatch.setenv("SE_TEST_TOKEN", f"Bearer {token}")
    s = sink(f"{receiver.url}/hook#header_env.Authorization=SE_TEST_TOKEN&header.X-Note=a+b%20c%26d")
    receiver.queue(Answer(401, f"invalid credentials: {token} is expired".encode()))
    with pytest.raises(SinkError) as info:
        s.deliver(entry())
    assert not info.value.retryable and info.value.kind == "http_401"
    assert token not in str(info.value) and "invalid credentials: *** is expired" in str(info.value)
    (req,) = receiver.requests()
    assert req.headers["authorization"] == f"Bearer {token}"
    assert req.headers["x-note"] == "a+b c&d"  # only %-escapes are decoded in options, '+' stays


STATUSES = {
    200: None,
    201: None,
    202: None,
    204: None,
    408: ("http_408", False),
    429: ("http_429", False),
    500: ("http_5xx", False),
    502: ("http_5xx", False),
    503: ("http_5xx", False),
    400: ("http_400", True),
    401: ("http_401", True),
    403: ("http_403", True),
    404: ("http_404", True),
    413: ("http_413", True),
    422: ("http_422", True),
    301: ("http_3xx", True),
    307: ("http_3xx", True),
}


def test_answers_are_classified(receiver: HttpReceiver) -> None:
    s = sink(f"{receiver.url}/hook#timeout=5")
    for status, expected in STATUSES.items():
        receiver.queue(
            Answer(status, b'{"error": "nope"}' if status >= 300 else b"", {"Location": "/elsewhere"})
        )
        if expected is None:
            s.deliver(entry(status))
            continue
        with pytest.raises(SinkError) as info:
            s.deliver(entry(status))
        assert (info.value.kind, not info.value.retryable) == expected, status
        if status >= 400:
            assert str(status) in str(info.value) and '{"error": "nope"}' in str(info.value)
    assert receiver.connections == 1  # one kept-alive connection for every answer
    assert len(receiver.requests()) == len(STATUSES)  # a redirect is not followed


def test_retry_after_seconds_and_http_dates(receiver: HttpReceiver) -> None:
    """Parsing itself is tested in tests/unit/test_retry.py; here: what the sink takes from a real answer."""
    s = sink(f"{receiver.url}/hook")
    receiver.queue(
        Answer(503, headers={"Retry-After": email.utils.formatdate(time.time() + 60, usegmt=True)}),
        Answer(429, headers={"Retry-After": "86400"}),
        Answer(429, headers={"Retry-After": "inf"}),
    )
    waits = []
    for _ in range(3):
        with pytest.raises(SinkError) as info:
            s.deliver(entry())
        waits.append(info.value.retry_after)
    assert waits[0] is not None and 50 <= waits[0] <= 60
    assert waits[1:] == [MAX_RETRY_AFTER, None]  # a day is capped; "inf" is not a delay


def test_a_connection_dropped_before_the_answer_is_retried_once_at_once(receiver: HttpReceiver) -> None:
    s = sink(f"{receiver.url}/hook")
    receiver.queue(Answer(drop=True))
    s.deliver(entry(1))  # the second attempt, on a new connection, succeeds
    assert [r.answer.drop for r in receiver.requests()] == [True, False]
    receiver.queue(Answer(drop=True), Answer(drop=True))
    with pytest.raises(SinkError) as info:
        s.deliver(entry(2))
    assert info.value.kind == "connection" and info.value.retryable
    assert len(receiver.requests()) == 4  # not more than one immediate retry


def test_tls_is_verified_and_a_private_ca_is_accepted(tls_files: TlsFiles) -> None:
    with HttpReceiver(tls=tls_files) as r:
        with pytest.raises(SinkError) as info:
            sink(f"{r.url}/hook").deliver(entry(1))
        assert info.value.kind == "tls" and info.value.retryable  # the backlog waits for a fix
        assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)
        assert r.requests() == []  # nothing was sent to the unverified server
        sink(f"{r.url}/hook#ca_file={tls_files.ca}").deliver(entry(2))
        sink(f"https://localhost:{r.port}/hook#verify={tls_files.ca}").deliver(entry(3))  # alias
        assert [record_id(q) for q in r.requests()] == [entry(2).record_id, entry(3).record_id]


def test_proxies_from_the_option_and_the_environment(receiver: HttpReceiver, monkeypatch) -> None:
    """The receiver plays the proxy: a request for an absolute URL reaches it. The target's host name
    cannot resolve (.invalid), so nothing else on the network is ever contacted."""
    s = sink(f"http://hooks.example.invalid/hook#allow_http=true&proxy={receiver.url}")
    s.deliver(entry(1))
    assert receiver.requests()[-1].target == "http://hooks.example.invalid/hook"
    monkeypatch.setenv("HTTP_PROXY", receiver.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    sink("http://hooks.example.invalid/env#allow_http=true").deliver(entry(2))
    assert receiver.requests()[-1].target == "http://hooks.example.invalid/env"
    # A loopback target never goes through the environment's proxy (one that does not exist here).
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    sink(f"{receiver.url}/direct").deliver(entry(3))
    assert receiver.requests()[-1].target == "/direct"


# --------------------------------------------------------------------------------------------------
# Through the agent: emulator -> agent process -> receiver
# --------------------------------------------------------------------------------------------------


def file_sink(tmp_path: Path) -> tuple[str, str]:
    """``--sink file://...`` for the agent's default records file (what Agent.records() reads)."""
    return "--sink", f"file://{tmp_path / 'records.jsonl'}"


def test_agent_delivers_signed_cloudevents_in_order(
    emulator: Emulator, make_agent, receiver: HttpReceiver, tmp_path: Path
) -> None:
    from cloudevents.core.bindings.http import HTTPMessage, from_http
    from cloudevents.core.formats.json import JSONFormat

    spec = f"{receiver.url}/hook#format=cloudevents&hmac_key_env=WEBHOOK_HMAC_KEY"
    # A proxy in the environment that does not exist: a loopback webhook must not go through it.
    env = {"WEBHOOK_HMAC_KEY": HMAC_KEY, "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
    agent = make_agent(emulator.url, *file_sink(tmp_path), sink=spec, env=env).start()
    ids = [r["recordId"] for r in make_changes(emulator, agent)]
    assert len(ids) == 8
    receiver.wait_for(lambda reqs: len(reqs) >= len(ids), what="every record at the receiver")
    reqs = receiver.requests()
    assert len(reqs) == len(ids)  # no failure, so no resend
    by_id = {r["recordId"]: r for r in agent.records(None)}
    for req in reqs:
        verify_signature(HMAC_KEY.encode(), req.headers, req.body)  # raises unless signed and fresh
        assert req.headers["content-type"] == "application/cloudevents+json"
        event = from_http(HTTPMessage(req.headers, req.body), JSONFormat())  # the SDK's own validation
        attrs = event.get_attributes()
        data = event.get_data()
        assert isinstance(data, dict)
        assert data == by_id[attrs["id"]]  # the record, unchanged
        assert attrs["specversion"] == "1.0"
        assert attrs["type"] == EVENT_TYPE
        assert attrs["source"] == data["vm"]["resourceId"] and attrs["source"].startswith("/subscriptions/")
        assert attrs["subject"] == data["vm"]["name"] == "vm-bridge-0"
        assert attrs["datacontenttype"] == "application/json"
        assert orjson.loads(req.body)["time"] == data["observedAt"]  # verbatim, not re-formatted
        assert record_id(req) == attrs["id"]
    assert [orjson.loads(r.body)["id"] for r in reqs] == ids  # all of them, in order
    assert receiver.connections == 1  # one kept-alive connection
    # The same body with another key, or an old timestamp, is rejected by the documented check.
    with pytest.raises(ValueError, match="bad signature"):
        verify_signature(b"k" * 64, reqs[0].headers, reqs[0].body)
    with pytest.raises(ValueError, match="stale"):
        verify_signature(HMAC_KEY.encode(), reqs[0].headers, reqs[0].body, now=time.time() + 301)


def test_agent_retries_transient_answers_and_dead_letters_refusals(
    emulator: Emulator, make_agent, receiver: HttpReceiver, tmp_path: Path
) -> None:
    spec = f"{receiver.url}/hook#timeout=1"
    agent = make_agent(emulator.url, *file_sink(tmp_path), sink=spec).start()
    receiver.wait_for(lambda reqs: len(reqs) == 1, what="the first record")
    receiver.queue(
        # record 2: two 5xx, a 429 asking for 2 s, then accepted
        Answer(500, b"upstream unavailable"),
        Answer(503),
        Answer(429, b"slow down", {"Retry-After": "2"}),
        Answer(202),
        # record 3: an answer slower than the sink's 1 s timeout, then accepted
        Answer(200, delay=3),
        Answer(202),
        # record 4: the connection dropped twice (the sink's immediate retry, then the worker's)
        Answer(drop=True),
        Answer(drop=True),
        Answer(202),
        # records 5 and 6 refused for good; record 7 accepted
        Answer(400, b'{"error": "schema mismatch: unexpected field changes"}'),
        Answer(413, b"<html><body><h1>413 Request Entity Too Large</h1></body></html>"),
    )
    for _ in range(6):
        agent.wait_for_change(emulator.add_event(eventType="Freeze"), "scheduled")
    ids = [r["recordId"] for r in agent.records()]
    assert len(ids) == 7
    receiver.wait_for(lambda reqs: len(accepted(reqs, 1)) == 5, 60, what="records 1-4 and 7 accepted")

    reqs = receiver.requests()
    assert [record_id(r) for r in accepted(reqs, 1)] == [ids[0], ids[1], ids[2], ids[3], ids[6]]
    attempts = [sum(1 for r in reqs if record_id(r) == i) for i in ids]
    assert attempts == [1, 4, 2, 3, 1, 1, 1]
    # The attempt after the 429 came no earlier than its Retry-After allowed.
    i429 = next(i for i, r in enumerate(reqs) if r.answer.status == 429)
    assert reqs[i429 + 1].arrived_mono - reqs[i429].arrived_mono >= 2.0

    sink_id = create_sink(spec).id
    dead = agent.state_dir / "dead-letter" / f"{sink_id}.jsonl"
    wait_until(lambda: dead.exists() and len(dead.read_bytes().splitlines()) == 2, what="two dead letters")
    lines = [orjson.loads(line) for line in dead.read_bytes().splitlines()]
    assert [d["record"]["recordId"] for d in lines] == [ids[4], ids[5]]
    assert [d["kind"] for d in lines] == ["http_400", "http_413"]
    assert "400" in lines[0]["reason"] and "schema mismatch" in lines[0]["reason"]
    assert "413" in lines[1]["reason"] and "Request Entity Too Large" in lines[1]["reason"]

    def failures(kind: str) -> float:
        return agent.metric("se_bridge_sink_failures_total", sink=sink_id, kind=kind)

    wait_until(lambda: agent.metric("se_bridge_sink_queue_depth", sink=sink_id) == 0, what="caught up")
    assert failures("http_5xx") == 2 and failures("http_429") == 1
    assert failures("timeout") == 1 and failures("connection") == 1
    assert agent.metric("se_bridge_sink_dead_letters_total", sink=sink_id) == 2
    assert agent.metric("se_bridge_sink_sent_total", sink=sink_id) == 7  # dead letters move the cursor


def test_logic_apps_sig_and_keys_never_reach_logs_or_metrics(
    emulator: Emulator, make_agent, receiver: HttpReceiver, tmp_path: Path
) -> None:
    sig = secrets.token_urlsafe(32)
    query = LOGIC_APPS_QUERY.format(sig=sig)
    # The failing server echoes the URL it was called with, as some gateways do.
    receiver.default = Answer(
        500, f'{{"error": "backend down", "url": "{LOGIC_APPS_PATH}?{query}"}}'.encode()
    )
    spec = f"{receiver.url}{LOGIC_APPS_PATH}?{query}#format=cloudevents&hmac_key_env=WEBHOOK_HMAC_KEY"
    agent = make_agent(emulator.url, *file_sink(tmp_path), sink=spec, env={"WEBHOOK_HMAC_KEY": HMAC_KEY})
    agent.start()
    agent.wait_for_change(emulator.add_event(eventType="Freeze"), "scheduled")
    receiver.wait_for(lambda reqs: len(reqs) >= 3, 30, what="a few failing attempts")
    assert {r.target for r in receiver.requests()} == {f"{LOGIC_APPS_PATH}?{query}"}
    metrics = agent.get("/metrics").text
    info = [line for line in metrics.splitlines() if line.startswith("se_bridge_sink_info{")]
    shown = display_name(spec)  # scheme, host and a fingerprint: the path and query never appear
    assert any(f'name="{shown}"' in line for line in info) and shown.endswith(">"), info
    assert agent.terminate() == 0
    log = agent.log_path.read_text()
    assert "answered 500" in log and shown in log  # the failure was logged, naming the sink safely
    for secret in (sig, HMAC_KEY, "/workflows/"):
        assert secret not in log and secret not in metrics


def test_a_webhook_on_a_host_the_shape_table_does_not_know_never_shows_its_token(
    emulator: Emulator, make_agent, receiver: HttpReceiver, tmp_path: Path
) -> None:
    """Issue 19: a Slack-compatible endpoint on another host (its token in the path) was written in
    full to the logs, /metrics and dead letters. The URL is a secret as a whole (Alertmanager's
    rule): wherever it is shown, scheme + host + fingerprint; the server's error echoing the URL, and
    requests' own error text naming it, are scrubbed too."""
    token = secrets.token_hex(12)
    path = f"/services/T000/B000/{token}"
    receiver.default = Answer(400, f'{{"error": "no such hook {path}"}}'.encode())
    spec = f"{receiver.url}{path}"
    agent = make_agent(emulator.url, *file_sink(tmp_path), sink=spec).start()
    agent.wait_for_change(emulator.add_event(eventType="Freeze"), "scheduled")
    sink_id = create_sink(spec).id
    dead = agent.state_dir / "dead-letter" / f"{sink_id}.jsonl"
    wait_until(lambda: dead.exists() and dead.read_bytes().strip(), what="a dead letter")
    metrics = agent.get("/metrics").text
    agent.kill()
    receiver.default = Answer(drop=True)  # and a connection error, whose text names the URL
    unreachable = create_sink(f"http://127.0.0.1:9{path}")
    with pytest.raises(SinkError) as failed:
        unreachable.open()
        unreachable.deliver(Entry(1, RecordMeta("r", "scheduledEvents", "vm"), 0.0, b"{}"))
    texts = {"log": agent.log_path.read_text(), "metrics": metrics, "dead letter": dead.read_text(),
             "error": str(failed.value), "name": unreachable.name}  # fmt: skip
    for where, text in texts.items():
        assert token not in text and "/services/" not in text, (where, text)
    assert display_name(spec) in texts["metrics"] and "<hidden:" in texts["error"]


def test_agent_json_and_eventgrid_formats_with_custom_headers(
    emulator: Emulator, make_agent, receiver: HttpReceiver, tmp_path: Path
) -> None:
    token, grid_key = secrets.token_urlsafe(24), secrets.token_urlsafe(32)
    json_spec = f"{receiver.url}/json#header.X-Tenant=contoso%20west&header_env.Authorization=HOOK_TOKEN"
    grid_spec = f"{receiver.url}/grid#format=eventgrid&aeg_key_env=EG_KEY"
    env = {"HOOK_TOKEN": f"Bearer {token}", "EG_KEY": grid_key}
    agent = make_agent(
        emulator.url, "--sink", grid_spec, *file_sink(tmp_path), sink=json_spec, env=env
    ).start()
    agent.wait_for_change(emulator.add_event(eventType="Redeploy"), "scheduled")
    receiver.wait_for(lambda reqs: len(reqs) == 4, what="two records at each path")
    lines = (tmp_path / "records.jsonl").read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]

    as_json = receiver.requests("/json")
    assert [r.body for r in as_json] == lines  # the record's bytes, exactly as the file sink has them
    for req in as_json:
        assert req.headers["content-type"] == "application/json"
        assert req.headers["x-tenant"] == "contoso west"
        assert req.headers["authorization"] == f"Bearer {token}"
        assert "x-se-bridge-signature" not in req.headers  # no key, no signature

    grid = receiver.requests("/grid")
    assert len(grid) == 2
    for req, rec in zip(grid, records, strict=True):
        assert req.headers["content-type"] == "application/json"
        assert req.headers["aeg-sas-key"] == grid_key
        (event,) = orjson.loads(req.body)
        assert event == {
            "id": rec["recordId"],
            "eventType": EVENT_TYPE,
            "subject": rec["vm"]["resourceId"],
            "eventTime": rec["observedAt"],
            "data": rec,
            "dataVersion": "1",
        }
    assert agent.terminate() == 0
    log = agent.log_path.read_text()
    assert token not in log and grid_key not in log


@pytest.mark.parametrize(
    ("spec", "env", "message"),
    [
        ("http://192.0.2.10/hook", {}, "refusing plain http:// to 192.0.2.10"),
        ("https://hooks.example.invalid/x#hmac_key_env=SE_TEST_NOT_SET", {}, "SE_TEST_NOT_SET is not set"),
    ],
)
def test_agent_refuses_to_start_with_a_webhook_that_can_never_work(
    spec: str, env: dict[str, str], message: str, tmp_path: Path
) -> None:
    """Exit 2 with one clear line; the address is only configuration, nothing connects to it."""
    proc = subprocess.run(
        [sys.executable, "-m", "bridge", "agent", "--imds-url", "http://127.0.0.1:9", "--sink", spec,
         "--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("SE_")} | env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "configuration refused" in proc.stderr and message in proc.stderr


def test_file_sink_keeps_going_while_the_webhook_is_down_then_it_catches_up(
    emulator: Emulator, make_agent, receiver: HttpReceiver, tmp_path: Path
) -> None:
    spec = f"{receiver.url}/hook#format=cloudevents"
    agent = make_agent(emulator.url, *file_sink(tmp_path), sink=spec).start()
    receiver.wait_for(lambda reqs: len(reqs) == 1, what="the first record")
    receiver.stop()  # also closes the kept-alive connection: the port is closed
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", receiver.port), timeout=2).close()
    sink_id = create_sink(spec).id
    for _ in range(3):
        agent.wait_for_change(emulator.add_event(eventType="Freeze"), "scheduled")  # the file sink goes on
    wait_until(
        lambda: agent.metric("se_bridge_sink_failures_total", sink=sink_id) >= 1, what="webhook failing"
    )
    wait_until(lambda: agent.metric("se_bridge_sink_queue_depth", sink=sink_id) == 3, what="3 queued")
    receiver.start()  # the same port
    ids = [r["recordId"] for r in agent.records()]
    receiver.wait_for(lambda reqs: len(reqs) == 4, 60, what="the backlog at the webhook")
    assert [orjson.loads(r.body)["id"] for r in receiver.requests()] == ids
    wait_until(lambda: agent.metric("se_bridge_sink_queue_depth", sink=sink_id) == 0, what="caught up")


# --------------------------------------------------------------------------------------------------
# The verification snippets of docs/sink-webhook.md, run against a request the sink really sent
# --------------------------------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "sink-webhook.md"


def doc_snippet(language: str, marker: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if marker in b]
    return block


@pytest.fixture
def signed_request(receiver: HttpReceiver, monkeypatch) -> Received:
    monkeypatch.setenv("SE_TEST_HMAC_KEY", HMAC_KEY)
    sink(f"{receiver.url}/hook#format=cloudevents&hmac_key_env=SE_TEST_HMAC_KEY").deliver(entry(7))
    (req,) = receiver.requests()
    return req


def test_documented_python_verifier(signed_request: Received) -> None:
    namespace: dict[str, Any] = {}
    exec(doc_snippet("python", "def verify("), namespace)
    verify = namespace["verify"]
    req = signed_request
    verify(HMAC_KEY.encode(), req.headers, req.body)
    tampered = req.body.replace(b'"vm-bridge-0"', b'"vm-bridge-9"', 1)
    assert tampered != req.body
    with pytest.raises(ValueError, match="bad signature"):
        verify(HMAC_KEY.encode(), req.headers, tampered)
    old = int(req.headers["x-se-bridge-timestamp"]) - 301
    with pytest.raises(ValueError, match="stale"):
        verify(HMAC_KEY.encode(), {**req.headers, "x-se-bridge-timestamp": str(old)}, req.body)


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_documented_node_verifier(signed_request: Received, tmp_path: Path) -> None:
    (tmp_path / "verify.js").write_text(doc_snippet("js", "function verify("))
    (tmp_path / "body.bin").write_bytes(signed_request.body)
    runner = (
        "const {verify} = require('./verify.js');"
        "const body = require('fs').readFileSync('body.bin');"
        "const headers = JSON.parse(process.env.HEADERS);"
        "try { verify(process.env.KEY, headers, body); console.log('ok'); }"
        "catch (e) { console.log(e.message); }"
    )

    def node(headers: dict[str, str], key: str = HMAC_KEY) -> str:
        env = {**os.environ, "HEADERS": orjson.dumps(headers).decode(), "KEY": key}
        out = subprocess.run(["node", "-e", runner], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    headers = signed_request.headers
    assert node(headers) == "ok"
    assert node(headers, key="k" * 64) == "bad signature"
    assert node({**headers, "x-se-bridge-signature": "sha256=00"}) == "bad signature"
    old = str(int(headers["x-se-bridge-timestamp"]) - 301)
    assert node({**headers, "x-se-bridge-timestamp": old}) == "stale timestamp"
