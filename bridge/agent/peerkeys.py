"""Each agent's own answer key, and the keys of its peers, pinned (issue 31: per-VM peer answers).

Peer coordination (``coordinate=peers``) asks the other VMs of an event for their preparation. Those
answers used to be signed with the relay key, which every agent of a fleet holds: root on one VM could
answer in any other VM's name. Now each agent makes an Ed25519 key of its own at its first start
(``<state-dir>/answer-key.pem``, 0600; it never leaves the VM) and signs its answers with it, the
public key inside the answer (:func:`bridge.signing.sign_peer_answer`). The asking agent pins a peer's
public key at the first answer it proves (``<state-dir>/peer-keys.jsonl``, fsynced, kept across
restarts), and afterwards believes that peer's answers only under that key: another VM, whatever
keys it holds, cannot speak for a pinned peer.

What the pin cannot prove is the first answer (trust on first use): an attacker that intercepts the
very first question to a peer is believed until the real peer answers under its own key, which is then
refused and logged at error, which is how an operator notices. A reimaged VM makes a new key; remove
its line from its peers' ``peer-keys.jsonl`` (docs/security.md).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import orjson

from bridge.support.fsutil import append_durably

log = logging.getLogger(__name__)

KEY_FILE = "answer-key.pem"
PINS_FILE = "peer-keys.jsonl"
#: Peers pinned at most (an availability set holds 200 VMs; peers are named in the configuration).
MAX_PINS = 10_000


def answer_key(state_dir: Path) -> Any:
    """This agent's Ed25519 private key, made (0600) at the first start."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = state_dir / KEY_FILE
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if isinstance(key, Ed25519PrivateKey):
            return key
        raise ValueError(f"{path} is not an Ed25519 key")
    except FileNotFoundError:
        pass
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
        out.flush()
        os.fsync(out.fileno())
    return key


class PeerPins:
    """Peer name -> the hex public key its first proven answer carried."""

    def __init__(self, state_dir: Path | None) -> None:
        self.path = None if state_dir is None else state_dir / PINS_FILE
        self._pins: dict[str, str] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.exists():
            for line in self.path.read_bytes().splitlines():
                try:
                    item = orjson.loads(line)
                    self._pins[str(item["peer"]).lower()] = str(item["key"])
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn last line: that peer is pinned again at its next answer

    def check(self, peer: str, key: str) -> bool:
        """Whether ``key`` is ``peer``'s: pinned now at first sight, compared afterwards."""
        name = peer.lower()
        with self._lock:
            pinned = self._pins.get(name)
            if pinned is not None:
                return pinned == key
            if len(self._pins) >= MAX_PINS:
                return False
            if self.path is not None:
                try:
                    append_durably(self.path, orjson.dumps({"peer": name, "key": key}) + b"\n")
                except OSError as exc:  # believed now, pinned again after a restart
                    log.error("peer key not pinned on disk", extra={"peer": name, "error": str(exc)})
            self._pins[name] = key
            return True
