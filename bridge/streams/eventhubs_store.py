"""The Event Hubs decision source's checkpoint store: the SDK's Blob store, made to keep one owner
id per approver instance and to report its health.

Why a wrapper: the SDK's processor picks a random owner id at every start, so a restarted instance
looked like a new one and waited for its own old claims to expire before it read again; the wrapper
writes a stable id (derived from the instance) in the blobs and the processor's own id in what it
hands back. It also records whether the store answered (``StoreHealth``): the source reports a store
that cannot be reached instead of the processor retrying silently.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bridge.transports.eventhubs import one_line

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
