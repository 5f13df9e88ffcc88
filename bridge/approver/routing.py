"""Routing a decision to an agent's relay API, and the HTTP client that calls it.

* **local** mode (what the VM extension installs): the agent on the same VM, at a loopback URL or
  its Unix socket. Every VM's approver reads every decision, so it acts only on the decisions whose
  ``target`` is this VM (its name, vmId or host name, learned once from the agent's
  ``/v1/document``) and skips the others silently: relaying them would make every other VM's agent
  write a refusal audit record for each decision. It does not act for another VM of the same event
  either: that VM's own approver does, and two approvers acting for one event would post two
  StartRequests (failover between the VMs of an event is the fleet approver's job).
* **fleet** mode (one horizontally scaled approver for many VMs): the approver reads the events
  stream too and learns, from each record's ``vm`` block, where every agent listens
  (``--relay-url-template``, default ``http://{privateIp}:8710``) and, from its ``events``, which VMs
  each event names in ``Resources``. A decision goes to the agent of its ``target`` VM first, then
  to the other VMs of the same event: approving through any of them releases the event for all, which
  is the documentation's primary/secondary advice for when the primary VM does not answer.
"""

from __future__ import annotations

import http.client
import logging
import ssl
import threading
from collections.abc import Callable

import orjson

from bridge.approver.fleet import FleetView, Vm
from bridge.decisions import Decision
from bridge.eligibility import EventFacts
from bridge.http.netaddr import UnixHTTPConnection
from bridge.records.azure import AzureEvent, Finding
from bridge.records.ids import AZURE_EVENT, PREPARATION, RECONCILIATION, SCHEDULED_EVENTS
from bridge.records.reader import Reader, Record
from bridge.records.scheduled_events import ScheduledEvents
from bridge.relay_api import DOCUMENT_PATH, START_REQUESTS_PATH, RelayAnswer, RelayAnswerError, request_body
from bridge.schemas import JsonObject
from bridge.signing import KeyRing, sign_request
from bridge.streams import DecisionSource
from bridge.streams.follow import follow

log = logging.getLogger(__name__)

MAX_ANSWER = 1024 * 1024
#: Seconds to connect to an agent (the answer has --relay-timeout): a rebooting VM drops SYNs.
CONNECT_TIMEOUT = 3.0


class RelayUnavailable(Exception):
    """No agent answered (connection refused, timeout, 5xx).

    ``never_sent`` is True only when the request cannot have reached the agent (the connection was
    never made): only then may the decision take another path (ARM) without risking a second
    approval of what the agent may already have posted."""

    def __init__(self, message: str, *, never_sent: bool = False) -> None:
        super().__init__(message)
        self.never_sent = never_sent


def _never_connected(exc: BaseException) -> bool:
    """requests' exception for a connection that was never made (refused, unreachable, connect timeout)."""
    import requests
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, NewConnectionError

    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    if not isinstance(exc, requests.exceptions.ConnectionError):
        return False
    inner = exc.args[0] if exc.args else None
    reason = inner.reason if isinstance(inner, MaxRetryError) else inner
    if isinstance(exc, requests.exceptions.SSLError):
        # A certificate that failed verification ends the handshake: nothing was sent. Any other
        # TLS failure may come after the request was written.
        return _cause_is(reason, ssl.SSLCertVerificationError)
    return isinstance(reason, NewConnectionError | ConnectTimeoutError)


def _cause_is(exc: BaseException | None, kind: type[BaseException]) -> bool:
    """Whether ``exc``, its arguments or its causes (a bounded walk) include a ``kind``."""
    for _ in range(6):
        if exc is None:
            return False
        if isinstance(exc, kind):
            return True
        inner = next((a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)), None)
        exc = inner or exc.__cause__ or exc.__context__
    return False


