"""The agent's API under attack: every attack of issue 9 against the real agent process and emulator.

Each test plays the attacker with raw sockets, curl or another Unix user (the tests run as root, so
``runuser -u nobody`` is a real unprivileged local user), then asserts what IMDS (the emulator) saw:
no StartRequest, or exactly one where the request was legitimate, and that the agent still serves.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from procs import RELAY_KEY, Agent, Emulator, proven_body, wait_until

from bridge.signing import sign_request

pytestmark = pytest.mark.slow

RELAY_PATH = "/v1/start-requests"


def relay_body(event_id: str, decision_id: str | None = None, **extra: Any) -> bytes:
    """A request as an approver sends it: the signed decision inside (the agent proves it)."""
    if decision_id is not None and len(decision_id) > 128:  # malformed on purpose: nothing to sign
        return orjson.dumps({"decisionId": decision_id, "eventIds": [event_id]})
    return orjson.dumps(proven_body(event_id, decision_id, **extra))


def raw_request(address: tuple[str, int], method: str, path: str, headers: dict[str, str], body: bytes = b""):
    """One request over a fresh connection, exactly as given (no client library adds anything)."""
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def signed_post(address: tuple[str, int], body: bytes, key: bytes = RELAY_KEY, **extra: str):
    host = f"{address[0]}:{address[1]}"
    headers = {"Host": host, "Content-Type": "application/json", "Content-Length": str(len(body))}
    headers.update(sign_request("relay", key, "POST", RELAY_PATH, body))
    headers.update(extra)
    return raw_request(address, "POST", RELAY_PATH, headers, body)


@pytest.fixture
def scheduled(emulator: Emulator, make_agent) -> tuple[Emulator, Agent, str, tuple[str, int]]:
    agent = make_agent(emulator.url).start()
    event_id = emulator.add_event(eventType="Reboot")
    agent.wait_for_change(event_id, "scheduled")
    assert agent.api is not None
    host, port = agent.api.removeprefix("http://").rsplit(":", 1)
    return emulator, agent, event_id, (host, int(port))


def test_a_browser_cannot_approve_cross_site(scheduled) -> None:
    """Issue 9: a page's cross-site POST (foreign Host and Origin, text/plain) reached IMDS."""
    emulator, agent, event_id, address = scheduled
    body = relay_body(event_id)
    csrf = {
        "Host": f"attacker.example:{address[1]}",
        "Origin": "http://attacker.example",
        "Content-Type": "text/plain",
        "Content-Length": str(len(body)),
    }
    assert raw_request(address, "POST", RELAY_PATH, csrf, body)[0] == 403
    # Each defence on its own: an Origin alone, a foreign Host alone, a form content type alone, no key.
    local = f"127.0.0.1:{address[1]}"
    for changed, status in (
        ({"Host": local}, 403),  # Origin still there
        ({"Host": local, "Origin": None}, 415),  # text/plain
        ({"Host": local, "Origin": None, "Content-Type": "application/json"}, 401),  # unsigned
    ):
        headers = {k: v for k, v in {**csrf, **changed}.items() if v is not None}
        assert raw_request(address, "POST", RELAY_PATH, headers, body)[0] == status, changed
    assert emulator.state()["startRequests"] == {}
    assert agent.metric("se_bridge_http_refused_total", reason="origin") >= 2
    assert agent.records("approval") == []  # refused before the relay: no audit noise
    assert signed_post(address, body)[0] == 200  # the legitimate caller still gets through
    assert emulator.state()["startRequests"] == {event_id: 1}


def test_a_dns_rebinding_page_cannot_read_the_document(scheduled) -> None:
    _, agent, _, address = scheduled
    rebound = {"Host": f"attacker.example:{address[1]}"}
    assert raw_request(address, "GET", "/v1/document", rebound)[0] == 403
    assert raw_request(address, "GET", "/metrics", rebound)[0] == 403
    status, body = raw_request(address, "GET", "/v1/document", {"Host": f"localhost:{address[1]}"})
    assert status == 200 and orjson.loads(body)["vm"]["name"] == "vm-bridge-0"
    assert agent.metric("se_bridge_http_refused_total", reason="host") == 2
    # Issue 31 (low): an empty Host is no Host (the listener's strict parse refuses it).
    assert raw_request(address, "GET", "/v1/document", {"Host": ""})[0] == 400
    assert raw_request(address, "GET", "/v1/document", {"Host": " "})[0] == 400


