"""Local policies and hooks: approval without any bus, mirroring the documentation's loop.

The documentation's sample is ``prepare_for_event(event)`` for new events, an approval when the
preparation is done, and ``recover_from_event(event)`` for events that left the document. This
module does the same, configured rather than coded:

* **auto-approve rules** (``--auto-approve 'source=User'``, ``'type=Freeze,max_duration=9'``): a
  Scheduled event affecting this VM that matches a rule is approved by the agent itself, through the
  relay (so it is checked, posted once, and audited like any other approval);
* **prepare hook** (``--prepare-hook CMD``): run for every Scheduled event affecting this VM (drain,
  checkpoint, leave the load balancer). Its timeout ends ``--hook-margin`` seconds before the
  event's NotBefore. When the event is to be approved locally (a rule matches, or
  ``--approve-after-prepare``), the approval happens only if the hook exits 0 in time;
* **recover hook** (``--recover-hook CMD``): run when an event that affected this VM is gone
  (``completed``, ``canceled``, ``removed``);
* **preparation records**: when the prepare hook ends (and, with coordination on, at once for an
  agent without a hook) the agent publishes ``prepared`` or ``prepareFailed`` for the event and
  answers it on ``GET /v1/preparations``;
* **coordination** (``--coordinate``, :mod:`bridge.coordination`): ``off`` approves as soon as this
  VM is prepared, which releases every VM the event names; ``peers`` hands the local approval to the
  peer coordinator (:mod:`bridge.agent.coordinator`), which approves once every VM of the event is
  prepared; ``fleet`` only reports, and a fleet approver run with ``--coordinate`` approves.

Hooks get the event as environment variables (``SE_EVENT_ID``, ``SE_EVENT_TYPE``, ``SE_EVENT_STATUS``,
``SE_EVENT_SOURCE``, ``SE_NOT_BEFORE``, ``SE_DURATION_SECONDS``, ``SE_RESOURCES``, ``SE_CHANGE``,
``SE_VM_NAME``, ``SE_VM_ID``) and as a JSON file (``SE_EVENT_FILE``). Their output is captured and
logged. They run on their own threads, after the record is durable: a slow, failing or hanging hook
never delays polling or forwarding, and the notification always goes out before local action.
Commands are split like a shell would (``shlex``) but not run through a shell.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import orjson

from bridge import records
from bridge.agent.coordinator import PeerCoordinator
from bridge.agent.diff import Change
from bridge.agent.metrics import AgentMetrics
from bridge.coordination import PREPARE_FAILED, PREPARED
from bridge.imds.document import SCHEDULED, EventsDocument, ScheduledEvent
from bridge.imds.instance import VmIdentity
from bridge.rules import ApprovalRule
from bridge.schemas import JsonObject
from bridge.support.timeutil import rfc3339

log = logging.getLogger(__name__)

OUTPUT_LIMIT = 4096
GONE = {"completed", "canceled", "removed"}
NEW_SCHEDULED = {"scheduled", "present", "updated"}


@dataclass(frozen=True)
class PolicyConfig:
    rules: tuple[ApprovalRule, ...] = ()
    prepare_hook: str | None = None
    recover_hook: str | None = None
    hook_timeout: float = 600.0
    hook_margin: float = 30.0
    approve_after_prepare: bool = False
    coordinate: str = "off"  # off | peers | fleet

    @property
    def active(self) -> bool:
        return bool(self.rules or self.prepare_hook or self.recover_hook or self.coordinate != "off")


@dataclass(frozen=True)
class HookRun:
    """How a hook ended: ``ok``, ``failed`` (non-zero exit), ``timeout`` or ``error`` (did not start)."""

    result: str
    exit_code: int | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.result == "ok"

    def to_json(self) -> JsonObject:
        return {"result": self.result, "exitCode": self.exit_code, "seconds": round(self.seconds, 3)}


class LocalPolicy:
    """Reacts to recorded changes (called by the poller once the record is durable)."""

    def __init__(
        self,
        config: PolicyConfig,
        approve: Callable[[JsonObject, str], object],
        identity: Callable[[], VmIdentity],
        metrics: AgentMetrics | None,
        *,
        publish: Callable[[JsonObject], None] | None = None,
        coordinator: PeerCoordinator | None = None,
    ) -> None:
        self.config = config
        self._approve = approve  # relay.handle(body, requester, component="policy")
        self._identity = identity
        self._metrics = metrics
        self._publish = publish  # a record to the outbox (waits for room; never drops it)
        self._coordinator = coordinator
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="hook")
        self._handled: set[str] = set()
        self._prepared: dict[str, dict[str, str]] = {}  # event id -> {"result", "at"}

    def preparations(self) -> dict[str, dict[str, str]]:
        """This VM's reports per event (``GET /v1/preparations``, what peer coordinators ask)."""
        return dict(self._prepared)

    def report(self, event_id: str) -> str | None:
        entry = self._prepared.get(event_id)
        return entry["result"] if entry else None

    def on_change(
        self, previous: EventsDocument | None, current: EventsDocument, changes: list[Change]
    ) -> None:
        vm = self._identity()
        names = vm.names()
        now = {e.event_id: e for e in current.events}
        before = previous.by_id() if previous is not None else {}
        for change in changes:
            if change.change in NEW_SCHEDULED and change.event_id not in self._handled:
                event = now[change.event_id]
                if event.event_status == SCHEDULED and vm.affects(event.resources, names):
                    self._handled.add(change.event_id)
                    self._pool.submit(self._prepare_and_approve, event, change.change, vm)
            elif change.change in GONE:
                self._prepared.pop(change.event_id, None)
            if change.change in GONE and self.config.recover_hook:
                self._handled.discard(change.event_id)
                gone = before.get(change.event_id)
                if gone is not None and vm.affects(gone.resources, names):
                    self._pool.submit(
                        self._run_hook,
                        "recover",
                        self.config.recover_hook,
                        gone,
                        change.change,
                        vm,
                        self.config.hook_timeout,
                    )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- work (on hook threads) ----------------------------------------------------------------------

    def _prepare_and_approve(self, event: ScheduledEvent, change: str, vm: VmIdentity) -> None:
        config = self.config
        rule = next((r for r in config.rules if r.matches(event)), None)
        wants_approval = rule is not None or (
            config.approve_after_prepare and (bool(config.prepare_hook) or config.coordinate == "peers")
        )
        coordinated = config.coordinate == "peers" and self._coordinator is not None
        if coordinated and wants_approval:
            # The wait runs beside the hook: this VM may be the coordinator, and a long hook must
            # not keep it from its deadline (or from answering for the others).
            self._pool.submit(self._coordinator.coordinate, event.event_id)  # type: ignore[union-attr]
        run = None
        if config.prepare_hook:
            timeout = self._prepare_timeout(event)
            run = self._run_hook("prepare", config.prepare_hook, event, change, vm, timeout)
        if run is not None or config.coordinate != "off":
            self._report_preparation(event, vm, run)
        if run is not None and not run.ok:
            if wants_approval:
                log.warning(
                    "prepare hook did not succeed: event not approved locally",
                    extra={"eventId": event.event_id},
                )
            if config.coordinate != "peers":
                return  # a peer coordinator still waits: the deadline policy may approve anyway
        if config.coordinate != "off":
            return  # the coordinator (fleet approver or peer) approves once every VM is prepared
        if wants_approval:
            requester = f"policy:{rule.text}" if rule else "policy:approve-after-prepare"
            body: JsonObject = {
                "decisionId": f"policy-{event.event_id}"[:128],
                "eventIds": [event.event_id],
                "target": vm.name,
                "issuedBy": requester,
            }
            self._approve(body, requester)

    def _report_preparation(self, event: ScheduledEvent, vm: VmIdentity, run: HookRun | None) -> None:
        result = PREPARED if run is None or run.ok else PREPARE_FAILED
        self._prepared[event.event_id] = {"result": result, "at": rfc3339(time.time())}
        if self._publish is not None:
            hook = None if run is None else run.to_json()
            self._publish(records.preparation_record(vm, event.to_json(), result, hook, time.time()))

    def _prepare_timeout(self, event: ScheduledEvent) -> float:
        timeout = self.config.hook_timeout
        if event.not_before:
            left = (
                datetime.fromisoformat(event.not_before).timestamp() - time.time() - self.config.hook_margin
            )
            timeout = min(timeout, left)
        return max(1.0, timeout)

    def _run_hook(
        self, name: str, command: str, event: ScheduledEvent, change: str, vm: VmIdentity, timeout: float
    ) -> HookRun:
        env = {
            **os.environ,
            "SE_EVENT_ID": event.event_id,
            "SE_EVENT_TYPE": event.event_type,
            "SE_EVENT_STATUS": event.event_status,
            "SE_EVENT_SOURCE": event.event_source or "",
            "SE_NOT_BEFORE": event.not_before or "",
            "SE_DURATION_SECONDS": ""
            if event.duration_in_seconds is None
            else str(event.duration_in_seconds),
            "SE_RESOURCES": ",".join(event.resources),
            "SE_CHANGE": change,
            "SE_VM_NAME": vm.name,
            "SE_VM_ID": vm.vm_id or "",
        }
        started = time.monotonic()
        with tempfile.NamedTemporaryFile("wb", prefix="se-event-", suffix=".json", delete=False) as f:
            f.write(orjson.dumps({"change": change, "event": event.to_json(), "vm": vm.to_record()}))
            env["SE_EVENT_FILE"] = f.name
        try:
            proc = subprocess.run(
                shlex.split(command), env=env, capture_output=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            self._record(name, "timeout", event, started, None, exc.stdout, exc.stderr)
            return HookRun("timeout", None, time.monotonic() - started)
        except OSError as exc:
            log.error("hook could not start", extra={"hook": name, "command": command, "error": str(exc)})
            self._count(name, "error")
            return HookRun("error", None, time.monotonic() - started)
        finally:
            os.unlink(env["SE_EVENT_FILE"])
        result = "ok" if proc.returncode == 0 else "failed"
        self._record(name, result, event, started, proc.returncode, proc.stdout, proc.stderr)
        return HookRun(result, proc.returncode, time.monotonic() - started)

    def _record(
        self,
        name: str,
        result: str,
        event: ScheduledEvent,
        started: float,
        code: int | None,
        stdout: bytes | None,
        stderr: bytes | None,
    ) -> None:
        self._count(name, result)
        level = logging.INFO if result == "ok" else logging.WARNING
        log.log(
            level,
            f"{name} hook {result}",
            extra={
                "hook": name,
                "eventId": event.event_id,
                "exitCode": code,
                "seconds": round(time.monotonic() - started, 3),
                "stdout": (stdout or b"")[-OUTPUT_LIMIT:].decode("utf-8", "replace"),
                "stderr": (stderr or b"")[-OUTPUT_LIMIT:].decode("utf-8", "replace"),
            },
        )

    def _count(self, name: str, result: str) -> None:
        if self._metrics is not None:
            self._metrics.hook_runs.labels(name, result).inc()