class RelayClient:
    """POSTs relay requests, signed when a relay key is configured (agents then refuse anything
    unsigned, loopback included). ``unix:/path`` relay addresses are the agent's Unix socket
    listener; ``http(s)://`` the TCP one (TLS verified, never through a proxy)."""

    def __init__(self, keys: KeyRing, timeout: float = 15.0, ca_file: str | None = None) -> None:
        import requests

        self._requests = requests
        self._session = requests.Session()
        self._session.trust_env = False  # agents are on loopback or the VNet: never through a proxy
        # A fleet approver talks to every VM's agent: requests keeps the connections of 10 hosts by
        # default, so with more agents than that every relay request opened a new TCP (and TLS)
        # connection. Keep those of up to 1024 agents, one connection each (lanes serialise per VM).
        adapter = requests.adapters.HTTPAdapter(pool_connections=1024, pool_maxsize=2)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._keys = keys
        self._timeout = timeout
        # A VM that is down (rebooting: no RST, the SYN goes unanswered) must not hold a lane worker
        # for the whole answer timeout: connecting gets a few seconds of its own.
        self._http_timeout = (min(CONNECT_TIMEOUT, timeout), timeout)
        self._verify: str | bool = ca_file or True  # TLS verification is never off

    def start_requests(self, relay_url: str, body: JsonObject) -> RelayAnswer:
        """Relay one decision; its answer, read once (:meth:`RelayAnswer.from_json`)."""
        status, answer = self._post(relay_url, body)
        if status != 200 or not isinstance(answer, dict):
            return _refused_by_agent(body, status, answer)
        return _read_answer(body, answer)

    def start_requests_many(self, relay_url: str, bodies: list[JsonObject]) -> list[RelayAnswer]:
        """Relay several decisions for one VM in one request (``{"decisions": [...]}``, their order
        kept): the agent checks each and posts their events in one StartRequests. An agent older than
        that answers 400 to the list; each decision is then relayed on its own."""
        if len(bodies) == 1:
            return [self.start_requests(relay_url, bodies[0])]
        status, answer = self._post(relay_url, request_body(bodies))
        if status == 400:
            return [self.start_requests(relay_url, body) for body in bodies]
        if status != 200 or not isinstance(answer, dict):
            return [_refused_by_agent(body, status, answer) for body in bodies]
        answers = answer.get("answers")
        if not isinstance(answers, list) or len(answers) != len(bodies):
            raise RelayUnavailable(f"{relay_url}: answer does not hold one answer per decision")
        return [_read_answer(body, a) for body, a in zip(bodies, answers, strict=True)]

    def _post(self, relay_url: str, body: JsonObject) -> tuple[int, object]:
        """POST a relay request; (status, decoded answer). An outage is :class:`RelayUnavailable`."""
        data = orjson.dumps(body)
        headers = {"Content-Type": "application/json"}
        signer = self._keys.first()
        if signer is not None:
            headers.update(sign_request(signer[0], signer[1], "POST", START_REQUESTS_PATH, data))
        if relay_url.startswith("unix:"):
            status, answer_bytes = self._post_unix(relay_url[len("unix:") :], data, headers)
        else:
            status, answer_bytes = self._post_http(relay_url, data, headers)
        if status >= 500 or status == 429:
            raise RelayUnavailable(f"{relay_url}: HTTP {status}")
        try:
            return status, orjson.loads(answer_bytes)
        except orjson.JSONDecodeError:
            raise RelayUnavailable(f"{relay_url}: answer is not JSON") from None

    def document(self, relay_url: str) -> dict[str, object]:
        """The agent's ``GET /v1/document`` (its VM identity and current events); local callers need
        no token. :class:`RelayUnavailable` when the agent does not answer it."""
        if relay_url.startswith("unix:"):
            conn = UnixHTTPConnection(relay_url[len("unix:") :], self._timeout)
            try:
                conn.request("GET", DOCUMENT_PATH, headers={"Host": "localhost"})
                resp = conn.getresponse()
                status, body = resp.status, resp.read(MAX_ANSWER)
            except (OSError, http.client.HTTPException) as exc:
                raise RelayUnavailable(f"{relay_url}: {type(exc).__name__}") from None
            finally:
                conn.close()
        else:
            try:
                answered = self._session.get(
                    relay_url.rstrip("/") + DOCUMENT_PATH, timeout=self._http_timeout, verify=self._verify
                )
            except self._requests.RequestException as exc:
                raise RelayUnavailable(f"{relay_url}: {type(exc).__name__}") from None
            status, body = answered.status_code, answered.content
        try:
            answer = orjson.loads(body) if status == 200 else None
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise RelayUnavailable(f"{relay_url}: /v1/document answered HTTP {status}")
        return answer

    def _post_http(self, relay_url: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        url = relay_url.rstrip("/") + START_REQUESTS_PATH
        try:
            resp = self._session.post(
                url, data=data, headers=headers, timeout=self._http_timeout, verify=self._verify
            )
        except self._requests.RequestException as exc:
            raise RelayUnavailable(
                f"{relay_url}: {type(exc).__name__}", never_sent=_never_connected(exc)
            ) from None
        return resp.status_code, resp.content

    def _post_unix(self, path: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        conn = UnixHTTPConnection(path, self._timeout)
        try:
            conn.request("POST", START_REQUESTS_PATH, body=data, headers={**headers, "Host": "localhost"})
            resp = conn.getresponse()
            return resp.status, resp.read(MAX_ANSWER)
        except (OSError, http.client.HTTPException) as exc:
            raise RelayUnavailable(f"unix:{path}: {type(exc).__name__}") from None
        finally:
            conn.close()


class LocalRouter:
    """The agent on this VM; decisions for other VMs are not this approver's (module docstring)."""

    def __init__(self, relay_url: str, client: RelayClient | None = None) -> None:
        self.relay_url = relay_url
        self._client = client
        self._names: frozenset[str] | None = None  # this VM's names, once the agent told them
        self._resource_id: str | None = None
        self._asking = threading.Lock()  # one question to the agent at a time (start thread, owns())

    def candidates(self, decision: Decision) -> list[str]:
        return [self.relay_url]

    def owns(self, decision: Decision) -> bool:
        """Whether this VM's approver acts on ``decision``. While the agent cannot tell who this VM
        is (it is starting, or down), every decision is acted on: the agent's relay checks the
        target itself, and a decision must never be skipped on a guess."""
        names = self.this_vm()
        if names is None:
            return True
        return decision.target.lower() in names

    def resource_id(self, decision: Decision) -> str | None:
        """This VM's ARM resource id, once the agent told it."""
        return self._resource_id

    def scope_vm(self, decision: Decision) -> Vm | None:
        return None  # the ARM path is a fleet approver's (bridge.approver.build refuses it here)

    def event_facts(self, event_id: str) -> EventFacts | None:
        return None

    def azure_parent(self, event_id: str) -> str | None:
        return None

    def nobody_watches(self, decision: Decision) -> bool:
        return False  # a local approver's VM runs the agent it asks

    def this_vm(self) -> frozenset[str] | None:
        if self._names is not None or self._client is None:
            return self._names
        with self._asking:
            if self._names is None:
                self._ask_agent(self._client)
        return self._names

    def _ask_agent(self, client: RelayClient) -> None:
        try:
            block = client.document(self.relay_url).get("vm")
            vm: dict[str, object] = block if isinstance(block, dict) else {}
        except RelayUnavailable as exc:
            log.debug("this VM's identity is not known yet", extra={"error": str(exc)})
            return
        names = {
            str(n).lower() for k in ("name", "vmId", "hostname") if isinstance(n := vm.get(k), str) and n
        }
        if names:
            resource_id = vm.get("resourceId")
            self._resource_id = resource_id if isinstance(resource_id, str) else None
            self._names = frozenset(names)
            log.info("local approver acts for this VM", extra={"vmNames": sorted(self._names)})

    def start(self, stop: threading.Event) -> None:
        # Ask the agent who this VM is now, not on the first decision (best effort: owns() asks again).
        threading.Thread(target=self.this_vm, name="this-vm", daemon=True).start()


class FleetRouter:
    """Routes by what the fleet view learned from the events stream (see the module docstring and
    :mod:`bridge.approver.fleet`: identities pinned, events bounded and forgotten)."""

    def __init__(
        self,
        sources: list[DecisionSource],
        template: str = "http://{privateIp}:8710",
        view: FleetView | None = None,
    ) -> None:
        self.sources = sources
        self.template = template
        self.view = view or FleetView(None)
        #: Records come off the stream typed and schema-checked, Azure's channel's verified with the
        #: view's --azure-key keys (once, here).
        self.reader = Reader(
            azure_keys=self.view.azure_keys,
            types=(SCHEDULED_EVENTS, PREPARATION, AZURE_EVENT, RECONCILIATION),
        )
        #: Also given every record read (the fleet coordinator: events and preparation records).
        self.observers: list[Callable[[Record], None]] = []
        self._threads: list[threading.Thread] = []
        self._caught_up: set[int] = set()  # sources read to their end once (readiness)
        self._read = [0] * len(sources)  # records taken, per source

    def learn(self, record: ScheduledEvents) -> None:
        self.view.learn(record)

    def knows(self, name: str) -> bool:
        """Whether an agent of VM ``name`` published anything (it runs the agent)."""
        return self.view.vm(name) is not None

    def owns(self, decision: Decision) -> bool:
        """The fleet approver serves every VM it can reach."""
        return True

    def _order(self, decision: Decision) -> list[str]:
        """The decision's target first, then the other VMs of its event."""
        event = self.view.event(decision.event_id)
        return [decision.target, *(event.resources if event else ())]

    def candidates(self, decision: Decision) -> list[str]:
        urls: list[str] = []
        for name in self._order(decision):
            vm = self.view.vm(name)
            if vm is None or not vm.private_ip:
                continue
            url = self.template.format(privateIp=vm.private_ip, name=vm.name, vmId=vm.vm_id)
            if url not in urls:
                urls.append(url)
        return urls

    def scope_vm(self, decision: Decision) -> Vm | None:
        """The VM whose ARM scope acknowledges the decision's event: its target, or another VM of
        its event (an approval through any VM of an event releases it for all)."""
        for name in self._order(decision):
            vm = self.view.vm(name)
            if vm is not None and vm.resource_id:
                return vm
        for name in self._order(decision):  # no agent of the event told its id: Azure's channel may have
            vm = self.view.azure_vm(decision.event_id, name)
            if vm is not None:
                return vm
        return None

    def nobody_watches(self, decision: Decision) -> bool:
        """No agent of the event is known and Azure's reconciliation found the target unwatched: the ARM
        path may be taken at once (no request can reach an agent that does not exist)."""
        return not self.candidates(decision) and self.view.unwatched(decision.event_id, decision.target)

    def resource_id(self, decision: Decision) -> str | None:
        vm = self.scope_vm(decision)
        return vm.resource_id if vm is not None else None

    def event_facts(self, event_id: str) -> EventFacts | None:
        event = self.view.event(event_id)
        return event.facts() if event is not None else None

    def azure_parent(self, event_id: str) -> str | None:
        """The event's parent as Azure's own channel named it (bridge.azure), when one was read."""
        return self.view.azure_parent(event_id)

    def caught_up(self) -> bool:
        """Whether every events source was read to its end once: before, a decision may name a VM
        or an event this approver has not learned yet (``/readyz``)."""
        return len(self._caught_up) == len(self.sources)

    def start(self, stop: threading.Event) -> None:
        for index, source in enumerate(self.sources):
            thread = threading.Thread(
                target=self._follow, args=(index, source, stop), name="fleet-learn", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _follow(self, index: int, source: DecisionSource, stop: threading.Event) -> None:
        def take(record: Record) -> None:
            self._read[index] += 1  # one thread per source: its own count
            self._record(record)

        follow(source, take, stop, self.reader, caught_up=lambda: self._caught_up.add(index))

    def records_read(self) -> int:
        """Records taken from the events sources since start (``se_bridge_approver_fleet_records_read``:
        how far a restart's re-reading has come, against the stream's size)."""
        return sum(self._read)

    def _record(self, record: Record) -> None:
        if isinstance(record, ScheduledEvents):
            self.learn(record)
        elif isinstance(record, AzureEvent):
            self.view.learn_azure(record)
        elif isinstance(record, Finding):
            self.view.learn_finding(record)
        for observe in self.observers:
            observe(record)


def _refused_by_agent(body: JsonObject, status: int, answer: object) -> RelayAnswer:
    """400/401/403/415: the agent refused the request itself; that is an outcome, not an outage."""
    error = answer.get("error") if isinstance(answer, dict) else answer
    return RelayAnswer(
        str(body.get("decisionId", "")), "refused", f"relayHttp{status}", detail=str(error)[:200]
    )


def _read_answer(body: JsonObject, answer: object) -> RelayAnswer:
    """An agent's answer to one decision, read once. One this approver cannot read (another API, a
    bug) is audited ``failed`` with why, never guessed at: the agent's own audit says what it did."""
    try:
        return RelayAnswer.from_json(answer)
    except RelayAnswerError as exc:
        log.error(
            "an agent's answer is unreadable", extra={"decisionId": body.get("decisionId"), "error": str(exc)}
        )
        return RelayAnswer(str(body.get("decisionId", "")), "failed", "unreadableAnswer", detail=str(exc))