def test_a_local_unprivileged_user_cannot_approve(scheduled) -> None:
    """Issue 9: any local user (``su nobody``) could approve over loopback."""
    emulator, _, event_id, address = scheduled
    body = relay_body(event_id).decode()
    curl = [
        "runuser", "-u", "nobody", "--", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
        "-X", "POST", "-H", "Content-Type: application/json", "--data", body,
        f"http://127.0.0.1:{address[1]}{RELAY_PATH}",
    ]  # fmt: skip
    proc = subprocess.run(curl, capture_output=True, text=True, timeout=30, check=False)
    assert proc.stdout == "401", (proc.stdout, proc.stderr)
    assert emulator.state()["startRequests"] == {}


def test_the_unix_socket_admits_the_service_group_only_and_audits_the_uid(
    emulator: Emulator, tmp_path: Path
) -> None:
    """``--listen unix:PATH``: the socket is 0660, so a user outside the service's group cannot even
    connect; the audit names the uid of the caller that did."""
    run = Path(tempfile.mkdtemp(prefix="se-bridge-run-", dir="/tmp"))  # traversable by everyone
    run.chmod(0o755)
    sock = run / "agent.sock"
    agent = Agent(emulator.url, tmp_path, "--listen", f"unix:{sock}")
    try:
        agent.start()
        assert agent.api == f"unix:{sock}" and stat.S_IMODE(sock.stat().st_mode) == 0o660
        event_id = emulator.add_event(eventType="Freeze")
        agent.wait_for_change(event_id, "scheduled")
        body = relay_body(event_id)
        curl = [
            "curl",
            "-s",
            "--unix-socket",
            str(sock),
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
        ]
        for name, value in sign_request("relay", RELAY_KEY, "POST", RELAY_PATH, body).items():
            curl += ["-H", f"{name}: {value}"]
        curl += ["--data-binary", body.decode(), f"http://localhost{RELAY_PATH}"]
        as_nobody = subprocess.run(["runuser", "-u", "nobody", "--", *curl], capture_output=True, timeout=30)
        assert as_nobody.returncode == 7, as_nobody  # curl: cannot connect (the socket's mode)
        assert emulator.state()["startRequests"] == {}
        as_owner = subprocess.run(curl, capture_output=True, timeout=30, check=True)
        assert orjson.loads(as_owner.stdout)["outcome"] == "approved"
        audit = wait_until(lambda: agent.records("approval"), what="audit record")
        assert audit[0]["requester"] == f"key:relay@uid:{os.getuid()}"
        assert emulator.state()["startRequests"] == {event_id: 1}
    finally:
        agent.stop()
        shutil.rmtree(run, ignore_errors=True)


