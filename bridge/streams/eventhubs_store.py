"""The Event Hubs decision source's checkpoint store: the SDK's Blob store, made to keep one owner
id per approver instance and to report its health.

Why a wrapper: the SDK's processor picks a random owner id at every start, so a restarted instance
looked like a new one and waited for its own old claims to expire before it read again; the wrapper
writes a stable id (derived from the instance) in the blobs and the processor's own id in what it
hands back. It also records whether the store answered (``StoreHealth``): the source reports a store
that cannot be reached instead of the processor retrying silently.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bridge.streams.base import SourceError
from bridge.streams.eventhubs_options import OWNER, SourceOptions
from bridge.support.fsutil import write_atomic
from bridge.support.redaction import redact
from bridge.transports.azure import EXTRA_HINT
from bridge.transports.eventhubs import (
    Abandoned,
    HubConnection,
    abandon,
    call_with_deadline,
    identity_error,
    one_line,
)

log = logging.getLogger("bridge.streams.eventhubs")

# The storage client's own retries: a few quick ones (its default waits 15 s, then 18 s, then 24 s).
STORE_OPTIONS: dict[str, Any] = {
    "retry_total": 2,
    "initial_backoff": 1,
    "increment_base": 2,
    "random_jitter_range": 1,
    "connection_timeout": 10,
    "read_timeout": 10,
}


class StoreHealth:
    """The last failure of the checkpoint store as the SDK's load balancing met it (None: fine)."""

    def __init__(self) -> None:
        self.failure: str | None = None


