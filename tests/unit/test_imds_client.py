"""The IMDS client over real sockets: headers, one connection, no proxy, request budget, errors."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bridge.imds.client import MAX_ANSWER_BYTES, ImdsClient, ImdsError, RateLimiter
from bridge.imds.emulator import EmulatorServer


class Recorder(BaseHTTPRequestHandler):
    """A plain HTTP/1.1 server that records each request's headers and the client's port."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[int, dict[str, str], str]] = []
    status = 200
    body = b'{"DocumentIncarnation": 1, "Events": []}'

    def do_GET(self) -> None:
        self.seen.append((self.client_address[1], dict(self.headers), self.path))
        self.send_response(self.status)
        if self.status == 429:
            self.send_header("Retry-After", "3")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    Recorder.seen = []
    Recorder.status = 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_headers_path_and_one_persistent_connection(recorder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # must be ignored
    client = ImdsClient(recorder, "2019-08-01", max_rps=0)
    for _ in range(5):
        assert client.get_scheduled_events().status == 200
    ports = {port for port, _, _ in Recorder.seen}
    assert len(ports) == 1  # one kept-alive connection for every poll
    _, headers, path = Recorder.seen[0]
    assert path == "/metadata/scheduledevents?api-version=2019-08-01"
    assert headers["Metadata"] == "true"
    assert not any(h.lower() == "x-forwarded-for" for h in headers)


def test_http_errors_are_typed(recorder: str) -> None:
    client = ImdsClient(recorder, max_rps=0)
    for status, kind in [
        (410, "http_410"),
        (500, "http_5xx"),
        (503, "http_5xx"),
        (400, "http_400"),
        (418, "http_other"),
    ]:
        Recorder.status = status
        with pytest.raises(ImdsError) as info:
            client.get_scheduled_events()
        assert info.value.kind == kind and info.value.status == status
    Recorder.status = 429
    with pytest.raises(ImdsError) as info:
        client.get_scheduled_events()
    assert info.value.retry_after == 3.0 and info.value.retryable


def test_refused_connection_and_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ImdsClient(f"http://127.0.0.1:{port}", max_rps=0, first_timeout=1)
    with pytest.raises(ImdsError) as info:
        client.get_scheduled_events()
    assert info.value.kind == "connection"
    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        client = ImdsClient(
            f"http://127.0.0.1:{silent.getsockname()[1]}", max_rps=0, first_timeout=0.3, timeout=0.3
        )
        with pytest.raises(ImdsError) as info:
            client.get_scheduled_events()
        assert info.value.kind == "timeout"


def test_post_start_requests_against_the_emulator() -> None:
    with EmulatorServer(port=0, rate_limit=0, approval_delay=0.0) as emu:
        event_id = emu.state.add_event(event_type="Freeze")
        client = ImdsClient(emu.url, max_rps=0)
        assert client.post_start_requests([event_id]).status == 200
        assert emu.state.snapshot()["startRequests"][event_id] == 1
        identity = client.get_instance()
        assert identity["compute"]["name"] == "vm-bridge-0"


def test_the_emulator_429s_a_client_without_a_budget_but_not_ours() -> None:
    with EmulatorServer(port=0, rate_limit=5.0) as emu:
        greedy = ImdsClient(emu.url, max_rps=0)
        kinds = []
        for _ in range(10):
            try:
                greedy.get_scheduled_events()
                kinds.append("ok")
            except ImdsError as err:
                kinds.append(err.kind)
        assert "http_429" in kinds
        time.sleep(1.1)
        polite = ImdsClient(emu.url, max_rps=4.0)
        for _ in range(8):
            polite.get_scheduled_events()  # never 429


def test_start_requests_take_the_next_slot_before_waiting_polls() -> None:
    """Issue 11: StartRequests shared the poll's budget first come, first served. With polls queued
    on the limiter (its window full), a StartRequest still gets the very next slot; under a burst of
    both at the default rate the emulator's 5/s limit never answers 429."""
    with EmulatorServer(port=0, rate_limit=5.0) as emu:
        event_id = emu.state.add_event(event_type="Freeze")
        client = ImdsClient(emu.url)  # the default budget: 4/s
        order: list[str] = []
        errors: list[Exception] = []

        def run(name: str, call: Any) -> None:
            try:
                call()
                order.append(name)
            except Exception as exc:
                errors.append(exc)

        for _ in range(4):
            client.get_scheduled_events()  # the window is full: everything below waits
        polls = [
            threading.Thread(target=run, args=(f"poll{i}", client.get_scheduled_events)) for i in range(4)
        ]
        for t in polls:
            t.start()
        time.sleep(0.05)  # the polls are waiting on the limiter
        post = threading.Thread(target=run, args=("post", lambda: client.post_start_requests([event_id])))
        post.start()
        for t in [*polls, post]:
            t.join(10)
        assert errors == [] and order[0] == "post", order
        assert emu.state.snapshot()["requests"]["rejected"].get("429", 0) == 0


def test_a_stream_of_start_requests_never_stops_the_polls() -> None:
    """Priority requests go first, but a poll that has waited a whole window goes next: approvals
    arriving without pause (a slot's worth each) used to keep the agent from polling until they
    stopped. The limiter alone, no server: the question is only who gets a slot."""
    limiter = RateLimiter(4.0)
    stop = threading.Event()
    granted: list[str] = []

    def approvals() -> None:
        while not stop.is_set():
            limiter.acquire(priority=True)
            granted.append("post")

    def poll() -> None:
        limiter.acquire()
        granted.append("poll")

    posting = [threading.Thread(target=approvals) for _ in range(2)]
    for t in posting:
        t.start()
    time.sleep(0.3)  # the window is full of StartRequests and more are always waiting
    poller = threading.Thread(target=poll)
    poller.start()
    poller.join(6.0)  # the approvals keep going for this long: starved, the poll would never return
    stop.set()
    for t in posting:
        t.join(5.0)
    assert "poll" in granted, "a poll starved behind a stream of StartRequests"
    assert granted.index("poll") < len(granted) - 1, "the poll went only once the approvals stopped"


def test_a_start_request_right_after_a_poll_is_not_held_for_the_pacing() -> None:
    """Pacing keeps StartRequests apart from each other, not from the poll that just went: the
    first approval after a poll used to wait up to 262 ms for nothing."""
    limiter = RateLimiter(4.0)
    limiter.acquire()  # a poll
    assert limiter._wait(time.monotonic(), priority=True) == 0.0
    assert limiter._wait(time.monotonic(), priority=False) > 0.0  # the next poll is still paced
    limiter.acquire(priority=True)
    assert limiter._wait(time.monotonic(), priority=True) > 0.0  # and so is the next StartRequest


def _stream_of_posts(limiter: RateLimiter, now: float) -> None:
    """The budget full of StartRequests, paced as a stream sends them, the last one at ``now``."""
    for k in range(3, -1, -1):
        limiter._record(now - k * limiter._spacing, True)
    limiter._expire(now)
    assert len(limiter._sent) == 4


def test_a_starved_poll_goes_beside_the_start_requests_not_in_their_slot() -> None:
    """Issue 19 item 4: a poll that had waited ``STARVED`` behind a stream of StartRequests took one
    of their slots, and the decisions behind it waited two slots (p99 530 ms for decisions 100 ms
    apart). Now it goes beside them, the one request over the agent's budget that IMDS's own limit
    (5 a second) allows, and the StartRequests' next slot is where it was. The admission rule alone,
    at given instants: the question is only who may go when."""
    limiter, now = RateLimiter(4.0), 1000.0
    _stream_of_posts(limiter, now)
    next_post = limiter._wait(now, priority=True)
    assert next_post > 0.2  # paced: the budget is the StartRequests'
    assert limiter._wait(now, priority=False) > 0  # a poll that has not starved waits
    assert limiter._wait(now, priority=False, starved=True) == 0.0  # a starved one goes now...
    limiter._record(now, False)
    assert limiter._wait(now, priority=True) == next_post  # ...and the next StartRequest is unmoved
    assert limiter._wait(now, priority=False, starved=True) > 0  # one over, never two: IMDS's limit
    assert len(limiter._sent) == 5


def test_at_imds_own_limit_a_starved_poll_takes_a_slot_instead() -> None:
    """With ``--imds-max-rps 5`` there is no room beside the budget: a starved poll waits for a slot
    like any request, and the window never holds more than 5."""
    limiter, now = RateLimiter(5.0), 1000.0
    for k in range(5, 0, -1):
        limiter._record(now - k * 0.2, True)
    limiter._expire(now)
    assert len(limiter._sent) == 5
    assert limiter._wait(now, priority=False, starved=True) > 0


def test_start_requests_and_starved_polls_never_draw_a_429_from_imds() -> None:
    """The reserve against the emulator's 5-per-second limit (IMDS's): StartRequests streaming
    without pause from two threads, the poller polling once a second as the agent does, for 5 s.
    Every request answered, polls kept going, and the emulator never answered 429."""
    with EmulatorServer(port=0, rate_limit=5.0) as emu:
        event_id = emu.state.add_event(event_type="Freeze")
        client = ImdsClient(emu.url)  # the default budget: 4 per 1.05 s
        stop = threading.Event()
        polls: list[float] = []
        errors: list[Exception] = []

        def approvals() -> None:
            while not stop.is_set():
                try:
                    client.post_start_requests([event_id], deadline=0.0)
                except ImdsError as exc:
                    errors.append(exc)

        def poller() -> None:
            while not stop.is_set():
                try:
                    client.get_scheduled_events()
                except ImdsError as exc:
                    errors.append(exc)
                polls.append(time.monotonic())
                stop.wait(1.0)

        threads = [threading.Thread(target=approvals) for _ in range(2)] + [threading.Thread(target=poller)]
        for t in threads:
            t.start()
        time.sleep(5.0)
        stop.set()
        for t in threads:
            t.join(10)
        counts = emu.state.snapshot()["requests"]
        assert errors == []
        assert counts["rejected"].get("429", 0) == 0
        assert len(polls) >= 2 and counts["post"] > 0  # both went on (their share: the rule's test above)


# ---------------------------------------------------------------------- whole-answer deadline, size cap
# Issue 9, item 7: a socket timeout applies per recv, so an answer that trickles in one byte at a time
# held the poll forever. The timeout is now a deadline for the whole exchange.


def test_a_trickling_answer_times_out_within_the_timeout_and_the_next_request_succeeds() -> None:
    with EmulatorServer(port=0, rate_limit=0) as emu:
        client = ImdsClient(emu.url, max_rps=0, timeout=1.0, first_timeout=1.0)
        assert client.get_scheduled_events().status == 200  # awake: the short timeout applies
        emu.state.add_fault("trickle", count=1, delay_seconds=0.3)
        started = time.monotonic()
        with pytest.raises(ImdsError) as info:
            client.get_scheduled_events()
        took = time.monotonic() - started
        assert info.value.kind == "timeout" and info.value.retryable
        # The whole answer (~150 bytes at 0.3 s each) would take ~45 s; each byte alone is well inside
        # the 1 s timeout, so only a deadline over the whole exchange ends it this soon.
        assert 0.5 < took < 5.0, took
        assert emu.state.snapshot()["requests"]["faults"] == {"trickle": 1}
        resp = client.get_scheduled_events()  # a new connection; the trickling one was dropped
        assert resp.status == 200 and resp.body.startswith(b'{"DocumentIncarnation"')


def test_the_first_call_deadline_is_first_timeout() -> None:
    """The long first-call allowance is a deadline too: a trickle cannot stretch it."""
    with EmulatorServer(port=0, rate_limit=0) as emu:
        emu.state.add_fault("trickle", count=1, delay_seconds=0.3)
        client = ImdsClient(emu.url, max_rps=0, timeout=0.5, first_timeout=1.5)
        started = time.monotonic()
        with pytest.raises(ImdsError) as info:
            client.get_scheduled_events()
        assert info.value.kind == "timeout"
        assert 1.2 < time.monotonic() - started < 6.0  # first_timeout (1.5 s), not timeout (0.5 s)
        assert client.get_scheduled_events().status == 200


def _hostile_server(answer: Callable[[socket.socket], None]) -> tuple[str, threading.Thread]:
    """A one-connection server on loopback: reads the request head, then lets ``answer`` write."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                with contextlib.suppress(OSError):  # the client hangs up on purpose
                    answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", thread


def test_a_body_that_trickles_after_prompt_headers_times_out() -> None:
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        for _ in range(100):
            conn.sendall(b" ")
            time.sleep(0.2)

    url, server = _hostile_server(answer)
    client = ImdsClient(url, max_rps=0, timeout=1.0, first_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(ImdsError) as info:
        client.get_scheduled_events()
    assert info.value.kind == "timeout"
    assert time.monotonic() - started < 5.0  # the body alone would take 20 s
    client.close()
    server.join(30)


def test_an_answer_announcing_too_large_a_body_is_refused_unread() -> None:
    with EmulatorServer(port=0, rate_limit=0) as emu:
        client = ImdsClient(emu.url, max_rps=0)
        assert client.get_scheduled_events().status == 200
        huge = b'{"DocumentIncarnation": 1, "Events": [], "x": "' + b"x" * MAX_ANSWER_BYTES + b'"}'
        emu.state.set_raw(huge)
        with pytest.raises(ImdsError) as info:
            client.get_scheduled_events()
        assert info.value.kind == "http_other" and "larger than" in str(info.value)
        emu.state.clear_raw()
        assert client.get_scheduled_events().status == 200  # on a new connection
        # Exactly at the cap is still accepted: the bound is on size, not on what the bytes say.
        emu.state.set_raw(b" " * MAX_ANSWER_BYTES)
        assert len(client.get_scheduled_events().body) == MAX_ANSWER_BYTES


@pytest.mark.parametrize("framing", ["close-delimited", "chunked"])
def test_an_endless_answer_without_a_length_is_cut_at_the_cap(framing: str) -> None:
    """No Content-Length to refuse up front: the client stops reading one byte past the cap."""
    sent = [0]

    def answer(conn: socket.socket) -> None:
        chunked = framing == "chunked"
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + (b"Transfer-Encoding: chunked\r\n" if chunked else b"Connection: close\r\n")
            + b"\r\n"
        )
        block = b"x" * 65536
        while sent[0] < 64 * MAX_ANSWER_BYTES:  # far more than the cap, but finite
            conn.sendall(b"10000\r\n" + block + b"\r\n" if chunked else block)
            sent[0] += len(block)

    url, server = _hostile_server(answer)
    client = ImdsClient(url, max_rps=0, timeout=10.0, first_timeout=10.0)
    with pytest.raises(ImdsError) as info:
        client.get_scheduled_events()
    assert info.value.kind == "http_other" and "larger than" in str(info.value)
    server.join(30)
    assert not server.is_alive()
    assert sent[0] < 64 * MAX_ANSWER_BYTES  # the client hung up instead of reading on
