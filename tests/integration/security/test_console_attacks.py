"""Issue 31, finding 2: the console believed identity headers from any client, and any Host.

The attacker is a plain HTTP client that reached the console's port without going through the
front door (another pod of the environment, a host of the VNet). It holds no token Entra ID issued
for this console, or one for another application, or an expired one, or one it signed itself. The
console is the real process (``se-bridge console``), the identity provider a stand-in serving its
key set over TLS (tests/peers/identity_provider.py); the console's verification code is its own.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from peers.identity_provider import IdentityProvider
from procs import DECISION_KEY, pem_files, wait_until

pytestmark = pytest.mark.slow

GROUP = "maintenance-approvers"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Console:
    def __init__(self, workdir: Path, idp: IdentityProvider, auth: str) -> None:
        key_file, _ = pem_files(workdir, "console", DECISION_KEY)
        (workdir / "events.jsonl").touch()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.decisions = workdir / "decisions.jsonl"
        self.log = open(workdir / "console.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridge", "console", "--auth", auth, "--approver-group", GROUP,
             "--events-source", f"file://{workdir / 'events.jsonl'}", "--sink", f"file://{self.decisions}",
             "--key", f"console={key_file}", "--state-dir", str(workdir / "state"),
             "--listen", f"127.0.0.1:{self.port}", "--public-host", "console.contoso.example",
             *idp.console_args()],
            stdout=self.log, stderr=self.log,
        )  # fmt: skip
        wait_until(self._ready, 30, what="the console")

    def _ready(self) -> bool:
        try:
            return requests.get(self.url + "/readyz", timeout=2, proxies={"http": ""}).status_code == 200
        except requests.ConnectionError:
            assert self.proc.poll() is None, (Path(self.log.name)).read_text()[-2000:]
            return False

    def get(
        self, path: str, headers: dict[str, str], host: str = "console.contoso.example"
    ) -> requests.Response:
        return requests.get(
            self.url + path, headers={"Host": host, **headers}, timeout=10, proxies={"http": ""}
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self.log.close()


@pytest.fixture
def idp(tmp_path: Path) -> Iterator[IdentityProvider]:
    provider = IdentityProvider(tmp_path)
    yield provider
    provider.stop()


@pytest.fixture(params=["oauth2-proxy", "entra"])
def console(request: Any, tmp_path: Path, idp: IdentityProvider) -> Iterator[tuple[Console, str]]:
    running = Console(tmp_path, idp, request.param)
    yield running, request.param
    running.stop()


def _bearer(token: str, mode: str) -> dict[str, str]:
    return {"X-MS-TOKEN-AAD-ID-TOKEN": token} if mode == "entra" else {"Authorization": f"Bearer {token}"}


def test_identity_headers_without_a_proven_token_are_nobody(console, idp: IdentityProvider) -> None:
    """Each forgery a client can send is a 401 on /api/me; the real token of an approver works."""
    running, mode = console
    principal = {"claims": [{"typ": "preferred_username", "val": "mallory@evil"},
                            {"typ": "groups", "val": GROUP}]}  # fmt: skip
    from cryptography.hazmat.primitives.asymmetric import rsa

    own_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forgeries = {
        "oauth2-proxy's headers": {"X-Forwarded-Email": "mallory@evil", "X-Forwarded-Groups": GROUP},
        "Easy Auth's principal": {
            "X-MS-CLIENT-PRINCIPAL": base64.b64encode(json.dumps(principal).encode()).decode()
        },
        "a token it signed itself": _bearer(idp.token("mallory@evil", groups=(GROUP,), key=own_key), mode),
        "a token for another application": _bearer(
            idp.token("mallory@evil", groups=(GROUP,), audience="other"), mode
        ),
        "an expired token": _bearer(idp.token("mallory@evil", groups=(GROUP,), lifetime=-600), mode),
        "another issuer": _bearer(
            idp.token("mallory@evil", groups=(GROUP,), issuer="https://evil.example/v2.0"), mode
        ),
        "an unsigned token": _bearer(_unsigned(idp), mode),
    }
    for what, headers in forgeries.items():
        assert running.get("/api/me", headers).status_code == 401, what
    me = running.get("/api/me", _bearer(idp.token("alice@contoso.example", groups=(GROUP,)), mode))
    assert me.status_code == 200 and me.json()["name"] == "alice@contoso.example" and me.json()["canApprove"]
    looker = running.get("/api/me", _bearer(idp.token("bob@contoso.example", groups=("ops",)), mode))
    assert looker.json()["canApprove"] is False


def _unsigned(idp: IdentityProvider) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    claims = {"iss": idp.issuer, "aud": "11111111-2222-3333-4444-555555555555", "exp": 2**31,
              "iat": 0, "preferred_username": "mallory@evil", "groups": [GROUP]}  # fmt: skip
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


def test_a_host_other_than_the_public_name_is_refused(console, idp: IdentityProvider) -> None:
    """What a DNS-rebinding page sends: its own name in Host. The probes answer any Host."""
    running, mode = console
    approver = _bearer(idp.token("alice@contoso.example", groups=(GROUP,)), mode)
    for host in ("evil.example", f"evil.example:{running.port}", "127.0.0.1", ""):
        assert running.get("/api/me", approver, host=host).status_code in (400, 421), host
    assert running.get("/api/me", approver, host=f"console.contoso.example:{running.port}").status_code == 200
    assert running.get("/healthz", {}, host="10.0.0.7").status_code == 200


def test_a_console_without_a_token_issuer_or_public_name_refuses_to_start(tmp_path: Path) -> None:
    key_file, _ = pem_files(tmp_path, "console", DECISION_KEY)
    base = [sys.executable, "-m", "bridge", "console", "--auth", "oauth2-proxy", "--approver-group", GROUP,
            "--events-source", f"file://{tmp_path / 'e.jsonl'}", "--sink", f"file://{tmp_path / 'd.jsonl'}",
            "--key", f"console={key_file}", "--state-dir", str(tmp_path / "state")]  # fmt: skip
    for extra, says in (
        (["--public-host", "c.example"], "oidc_issuer and oidc_audience are required"),
        (["--oidc-issuer", "https://login.example/t/v2.0", "--oidc-audience", "x"], "public_host is"),
        (["--public-host", "c", "--oidc-issuer", "http://login.example/t/v2.0", "--oidc-audience", "x"],
         "https://"),
    ):  # fmt: skip
        proc = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr


def test_idle_and_slow_connections_are_cut_and_the_probes_still_answer(
    console, idp: IdentityProvider
) -> None:
    """Finding 9: 1 200 slowloris or idle connections were never closed; /healthz failed. Now each
    has 10 s for a whole request (1 s beyond 256 open), and the probe answers during the flood."""
    import socket
    import time

    running, _mode = console
    held: list[socket.socket] = []
    try:
        for n in range(600):
            s = socket.create_connection(("127.0.0.1", running.port), timeout=5)
            if n % 2:  # half of them trickle a request that never ends
                s.sendall(b"GET /api/me HTTP/1.1\r\nHost: console.contoso.example\r\nX-Slow: ")
            held.append(s)
        during = running.get("/healthz", {}, host="10.0.0.7")
        assert during.status_code == 200  # answered while 600 sockets sit there
        started, still_open = time.monotonic(), 0
        for s in held:
            s.settimeout(max(0.1, 15 - (time.monotonic() - started)))
            try:
                while s.recv(4096):  # the server closes it (an error answer may come first)
                    pass
            except TimeoutError:
                still_open += 1
            except OSError:
                pass  # reset by the server: cut too
        assert still_open == 0, f"{still_open} idle or slow connections were never cut"
    finally:
        for s in held:
            s.close()


def test_a_large_body_is_refused_before_it_is_read_and_metrics_need_a_reader(
    console, idp: IdentityProvider
) -> None:
    """Finding 9: a signed-in person's 300 MB body was read before any size check; /metrics needed
    no sign-in."""
    import socket

    running, mode = console
    token = _bearer(idp.token("alice@contoso.example", groups=(GROUP,)), mode)
    csrf = running.get("/api/me", token).json()["csrf"]
    head = "".join(f"{k}: {v}\r\n" for k, v in token.items())
    with socket.create_connection(("127.0.0.1", running.port), timeout=10) as s:
        s.sendall(  # everything a signed-in approver's request has, and a 300 MB body announced
            f"POST /api/decisions HTTP/1.1\r\nHost: console.contoso.example\r\n{head}"
            f"Content-Type: application/json\r\nOrigin: http://console.contoso.example\r\n"
            f"X-CSRF-Token: {csrf}\r\nContent-Length: {300 * 1024 * 1024}\r\n\r\n{{".encode()
        )
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]  # refused before the body is read
    assert running.get("/metrics", {}).status_code == 401
    assert running.get("/metrics", token).status_code == 200


def test_the_lab_token_signs_in_one_browser_once_with_a_session_of_its_own(tmp_path: Path) -> None:
    """Issue 33: the printed /?token= address signed in 6 browsers and curl, all with one cookie."""
    key_file, _ = pem_files(tmp_path, "console", DECISION_KEY)
    (tmp_path / "events.jsonl").touch()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "console", "--auth", "lab",
         "--events-source", f"file://{tmp_path / 'events.jsonl'}", "--sink", f"file://{tmp_path / 'd.jsonl'}",
         "--key", f"console={key_file}", "--state-dir", str(tmp_path / "state"),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip().split("open ", 1)[1]

        def listening() -> bool:
            try:
                return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2, proxies={"http": ""}).ok
            except requests.ConnectionError:
                return False

        wait_until(listening, 30, what="the console's listener")
        first = requests.get(url, allow_redirects=False, timeout=10, proxies={"http": ""})
        assert first.status_code == 303
        cookie = first.cookies.get("se_console_session")
        assert cookie and len(cookie) >= 32
        again = requests.get(url, allow_redirects=False, timeout=10, proxies={"http": ""})
        assert again.status_code == 401 and "se_console_session" not in again.cookies  # spent
        me = f"http://127.0.0.1:{port}/api/me"
        assert requests.get(me, cookies={"se_console_session": cookie}, timeout=10, proxies={"http": ""}).ok
        assert (
            requests.get(
                me, cookies={"se_console_session": "x" * 43}, timeout=10, proxies={"http": ""}
            ).status_code
            == 401
        )
    finally:
        proc.terminate()
        proc.wait(20)
