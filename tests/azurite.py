"""Azurite (Microsoft's Azure Storage emulator, from npm) as a real Blob service for tests.

Why Azurite: the Event Hubs decision source keeps its checkpoints and partition ownership in Azure Blob
Storage through ``azure-eventhub-checkpointstoreblob``; Azurite speaks the same REST API (shared-key
signatures, ETags, ``If-Match``/``If-None-Match``, metadata), so the real SDK runs against it over
real HTTP on loopback, with no Docker and no cloud.

Where it comes from: ``make test`` installs it with npm into ``.tools/node_modules`` (pinned in the
Makefile) and exports ``SE_BRIDGE_AZURITE`` with that folder; the tests then *fail* when it is missing.
Outside ``make test`` the tests look in ``.tools`` and on ``PATH`` and skip, saying how to get it.

Its quirks, which these helpers handle:

* ``--blobPort 0`` works: Azurite prints ``successfully listens on http://127.0.0.1:PORT`` (``--silent``
  silences only the access log): the port is read from that line, so there is no free-port race.
* ``--skipApiVersionCheck``: the checkpoint store's vendored storage client sends ``x-ms-version``
  2019-07-07, older or newer clients send other versions; Azurite refuses versions it does not know
  without this flag. ``--loose`` ignores headers it does not support.
* Accounts come from ``AZURITE_ACCOUNTS=name:key`` (base64 key): each instance gets a random account
  key, so a test can grep logs for *that* secret and find none (the well-known ``devstoreaccount1`` key
  is public and would prove nothing).
* Azurite may write files into its working directory (``--location`` is refused together with
  ``--inMemoryPersistence``): it runs in a temporary folder per instance.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(rb"successfully listens on http://([0-9.]+):(\d+)")


def azurite_binary() -> Path | None:
    """``azurite-blob`` from ``$SE_BRIDGE_AZURITE`` (set by ``make test``), ``.tools`` or ``PATH``."""
    configured = os.environ.get("SE_BRIDGE_AZURITE")
    folders = [Path(configured)] if configured else [ROOT / ".tools"]
    for folder in folders:
        for candidate in (
            folder / "node_modules" / ".bin" / "azurite-blob",
            folder / ".bin" / "azurite-blob",
        ):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    if configured:
        return None  # make test said where it is: do not fall back to something else
    found = shutil.which("azurite-blob")
    return Path(found) if found else None


def azurite_missing_reason() -> str | None:
    """Why the Azurite tests cannot run here, or None. Under ``make test`` (``SE_BRIDGE_AZURITE`` set)
    a missing Azurite is a failure of the set-up, not a reason to skip: the caller fails instead."""
    if azurite_binary() is not None:
        return None
    return (
        "Azurite (azurite-blob) is not installed: `make azurite` (or `make test`) installs it into .tools/ "
        "(npm install --prefix .tools azurite@3.35.0 --no-audit --no-fund)"
    )


def require_azurite() -> Path:
    """The binary, or fail (under ``make test``) / skip (elsewhere) with a clear reason."""
    import pytest

    binary = azurite_binary()
    if binary is not None:
        return binary
    reason = azurite_missing_reason() or ""
    if os.environ.get("SE_BRIDGE_AZURITE"):
        pytest.fail(f"SE_BRIDGE_AZURITE={os.environ['SE_BRIDGE_AZURITE']} is set but {reason}")
    pytest.skip(reason)


class Azurite:
    """One ``azurite-blob`` process on a free loopback port, in memory, with its own account and key."""

    def __init__(self, binary: Path, account: str | None = None) -> None:
        self.binary = binary
        self.account = account or "acct" + secrets.token_hex(4)
        self.key = base64.b64encode(secrets.token_bytes(48)).decode()
        self.host = "127.0.0.1"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix="azurite-"))
        self._output = bytearray()
        self._reader: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, port: int = 0, timeout: float = 60.0) -> Azurite:
        """Start and wait until the Blob endpoint answers HTTP (``port=0``: any free port)."""
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{self.account}:{self.key}"}
        self._output = bytearray()
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                "--blobHost",
                self.host,
                "--blobPort",
                str(port),
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--loose",
                "--silent",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self._workdir,
            env=env,
            start_new_session=True,  # its own process group: stop() ends node and anything it forked
        )
        self._reader = threading.Thread(target=self._read_output, name="azurite-output", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while True:
            match = _LISTENING.search(bytes(self._output))
            if match is not None:
                self.port = int(match.group(2))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"azurite exited with {self.proc.returncode}: {self.output[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"azurite did not start within {timeout:g} s: {self.output[-2000:]}")
            time.sleep(0.05)
        self._wait_answering(deadline)
        return self

    def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self._output += line

    def _wait_answering(self, deadline: float) -> None:
        session = requests.Session()
        session.trust_env = False
        while True:
            try:
                # Any HTTP answer proves the service is up (an unsigned request is refused with 4xx).
                session.get(f"{self.blob_endpoint}?comp=list", timeout=2)
                return
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"azurite does not answer on {self.blob_endpoint}") from None
                time.sleep(0.1)

    @property
    def output(self) -> str:
        return bytes(self._output).decode(errors="replace")

    def stop(self) -> None:
        """Stop the process (its whole process group) and forget every blob (in-memory storage)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        # Azurite takes its time on SIGINT/SIGTERM (it waits for open connections); with in-memory
        # storage there is nothing to flush, so its process group is killed outright.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if self._reader is not None:
            self._reader.join(5)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses and clients --------------------------------------------------------------------

    @property
    def blob_endpoint(self) -> str:
        return f"http://{self.host}:{self.port}/{self.account}"

    def connection_string(self, key: str | None = None) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account};AccountKey={key or self.key};"
            f"BlobEndpoint={self.blob_endpoint};"
        )

    def container(self, name: str):  # type: ignore[no-untyped-def] - the vendored client has no stubs
        """A ``ContainerClient`` (the checkpoint store's own vendored storage client) for checks."""
        from azure.eventhub.extensions.checkpointstoreblob._vendor.storage.blob import ContainerClient

        return ContainerClient.from_connection_string(self.connection_string(), name)

    def create_container(self, name: str) -> None:
        self.container(name).create_container()

    def blobs(self, container: str) -> dict[str, dict[str, str]]:
        """Every blob of ``container``: name -> metadata."""
        return {
            b.name: dict(b.metadata or {}) for b in self.container(container).list_blobs(include=["metadata"])
        }


@contextlib.contextmanager
def azurite() -> Iterator[Azurite]:
    """An Azurite for one test (skips or fails, see :func:`require_azurite`)."""
    with Azurite(require_azurite()) as running:
        yield running