def stable_owner_store(inner: Any, owner_id: str, health: StoreHealth) -> Any:
    """A ``CheckpointStore`` that writes ``owner_id`` instead of the processor's random one.

    The processor's own id is learned from its first claim (every ownership it claims carries it) and
    translated both ways, so the SDK sees a consistent picture. Before that first claim, ownerships of
    ``owner_id`` (a previous incarnation of this approver, killed without releasing them) are shown as
    released: claimable at once instead of after ``ownership_expiration``.
    """
    from azure.eventhub import CheckpointStore

    class StableOwnerStore(CheckpointStore):
        def __init__(self) -> None:
            self.runtime_id: str | None = None

        def _track(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                health.failure = one_line(exc)
                raise
            health.failure = None
            return result

        def list_ownership(
            self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **kwargs: Any
        ) -> Iterable[dict[str, Any]]:
            out = []
            listed = self._track(
                inner.list_ownership, fully_qualified_namespace, eventhub_name, consumer_group, **kwargs
            )
            for ownership in listed:
                if ownership.get("owner_id") == owner_id:
                    ownership = {**ownership, "owner_id": self.runtime_id or ""}
                out.append(ownership)
            return out

        def claim_ownership(self, ownership_list: Any, **kwargs: Any) -> Any:
            to_write = []
            for ownership in ownership_list:
                owner = ownership.get("owner_id")
                if owner and owner != owner_id:  # the processor's own (random) id
                    self.runtime_id = owner
                    ownership = {**ownership, "owner_id": owner_id}
                to_write.append(ownership)
            claimed = self._track(inner.claim_ownership, to_write, **kwargs)
            return [
                {**c, "owner_id": self.runtime_id} if c.get("owner_id") == owner_id else c for c in claimed
            ]

        def update_checkpoint(self, checkpoint: Any, **kwargs: Any) -> None:
            inner.update_checkpoint(checkpoint, **kwargs)

        def list_checkpoints(
            self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **kwargs: Any
        ) -> Iterable[dict[str, Any]]:
            return self._track(  # type: ignore[no-any-return]
                inner.list_checkpoints, fully_qualified_namespace, eventhub_name, consumer_group, **kwargs
            )

    return StableOwnerStore()


class Checkpoints:
    """The source's checkpoint store: two Blob store clients (the SDK's, behind a stable owner id, and
    the source's own for ``update_checkpoint``), built from the spec and checked at start (a refused
    credential or a missing container is permanent; anything else is retried by the SDK's load
    balancing, and reported as the store's health)."""

    def __init__(
        self,
        options: SourceOptions,
        connection: HubConnection,
        owner_path: Path,
        hub: str,
        name: str,
        open_timeout: float,
    ) -> None:
        self.options, self.connection, self.hub, self.name = options, connection, hub, name
        self.open_timeout = open_timeout
        self.health = StoreHealth()
        self.committer: Any = self._new_store()
        container = getattr(self.committer, "_container_client", None)  # its URL, for messages only
        self.where = redact(str(getattr(container, "url", options.container)).split("?")[0])
        self._sdk_store: Any = self._new_store()  # the blob store inside ``store``
        self.store: Any = stable_owner_store(self._sdk_store, self._owner_id(owner_path), self.health)

    def progress(self, namespace: str, consumer_group: str) -> dict[str, int]:
        """The group's checkpoints (the sequence number of each partition's last finished event)."""
        try:
            checkpoints = self.committer.list_checkpoints(namespace, self.hub, consumer_group)
        except Exception as exc:
            raise SourceError(
                f"eventhubs source {self.name}: checkpoints unreadable: {one_line(exc)}", retryable=True
            ) from None
        return {str(c["partition_id"]): int(c["sequence_number"]) for c in checkpoints}

    def close(self) -> None:
        for store in (self.committer, self._sdk_store):
            with contextlib.suppress(Exception):
                store.close()

    def _owner_id(self, path: Path) -> str:
        try:
            owner = path.read_text().strip()
        except FileNotFoundError:
            owner = ""
        if not owner:
            owner = str(uuid.uuid4())
            write_atomic(path, owner.encode() + b"\n")
        return owner

    def _new_store(self) -> Any:
        try:
            from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
        except ImportError as exc:
            raise OWNER.refuse(
                f"the checkpoint store needs azure-eventhub-checkpointstoreblob ({exc}); {EXTRA_HINT}"
            ) from None
        so = self.options
        assert so.container is not None
        if so.account_url is not None:
            return BlobCheckpointStore(
                so.account_url, so.container, credential=self.connection.azure_credential(), **STORE_OPTIONS
            )
        assert so.checkpoint is not None
        text = so.checkpoint.resolve(OWNER).strip()
        try:
            return BlobCheckpointStore.from_connection_string(text, so.container, **STORE_OPTIONS)
        except (ValueError, TypeError, KeyError) as exc:
            # The SDK's parse errors are generic, but never echo anything derived from the secret.
            raise OWNER.refuse(
                f"the checkpoint connection string is not usable ({type(exc).__name__})"
            ) from None

    def check(self, consumer_group: str) -> None:
        """List this hub's checkpoints (one request on the container): a refused credential or a
        missing container is permanent, anything else is retried later."""
        timeout = self.open_timeout

        def check() -> Any:
            return self.committer.list_checkpoints("se-bridge-start-check", self.hub, consumer_group)

        try:
            call_with_deadline(check, timeout, "eventhubs-source-check")
        except Abandoned as stuck:
            abandon(stuck.thread, None)
            self._unreachable(f"no answer within {timeout:g} s")
        except Exception as exc:
            permanent, detail = self._classify(exc)
            if permanent:
                raise OWNER.refuse(f"checkpoint store {self.where}: {detail}") from None
            self._unreachable(detail)

    def _classify(self, exc: BaseException) -> tuple[bool, str]:
        """(permanent, detail) of a failed container check."""
        identity = identity_error(exc)  # Entra ID's refusal, or the account's (storage raises it too)
        if identity is not None:
            status = getattr(identity, "status_code", None)
            if type(identity).__name__ == "CredentialUnavailableError" or status in (400, 401, 403):
                return True, (
                    "credential refused (no Entra ID token, or the storage account refused the key or the "
                    f"identity: check the Storage Blob Data Contributor role): {one_line(identity)}"
                )
            return False, f"token request failed: {one_line(identity)}"
        status = getattr(exc, "status_code", None)
        if status in (401, 403):
            return True, (
                "credential refused by the storage account (check the key, or the Storage Blob Data "
                f"Contributor role on the container): {one_line(exc)}"
            )
        if status == 404:
            return True, (
                f"container {self.options.container!r} not found (the infrastructure creates it; "
                f"the source does not): {one_line(exc)}"
            )
        return False, one_line(exc)

    def _unreachable(self, detail: str) -> None:
        self.health.failure = f"unreachable at start: {detail}"
        log.warning(
            "checkpoint store unreachable at start; the source retries every load balancing round",
            extra={
                "source": self.name,
                "store": self.where,
                "error": redact(detail),
                "retryEvery": self.options.load_balancing_interval,
            },
        )