def test_slow_and_flooding_clients_cannot_starve_the_listener(emulator: Emulator, make_agent) -> None:
    """Issue 9: a byte every 5 s held a thread for ever; ~1000 such connections exhausted the fds."""
    agent = make_agent(emulator.url, "--listen-max-connections", "8", "--listen-request-timeout", "2").start()
    event_id = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(event_id, "scheduled")
    host, port = agent.api.removeprefix("http://").rsplit(":", 1)
    address = (host, int(port))
    assert agent.proc is not None
    fds_before = len(os.listdir(f"/proc/{agent.proc.pid}/fd"))
    slow = []
    for _ in range(300):  # a flood of slow clients: each sends part of its headers, then trickles
        s = socket.create_connection(address, timeout=5)
        s.sendall(b"POST /v1/start-requests HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow.append(s)
    # served (8) + waiting in triage (64, the default) + its queue (16) + a few closing: bounded, not
    # 300, once the listener has triaged what it accepted (on a loaded machine that takes a moment).
    bound = fds_before + 8 + 64 + 16 + 8
    wait_until(lambda: len(os.listdir(f"/proc/{agent.proc.pid}/fd")) <= bound, 10, what=f"<= {bound} fds")
    assert raw_request(address, "GET", "/healthz", {"Host": "127.0.0.1"})[0] == 200  # probes still answered
    open_ = set(slow)
    give_up = time.monotonic() + 15
    while open_ and time.monotonic() < give_up:  # trickle a byte each half second until each is cut
        for s in list(open_):
            try:
                s.sendall(b"X")
                s.settimeout(0.01)
                if s.recv(65536) == b"":
                    open_.discard(s)
            except TimeoutError:
                pass
            except OSError:
                open_.discard(s)
        time.sleep(0.5)
    assert not open_, f"{len(open_)} slow connections were never cut"
    for s in slow:
        s.close()
    body = relay_body(event_id)
    wait_until(lambda: signed_post(address, body)[0] == 200, 20, what="the relay serves again")
    assert emulator.state()["startRequests"] == {event_id: 1}
    assert agent.metric("se_bridge_http_refused_total", reason="busy") > 0
    assert agent.metric("se_bridge_http_refused_total", reason="timeout") >= 8


def test_a_chunked_body_is_refused_and_never_parsed_as_a_request(scheduled) -> None:
    """Issue 9: the chunk bytes of a chunked body were parsed as a second request."""
    emulator, _, _event_id, address = scheduled
    smuggled = b"GET /v1/document HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(
            b"POST /v1/start-requests HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(smuggled), smuggled)
        )
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 411") and answer.count(b"HTTP/1.1") == 1
    assert emulator.state()["startRequests"] == {}


def test_what_a_strict_server_refuses_is_refused_with_400(scheduled) -> None:
    """Issue 23: the loopback listener accepted ``Host: 127.0.0.1:<port>@evil``, an empty or doubled
    Host, HTTP/1.0 without Host, two Content-Length headers, and a query string no signature
    covers. Each is a 400 now, before any route or signature check, and nothing is posted."""
    emulator, _, event_id, address = scheduled
    body = relay_body(event_id)
    host = f"127.0.0.1:{address[1]}"
    post = "POST /v1/start-requests HTTP/1.1\r\nContent-Type: application/json\r\n"
    length = f"Content-Length: {len(body)}\r\n"
    cases = {
        "userinfo in Host": f"{post}Host: {host}@evil.example\r\nContent-Length: {len(body)}\r\n\r\n",
        "empty Host": f"{post}Host: \r\nContent-Length: {len(body)}\r\n\r\n",
        "two Hosts": f"{post}Host: {host}\r\nHost: evil.example\r\nContent-Length: {len(body)}\r\n\r\n",
        "HTTP/1.0 without Host": f"POST /v1/start-requests HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n",
        "two Content-Length": f"{post}Host: {host}\r\n{length}Content-Length: 0\r\n\r\n",
        "query string": f"POST /v1/start-requests?x=1 HTTP/1.1\r\nHost: {host}\r\n{length}\r\n",
    }  # fmt: skip
    for case, head in cases.items():
        with socket.create_connection(address, timeout=10) as s:
            s.sendall(head.encode() + body)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), (case, answer[:200])
    assert emulator.state()["startRequests"] == {}


