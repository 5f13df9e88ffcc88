"""``azuremonitor://<endpoint host>/<DCR immutable id>[?options]``: records into Log Analytics through
Azure Monitor's Logs Ingestion API, with Microsoft's client ``azure-monitor-ingestion``.

    POST https://<endpoint>/dataCollectionRules/<immutable id>/streams/<stream>?api-version=2023-01-01

(a JSON array of rows, gzip accepted; the endpoint is the data collection rule's own ``logsIngestion``
endpoint, DCR ``kind: Direct``, or a data collection endpoint). The client chunks an upload to the
1 MB per call limit and reports each failed chunk through ``on_error``: a chunk's rows map back to
their records, so one chunk refused does not fail the others.

Why it looks like this:

* **Batches, not a request per record.** Azure allows 12 000 requests a minute and 2 GB a minute per
  DCR; a fleet's wave of records would spend requests one by one. The sink takes up to ``batch``
  records (the delivery worker's window) and uploads them in one call; each record's outcome comes
  back with it (at least once: a retried chunk may repeat rows, deduplicated on ``RecordId``).
* **One row per record, the record kept whole.** Columns a workbook filters on are lifted out
  (``TimeGenerated`` from ``observedAt``, ``RecordId``, ``RecordType``, the VM, the event ids); the
  record itself is ``Record`` (dynamic). Azure truncates a field over 64 KB, so a record whose JSON is
  longer (a document with many events: ``raw`` repeats them) is written as several rows of
  ``RecordText`` parts (``PartIndex``/``PartCount``, same ``RecordId``), which KQL joins back: nothing is
  cut. Approval and reconciliation records go to streams of their own (``stream.approval=``,
  ``stream.reconciliation=``) so a workbook can join them with the events.
* **Errors by what can change on its own**: 429 (its ``Retry-After`` honoured by the worker's backoff),
  5xx, timeouts and connection errors are retried; 401/403 (no role, wrong audience) are retried too,
  because a role assignment takes minutes to apply and dead-lettering every record meanwhile would lose
  the backlog; 400/404 (a stream or column the DCR does not declare, a DCR that does not exist) are
  permanent for those records: dead-lettered with the status. A 413 (over the 1 MB limit) halves the
  batch and retries: only a single row refused is dead-lettered (a record is at most 60 KB a row).
* **Credentials**: the VM's managed identity (``credential=managed``, ``client_id=``) or azure-identity's
  default chain; the token's audience is ``https://monitor.azure.com`` (``audience=`` for sovereign
  clouds: ``https://monitor.azure.us``, ``https://monitor.azure.cn``). TLS verification is on
  (``ca_file=`` for a private CA), never through an environment proxy. No secret can be given in the
  spec. azure-monitor-ingestion and azure-identity are imported when the sink opens (extra
  ``monitor``): an agent writing elsewhere never loads them.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson

from bridge.pipeline import Entry, Outcome, Sink, SinkError
from bridge.pipeline.entry import RecordMeta
from bridge.records.fields import Refused
from bridge.records.reader import Reader, event_ids
from bridge.schemas import load_schema
from bridge.sinks.base import config_error, owner
from bridge.support.retry import parse_retry_after
from bridge.transports.azure import IDENTITIES, check_client_id, make_credential

DEFAULT_AUDIENCE = "https://monitor.azure.com"
#: The streams and columns, declared once (schemas/logs-ingestion.v1.json: the Bicep of the tables and
#: the DCR reads the same file): each record type's stream, the default stream for any other type.
LAYOUT = load_schema("logs-ingestion.v1.json")
DEFAULT_STREAMS = {t: name for name, stream in LAYOUT["streams"].items() for t in stream["recordTypes"]}
DEFAULT_STREAM = "Custom-SeBridgeRecords"
COLUMNS = tuple(c["name"] for c in LAYOUT["columns"])
#: Azure truncates a field beyond 64 KB; a record's JSON longer than this goes as parts.
MAX_FIELD_BYTES = 60 * 1024
MAX_BATCH = 500
MAX_RETRY_AFTER = 300.0
_PERMANENT = {400, 404, 413}
_OPTIONS = {"credential", "client_id", "audience", "stream", "ca_file", "timeout", "batch"}


class LogsIngestionSink(Sink):
    scheme = "azuremonitor"

    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        parts = urlsplit(spec.strip())
        path = [p for p in parts.path.split("/") if p]
        if parts.scheme != "azuremonitor" or not parts.hostname or len(path) != 1:
            raise self._refuse("expected azuremonitor://<endpoint host>/<DCR immutable id>[?options]")
        if not path[0].startswith("dcr-"):
            raise self._refuse("the DCR's immutable id starts with 'dcr-' (properties.immutableId)")
        self.endpoint = f"https://{parts.netloc}"
        self.rule_id = path[0]
        options = self._options(parts.query)
        self.credential_kind = options.pop("credential", "managed")
        if self.credential_kind not in IDENTITIES:
            raise self._refuse(f"credential must be one of {', '.join(IDENTITIES)}")
        self.client_id = check_client_id(self._owner, "client_id", options.pop("client_id", None))
        self.audience = options.pop("audience", DEFAULT_AUDIENCE).rstrip("/")
        if not self.audience.startswith("https://"):
            raise self._refuse("audience must be an https:// URL (https://monitor.azure.com)")
        self.ca_file = options.pop("ca_file", None)
        self.timeout = _number(self, options.pop("timeout", "30"), "timeout", 1, 300)
        self.max_in_flight = int(_number(self, options.pop("batch", str(MAX_BATCH)), "batch", 1, 5000))
        self.streams = {**DEFAULT_STREAMS, "": DEFAULT_STREAM}
        self._reader = Reader()  # the EventIds column: the events each record is about
        for key, value in options.items():  # stream=… (the default) and stream.<recordType>=…
            record_type = key.partition(".")[2]
            if not value.startswith("Custom-"):
                raise self._refuse(f"{key}: a custom stream is named Custom-<Name>")
            self.streams[record_type] = value
        self._client: Any = None
        self._pending: list[Entry] = []

    # -- configuration ---------------------------------------------------------------------------------

    @property
    def _owner(self) -> Any:
        return owner(f"azuremonitor sink {self.name}")

    def _refuse(self, message: str) -> SinkError:
        return config_error(f"azuremonitor sink {self.name}: {message}")

    def _options(self, query: str) -> dict[str, str]:
        options: dict[str, str] = {}
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key not in _OPTIONS and not key.startswith("stream."):
                raise self._refuse(
                    f"unknown option {key!r} (known: {', '.join(sorted(_OPTIONS))}, stream.TYPE)"
                )
            if key in options:
                raise self._refuse(f"option {key!r} is given twice")
            options[key] = value
        return options

    # -- the sink contract ---------------------------------------------------------------------------

    def open(self) -> None:
        try:
            from azure.monitor.ingestion import LogsIngestionClient
        except ImportError as exc:
            raise self._refuse(
                f"needs azure-monitor-ingestion ({exc}); pip install 'scheduled-events-bridge[monitor]'"
            ) from None
        from azure.core.pipeline.transport import RequestsTransport

        credential = make_credential(self._owner, "credential", self.credential_kind, self.client_id)
        transport = RequestsTransport(
            use_env_settings=False,  # never through an environment proxy
            connection_verify=self.ca_file or True,  # TLS verification is never off
            connection_timeout=self.timeout,
            read_timeout=self.timeout,
        )
        self._client = LogsIngestionClient(
            self.endpoint,
            credential,
            credential_scopes=[f"{self.audience}/.default"],
            transport=transport,
            retry_total=0,  # retried by the delivery worker, with its backoff and Retry-After
            logging_enable=False,
        )

    def submit(self, entry: Entry) -> None:
        self._pending.append(entry)

    def poll(self, timeout: float) -> list[Outcome]:
        """Upload what was submitted, one call per stream (the client chunks it to 1 MB)."""
        if not self._pending:
            time.sleep(min(timeout, 0.05))
            return []
        if self._client is None:
            self.open()
        pending, self._pending = self._pending, []
        by_stream: dict[str, list[tuple[Entry, list[dict[str, Any]]]]] = {}
        outcomes: list[Outcome] = []
        for entry in pending:
            try:
                record = orjson.loads(entry.payload)
                rows = rows_of(record, self._reader)
            except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
                error = SinkError(f"not a record: {exc}", kind="invalid", retryable=False)
                outcomes.append(Outcome(entry.seq, error))
                continue
            stream = self.streams.get(str(record.get("recordType")), self.streams[""])
            by_stream.setdefault(stream, []).append((entry, rows))
        for stream, items in by_stream.items():
            outcomes += self._upload(stream, items)
        return sorted(outcomes, key=lambda o: o.seq)

    def _upload(self, stream: str, items: list[tuple[Entry, list[dict[str, Any]]]]) -> list[Outcome]:
        from azure.core.exceptions import AzureError, HttpResponseError

        failed: dict[str, SinkError] = {}  # RecordId -> why its chunk failed

        def on_error(error: Any) -> None:
            why = self._too_large(_classify(error.error), len(error.failed_logs))
            for row in error.failed_logs:
                failed.setdefault(str(row.get("RecordId")), why)

        logs = [row for _, rows in items for row in rows]
        try:
            self._client.upload(rule_id=self.rule_id, stream_name=stream, logs=logs, on_error=on_error)
        except HttpResponseError as exc:  # not per chunk: the whole call
            why = self._too_large(_classify(exc), len(logs))
            return [Outcome(entry.seq, why) for entry, _ in items]
        except AzureError as exc:
            why = SinkError(f"Logs Ingestion unreachable: {type(exc).__name__}", kind="connection")
            return [Outcome(entry.seq, why) for entry, _ in items]
        return [Outcome(entry.seq, failed.get(str(rows[0]["RecordId"]))) for entry, rows in items]

    def _too_large(self, why: SinkError, rows: int) -> SinkError:
        """A 413 for more than one row is the batch's size, not the record's: halve the window (the
        worker submits fewer at once) and retry; only a single row refused is dead-lettered."""
        if why.kind != "http_413" or rows <= 1:
            return why
        self.max_in_flight = max(1, self.max_in_flight // 2)
        return SinkError(f"{why}; retried in smaller batches ({self.max_in_flight})", kind="http_413")

    def close(self, timeout: float = 5.0) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def rows_of(record: dict[str, Any], reader: Reader | None = None) -> list[dict[str, Any]]:
    """A record as rows of its stream: one, or several ``RecordText`` parts when it is too long. The
    columns come from the envelope (:class:`~bridge.pipeline.RecordMeta`) and the events the typed
    record is about; a record its reader refuses is still forwarded whole, without ``EventIds``
    (this sink forwards, it does not judge: nothing lost)."""
    meta = RecordMeta.of(record)
    typed = (reader or Reader()).read(record)
    ids = [] if typed is None or isinstance(typed, Refused) else list(event_ids(typed))
    base = {
        "TimeGenerated": meta.observed_at,
        "RecordId": meta.record_id or None,
        "RecordType": meta.record_type or None,
        "VmName": meta.vm_name,
        "VmId": meta.vm_id,
        "VmResourceId": meta.resource_id,
        "EventIds": ids,
    }
    if not base["RecordId"] or not base["TimeGenerated"]:
        raise ValueError("a record has a recordId and an observedAt")
    text = orjson.dumps(record)
    if len(text) <= MAX_FIELD_BYTES:
        return [{**base, "Record": record, "PartIndex": 0, "PartCount": 1}]
    parts = split_utf8(text, MAX_FIELD_BYTES)
    return [
        {
            **base,
            "RecordText": part.decode("utf-8"),
            "PartIndex": n,
            "PartCount": len(parts),
        }
        for n, part in enumerate(parts)
    ]


def split_utf8(text: bytes, size: int) -> list[bytes]:
    """UTF-8 text in parts of at most ``size`` bytes, never cutting a character (issue 34: a cut
    one became two lone surrogates, which the JSON of the request could not carry and KQL's rejoin
    could not mend): a cut that lands on a continuation byte (``10xxxxxx``) moves back to the
    character's first byte."""
    parts: list[bytes] = []
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        while end < len(text) and end > start and text[end] & 0xC0 == 0x80:
            end -= 1
        parts.append(text[start:end])
        start = end
    return parts


def _classify(error: Any) -> SinkError:
    status = getattr(getattr(error, "response", None), "status_code", None) or getattr(
        error, "status_code", None
    )
    message = (
        f"Logs Ingestion answered {status}" if status else f"Logs Ingestion failed: {type(error).__name__}"
    )
    if status in _PERMANENT:
        code = getattr(getattr(error, "error", None), "code", None)
        return SinkError(f"{message} ({code})" if code else message, kind=f"http_{status}", retryable=False)
    headers = getattr(getattr(error, "response", None), "headers", None) or {}
    retry_after = parse_retry_after(headers.get("Retry-After"), MAX_RETRY_AFTER) if status == 429 else None
    kind = (
        "http_429"
        if status == 429
        else ("auth" if status in (401, 403) else "http_5xx" if status else "connection")
    )
    return SinkError(message, kind=kind, retry_after=retry_after)


def _number(sink: LogsIngestionSink, value: str, name: str, low: float, high: float) -> float:
    try:
        number = float(value)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise sink._refuse(f"{name} must be a number in [{low:g}, {high:g}]")
    return number
