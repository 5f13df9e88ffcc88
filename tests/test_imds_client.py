"""The IMDS client over real sockets: headers, one connection, no proxy, request budget, errors."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bridge.imds.client import ImdsClient, ImdsError
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
    assert info.value.retry_after == 3.0 and info.value.transient


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