@pytest.mark.parametrize(
    "header, value",
    [("X-SE-Bridge-Timestamp", "\u00b2" * 10), ("X-SE-Bridge-Signature", "sha256=" + "\u00e9" * 64)],
)
def test_non_ascii_signature_headers_are_a_401_not_a_500(scheduled, header: str, value: str) -> None:
    emulator, agent, event_id, address = scheduled
    body = relay_body(event_id)
    headers = {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Length": str(len(body))}
    headers.update(sign_request("relay", RELAY_KEY, "POST", RELAY_PATH, body))
    headers[header] = value
    conn = http.client.HTTPConnection(*address, timeout=10)
    conn.putrequest("POST", RELAY_PATH, skip_host=True)
    for name, v in headers.items():
        conn.putheader(name, v.encode("utf-8"))
    conn.endheaders(body)
    assert conn.getresponse().status == 401
    conn.close()
    assert not any("Traceback" in str(e.get("exc", "")) for e in agent.logs())
    assert agent.metric("se_bridge_http_refused_total", reason="auth") == 1
    assert emulator.state()["startRequests"] == {}


def test_a_dual_stack_listener_serves_the_loopback_approver(emulator: Emulator, make_agent) -> None:
    """Issue 9: with ``--listen [::]:P`` a 127.0.0.1 client is ``::ffff:127.0.0.1``, and was refused."""
    agent = make_agent(emulator.url, "--listen", "[::]:0").start()
    event_id = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(event_id, "scheduled")
    port = int(agent.api.rsplit(":", 1)[1])
    status, answer = signed_post(("127.0.0.1", port), relay_body(event_id))
    assert status == 200 and orjson.loads(answer)["outcome"] == "approved"
    assert raw_request(("127.0.0.1", port), "GET", "/metrics", {"Host": "127.0.0.1"})[0] == 200  # local
    assert emulator.state()["startRequests"] == {event_id: 1}


def test_a_captured_request_cannot_be_replayed_after_a_restart(scheduled) -> None:
    """Issue 9: the nonce cache was memory-only."""
    emulator, agent, event_id, address = scheduled
    body = relay_body(event_id)
    headers = {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Length": str(len(body))}
    headers.update(sign_request("relay", RELAY_KEY, "POST", RELAY_PATH, body))
    assert raw_request(address, "POST", RELAY_PATH, headers, body)[0] == 200
    assert agent.terminate() == 0
    agent.start(first_record=False)
    host, port = agent.api.removeprefix("http://").rsplit(":", 1)
    status, answer = raw_request((host, int(port)), "POST", RELAY_PATH, headers, body)
    assert status == 401 and b"replayed nonce" in answer
    assert emulator.state()["startRequests"] == {event_id: 1}
    assert len(agent.records("approval")) == 1


def test_malformed_requests_are_counted_not_audited(scheduled) -> None:
    """Issue 9: 2000 malformed loopback requests made 2000 audit records."""
    emulator, agent, event_id, address = scheduled
    for n in range(200):
        body = b'{"decisionId": 5, "n": %d}' % n
        assert signed_post(address, body)[0] == 400
    huge = relay_body(event_id, decision_id="d" * 60_000)  # under the body cap, over the id bound
    assert signed_post(address, huge)[0] == 400
    assert agent.metric("se_bridge_relay_requests_total", outcome="refused", reason="malformed") == 201
    assert agent.records("approval") == []
    assert emulator.state()["startRequests"] == {}
    assert signed_post(address, b"x" * (64 * 1024 + 1))[0] == 413


def test_a_decision_for_another_vm_is_not_relayed_through_this_one(scheduled) -> None:
    """Issue 9: the decision's target was never checked against this VM."""
    emulator, _agent, event_id, address = scheduled
    status, answer = signed_post(address, relay_body(event_id, target="some-other-vm"))
    assert status == 200
    result = orjson.loads(answer)
    assert result["outcome"] == "refused" and result["results"][0]["result"] == "targetMismatch"
    assert emulator.state()["startRequests"] == {}
    status, answer = signed_post(address, relay_body(event_id, target="vm-bridge-0"))
    assert orjson.loads(answer)["outcome"] == "approved"
    assert emulator.state()["startRequests"] == {event_id: 1}


def test_remote_readers_need_the_read_token_or_a_signature(
    emulator: Emulator, make_agent, tmp_path: Path, public_address: str
) -> None:
    """Issue 9: /metrics and /v1/document were open on a non-loopback listener (VM identity, subscription)."""
    token = tmp_path / "read.token"
    token.write_bytes(b"read-token-" + b"r" * 32)
    agent = make_agent(emulator.url, "--listen", f"{public_address}:0", "--read-token-file", str(token))
    agent.start()
    port = int(agent.api.rsplit(":", 1)[1])
    address = (public_address, port)
    plain = {"Host": f"{public_address}:{port}"}
    assert raw_request(address, "GET", "/healthz", plain)[0] == 200  # probes stay open
    for path in ("/metrics", "/v1/document"):
        assert raw_request(address, "GET", path, plain)[0] == 401
        bearer = {**plain, "Authorization": "Bearer " + token.read_text()}
        assert raw_request(address, "GET", path, bearer)[0] == 200
        assert raw_request(address, "GET", path, {**plain, "Authorization": "Bearer wrong"})[0] == 401
        signed = {**plain, **sign_request("relay", RELAY_KEY, "GET", path)}
        assert raw_request(address, "GET", path, signed)[0] == 200
