"""A local AMQP 1.0 peer that speaks enough Azure Event Hubs for the *unmodified* azure-eventhub SDK.

Why it exists: the Event Hubs sink must be tested against the real SDK over real TCP (no Docker, no
cloud), including what the SDK does on the wire: SASL, claims-based security (``$cbs`` put-token),
the ``$management`` node, batched sends and consumer links with offset filters. This peer implements
that subset on top of the proton *engine* (python-qpid-proton 0.40.0): one background thread, one
``select`` loop, our own sockets, so :meth:`EventHubsPeer.stop` can drop every connection at once
("peer down") and :meth:`EventHubsPeer.start` can serve again on the same port.

Facts established on this machine with azure-eventhub 5.15.1 that shape this file:

* **Frame padding.** Proton omits trailing null fields of performatives (legal AMQP 1.0), but the
  SDK's pyamqp decoder in 5.15.1 reads performative fields by fixed position (Open field 9, Begin 7,
  Attach 13, Transfer 11) and fails on the server's first Open frame (``EventHubError: list index out
  of range``). Every outgoing performative is therefore rewritten here, between proton and the socket,
  into a list32 padded with explicit nulls to its full field count (open 10, begin 8, attach 14,
  flow 11, transfer 11, disposition 6, detach 3, end 1, close 1; SASL mechanisms 1, init 3,
  challenge 1, response 1, outcome 2). An upstream fix exists (Azure/azure-sdk-for-python PR 47660,
  not in 5.15.1); the padding stays harmless after it. Because the rewrite happens on the bytes proton
  produces, it touches no proton internals.
* **SASL** is always ANONYMOUS (SAS keys, SAS tokens and Entra ID alike): the real check is the
  ``$cbs`` put-token. Each client session attaches a receiver then a sender link, both ``$cbs``; the
  request has no reply-to, so the answer goes on that session's ``$cbs`` link, with
  ``correlation-id`` = the request's ``message-id`` and an integer ``status-code`` (202 like the
  service; 401 refuses). Audiences: ``sb://HOST:PORT/HUB`` (producer, management) and
  ``sb://HOST:PORT/HUB/consumergroups/CG`` (consumer).
* **$management** READ: ``type=com.microsoft:eventhub`` answers ``name``, ``created_at``,
  ``partition_ids``; ``com.microsoft:partition`` answers the partition's sequence numbers, offset and
  time. 404 makes the SDK raise ``ConnectError("Management connection failed. Status code: 404")``.
* **Batches** are transfers with message format ``0x80013700``: an outer message whose annotation
  ``x-opt-partition-key`` routes it and whose body is one data section per event, each a complete
  encoded AMQP message. Proton's Python binding does not expose a delivery's message format, so the
  peer reads it from the incoming transfer frames itself (see :class:`_Conn`).
* **Consumers** attach ``amqps://HOST:PORT/HUB/ConsumerGroups/CG/Partitions/N`` with a filter
  ``apache.org:selector-filter:string`` such as ``amqp.annotation.x-opt-offset > '-1'``; every
  delivered message needs ``x-opt-sequence-number`` (long), ``x-opt-offset`` (string) and
  ``x-opt-enqueued-time`` (timestamp) annotations.
* Link addresses keep the ``amqps://`` scheme even in emulator mode (``UseDevelopmentEmulator=true``).

Optional realism: with ``keys={"name": "key"}`` the peer verifies each SAS token's HMAC like the
service does, so a wrong key is refused (401) exactly where the real service refuses it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import itertools
import logging
import re
import select
import socket
import struct
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote_plus, unquote, urlsplit

from proton import (
    UNDESCRIBED,
    Array,
    Collector,
    Condition,
    Connection,
    Data,
    Delivery,
    Endpoint,
    Event,
    Link,
    Message,
    Session,
    Transport,
    symbol,
    timestamp,
)

log = logging.getLogger("tests.peers.eventhubs")

BATCH_FORMAT = 0x80013700
ACCEPTED = 202
SELECTOR_FILTER = "apache.org:selector-filter:string"

# Full field counts of every performative, by descriptor code (AMQP 1.0 part 2 and part 5).
_FIELD_COUNTS = {
    0x10: 10,  # open
    0x11: 8,  # begin
    0x12: 14,  # attach
    0x13: 11,  # flow
    0x14: 11,  # transfer
    0x15: 6,  # disposition
    0x16: 3,  # detach
    0x17: 1,  # end
    0x18: 1,  # close
    0x40: 1,  # sasl-mechanisms
    0x41: 3,  # sasl-init
    0x42: 1,  # sasl-challenge
    0x43: 1,  # sasl-response
    0x44: 2,  # sasl-outcome
}
_ATTACH, _TRANSFER = 0x12, 0x14

# Message sections (AMQP 1.0 part 3).
_MESSAGE_ANNOTATIONS, _DATA = 0x72, 0x75


# ------------------------------------------------------------------------------------------------ frames


class _FrameSplitter:
    """Cuts a byte stream into protocol headers (``AMQP....``) and whole frames."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        out: list[bytes] = []
        while len(self.buf) >= 8:
            if self.buf[:4] == b"AMQP":
                size = 8
            else:
                size = struct.unpack(">I", self.buf[:4])[0]
                if size < 8:  # malformed: pass it through unchanged, the receiver will complain
                    size = len(self.buf)
            if len(self.buf) < size:
                break
            out.append(bytes(self.buf[:size]))
            del self.buf[:size]
        return out


def pad_frame(frame: bytes) -> bytes:
    """Rewrite one frame so its performative lists every field (trailing nulls made explicit).

    The SDK (pyamqp, azure-eventhub 5.15.1) indexes performative fields by position and also assumes
    the list is a list8 or list32 (never list0), so both are normalized to a full list32.
    """
    if frame[:4] == b"AMQP" or len(frame) <= 8:
        return frame  # protocol header or empty (heartbeat) frame
    doff = frame[4] * 4
    body = frame[doff:]
    if len(body) < 4 or body[0] != 0x00 or body[1] != 0x53:
        return frame
    code = body[2]
    full = _FIELD_COUNTS.get(code)
    if full is None:
        return frame
    ctor = body[3]
    if ctor == 0x45:  # list0
        count, items, rest = 0, b"", body[4:]
    elif ctor == 0xC0:  # list8: size (1), count (1), items
        size, count = body[4], body[5]
        items, rest = body[6 : 5 + size], body[5 + size :]
    elif ctor == 0xD0:  # list32: size (4), count (4), items
        size, count = struct.unpack(">II", body[4:12])
        items, rest = body[12 : 8 + size], body[8 + size :]
    else:
        return frame
    if count >= full and ctor != 0x45:
        return frame
    items += b"\x40" * max(0, full - count)
    count = max(count, full)
    new_body = bytes((0x00, 0x53, code, 0xD0)) + struct.pack(">II", len(items) + 4, count) + items + rest
    return struct.pack(">I", doff + len(new_body)) + frame[4:doff] + new_body


def _performative(frame: bytes) -> tuple[int, int, list[Any]] | None:
    """(channel, descriptor code, fields) of an AMQP (not SASL) frame, or None."""
    if frame[:4] == b"AMQP" or len(frame) <= 8 or frame[5] != 0:
        return None
    doff = frame[4] * 4
    channel = struct.unpack(">H", frame[6:8])[0]
    data = Data()
    data.decode(frame[doff:])
    data.rewind()
    data.next()
    obj = data.get_object()
    try:
        return channel, int(obj.descriptor), list(obj.value)
    except (AttributeError, TypeError, ValueError):
        return None


def _sections(raw: bytes) -> list[tuple[int, Any]]:
    """The sections of an encoded AMQP message, as (descriptor code, value)."""
    out: list[tuple[int, Any]] = []
    pos = 0
    while pos < len(raw):
        data = Data()
        used = data.decode(raw[pos:])
        if used <= 0:
            break
        pos += used
        data.rewind()
        data.next()
        obj = data.get_object()
        value = obj.value
        if isinstance(value, memoryview):  # it points into ``data``'s buffer: copy before it is freed
            value = value.tobytes()
        out.append((int(obj.descriptor), value))
    return out


# ------------------------------------------------------------------------------------------------ state


@dataclass
class StoredEvent:
    """One event as the peer stored it (what a consumer would read back)."""

    hub: str
    partition: str
    sequence_number: int
    offset: int
    enqueued_time: float  # epoch seconds, millisecond precision (the service's clock)
    arrived_at: float  # time.time() when the transfer carrying it was complete
    partition_key: str | None
    body: bytes
    properties: dict[str, Any]  # application properties
    content_type: str | None
    message_id: Any
    raw: bytes = field(repr=False)  # the event's encoded AMQP message, as the producer built it


@dataclass
class _Consumer:
    conn: _Conn
    link: Link
    hub: str
    partition: str
    next_index: int


class _Conn:
    """One accepted TCP connection: socket, proton transport and the frame inspection around it.

    Incoming frames are read here before proton sees them only to learn what proton does not expose:
    the message format of each transfer (batches are 0x80013700), per link.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.transport = Transport(Transport.SERVER)
        sasl = self.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.inbound = _FrameSplitter()
        self.outbound = _FrameSplitter()
        self.outbuf = bytearray()
        self.link_names: dict[tuple[int, int], str] = {}
        # link name -> message formats of its deliveries not yet complete, in transfer order (a link's
        # deliveries never interleave, and proton's Delivery.tag cannot be trusted with binary tags).
        self.formats: dict[str, deque[int]] = {}
        self.last_delivery_id: dict[str, int] = {}
        self.audiences: set[str] = set()
        self.tags = itertools.count(1)
        self.reply_links: dict[tuple[Session, str], Link] = {}  # (session, "$cbs"|"$management")
        self.outgoing: dict[Link, deque[bytes]] = {}  # encoded replies waiting for credit
        self.dead = False

    def inspect_incoming(self, data: bytes) -> None:
        for frame in self.inbound.feed(data):
            perf = _performative(frame)
            if perf is None:
                continue
            channel, code, fields = perf
            if code == _ATTACH and len(fields) > 1:
                self.link_names[(channel, int(fields[1]))] = str(fields[0])
            elif code == _TRANSFER and len(fields) > 3 and fields[1] is not None:
                name = self.link_names.get((channel, int(fields[0])))
                if name is not None and self.last_delivery_id.get(name) != int(fields[1]):
                    self.last_delivery_id[name] = int(fields[1])
                    self.formats.setdefault(name, deque()).append(int(fields[3] or 0))

    def pump_output(self) -> None:
        while True:
            pending = self.transport.pending()
            if pending <= 0:
                break
            chunk = self.transport.peek(pending)
            self.transport.pop(pending)
            if chunk:
                for unit in self.outbound.feed(chunk):
                    self.outbuf += pad_frame(unit)


def _entity(address: str | None) -> str:
    """``amqps://host:port/hub/Partitions/0`` -> ``hub/Partitions/0``; ``$cbs`` stays ``$cbs``."""
    if not address:
        return ""
    path = urlsplit(address).path if "://" in address else address
    return unquote(path.lstrip("/"))


_FILTER = re.compile(
    r"amqp\.annotation\.(x-opt-offset|x-opt-sequence-number|x-opt-enqueued-time)\s*(>=|>)\s*'([^']*)'"
)


class EventHubsPeer:
    """Serve Event Hubs over AMQP 1.0 on a loopback port, in a background thread.

    ``hubs`` maps hub name -> partition count. Tests read what was stored with :meth:`messages` and
    steer failures with :attr:`refuse_tokens` (answer 401 to every put-token) or ``keys`` (verify the
    SAS signature). State survives :meth:`stop`/:meth:`start`, like a real namespace's storage.
    """

    def __init__(
        self,
        hubs: dict[str, int] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        keys: dict[str, str] | None = None,
        max_message_size: int = 1024 * 1024,
    ) -> None:
        self.hubs: dict[str, int] = dict(hubs or {"hub": 2})
        self.host = host
        self.port = port
        self.keys = keys
        self.max_message_size = max_message_size
        self.refuse_tokens = False
        self.created_at = time.time()
        self._lock = threading.Lock()
        self._store: dict[tuple[str, str], list[StoredEvent]] = {}
        self._offsets: dict[tuple[str, str], int] = {}
        self._round_robin = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._conns: list[_Conn] = []
        self._consumers: list[_Consumer] = []
        self.accepted_connections = 0
        self.token_requests: list[tuple[str, int]] = []  # (audience, status) of every put-token
        self.errors: list[str] = []  # exceptions raised while handling AMQP events (should stay empty)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> EventHubsPeer:
        if self._thread is not None:
            raise RuntimeError("peer already running")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"eventhubs-peer-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Drop every connection without a goodbye and stop listening: the namespace is "down"."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> EventHubsPeer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return f"sb://{self.host}:{self.port}"

    def connection_string(self, hub: str = "hub", key_name: str = "K", key: str = "V") -> str:
        return (
            f"Endpoint={self.endpoint};SharedAccessKeyName={key_name};SharedAccessKey={key};"
            f"UseDevelopmentEmulator=true;EntityPath={hub}"
        )

    def messages(self, partition: str | None = None, hub: str = "hub") -> list[StoredEvent]:
        """Stored events of ``hub`` (one partition, or all of them ordered by arrival)."""
        with self._lock:
            if partition is not None:
                return list(self._store.get((hub, partition), []))
            out = [e for (h, _), events in self._store.items() if h == hub for e in events]
        return sorted(out, key=lambda e: (e.arrived_at, e.partition, e.sequence_number))

    # -- loop ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        assert self._listener is not None
        try:
            while not self._stop.is_set():
                self._step()
        finally:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.sock.close()
            self._conns.clear()
            self._consumers.clear()
            self._listener.close()
            self._listener = None

    def _step(self) -> None:
        assert self._listener is not None
        readers = [self._listener] + [c.sock for c in self._conns if c.transport.capacity() > 0]
        writers = [c.sock for c in self._conns if c.outbuf]
        try:  # writers only wake the loop up; every connection's output is tried each step anyway
            readable = select.select(readers, writers, [], 0.05)[0]
        except (OSError, ValueError):
            readable = []
        now = time.monotonic()
        if self._listener in readable:
            self._accept()
        for conn in list(self._conns):
            if conn.sock in readable:
                self._read(conn)
            conn.transport.tick(now)
            self._dispatch(conn)
        self._pump_consumers()
        for conn in list(self._conns):
            conn.pump_output()
            if conn.outbuf:  # non-blocking: send what the kernel takes now
                try:
                    sent = conn.sock.send(conn.outbuf)
                    del conn.outbuf[:sent]
                except BlockingIOError:
                    pass
                except OSError:
                    conn.dead = True
            if conn.dead or (conn.transport.closed and not conn.outbuf):
                self._drop(conn)

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conns.append(_Conn(sock))
        self.accepted_connections += 1

    def _read(self, conn: _Conn) -> None:
        capacity = conn.transport.capacity()
        if capacity <= 0:
            return
        try:
            data = conn.sock.recv(min(capacity, 65536))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            conn.transport.close_tail()
            conn.dead = conn.dead or conn.transport.pending() < 0
            return
        conn.inspect_incoming(data)
        conn.transport.push(data)

    def _drop(self, conn: _Conn) -> None:
        with contextlib.suppress(OSError):
            conn.sock.close()
        self._conns.remove(conn)
        self._consumers = [c for c in self._consumers if c.conn is not conn]

    # -- AMQP events ---------------------------------------------------------------------------------

    def _dispatch(self, conn: _Conn) -> None:
        while True:
            event = conn.collector.peek()
            if event is None:
                return
            try:
                self._on_event(conn, event)
            except Exception as exc:  # a peer bug must show in the test, not kill the loop
                log.exception("peer failed on %s", event.type)
                self.errors.append(f"{event.type}: {type(exc).__name__}: {exc}")
            finally:
                conn.collector.pop()

    def _on_event(self, conn: _Conn, event: Event) -> None:
        kind = event.type
        if kind == Event.CONNECTION_REMOTE_OPEN:
            event.connection.container = "eventhubs-test-peer"
            event.connection.open()
        elif kind == Event.SESSION_REMOTE_OPEN:
            event.session.open()
        elif kind == Event.LINK_REMOTE_OPEN:
            self._on_link_open(conn, event.link)
        elif kind == Event.LINK_FLOW:
            if event.link.is_sender:
                self._flush_replies(conn, event.link)
        elif kind == Event.DELIVERY:
            delivery = event.delivery
            if delivery.link.is_receiver:
                if delivery.readable and not delivery.partial:
                    self._on_message(conn, delivery.link, delivery)
            elif delivery.updated:
                delivery.settle()
        elif kind == Event.LINK_REMOTE_CLOSE:
            link = event.link
            self._consumers = [c for c in self._consumers if c.link != link]
            if link.state & Endpoint.LOCAL_ACTIVE:
                link.close()
        elif kind == Event.SESSION_REMOTE_CLOSE:
            if event.session.state & Endpoint.LOCAL_ACTIVE:
                event.session.close()
        elif kind == Event.CONNECTION_REMOTE_CLOSE and event.connection.state & Endpoint.LOCAL_ACTIVE:
            event.connection.close()

    def _refuse_link(self, link: Link, condition: str, description: str) -> None:
        link.open()
        link.condition = Condition(condition, description)
        link.close()

    def _on_link_open(self, conn: _Conn, link: Link) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if link.is_receiver:  # the client sends: $cbs/$management requests or events
            entity = _entity(link.remote_target.address)
            if entity in ("$cbs", "$management"):
                link.open()
                link.flow(100)
                return
            hub, _, rest = entity.partition("/")
            if hub not in self.hubs:
                return self._refuse_link(
                    link, "amqp:not-found", f"The messaging entity '{hub}' could not be found."
                )
            if rest and not re.fullmatch(r"Partitions/\d+", rest, re.IGNORECASE):
                return self._refuse_link(link, "amqp:not-found", f"Unknown entity path '{entity}'.")
            if self._audience(hub) not in conn.audiences:
                return self._refuse_link(link, "amqp:unauthorized-access", "Unauthorized access: no token.")
            link.max_message_size = self.max_message_size
            link.open()
            link.flow(300)
            return
        # The client receives: replies on $cbs/$management, or events on a consumer link.
        entity = _entity(link.remote_source.address)
        if entity in ("$cbs", "$management"):
            conn.reply_links[(link.session, entity)] = link
            link.open()
            return
        m = re.fullmatch(r"([^/]+)/ConsumerGroups/([^/]+)/Partitions/(\d+)", entity, re.IGNORECASE)
        if m is None or m.group(1) not in self.hubs:
            return self._refuse_link(
                link, "amqp:not-found", f"The messaging entity '{entity}' could not be found."
            )
        hub, group, partition = m.group(1), m.group(2), m.group(3)
        if int(partition) >= self.hubs[hub]:
            return self._refuse_link(link, "amqp:not-found", f"Partition {partition} does not exist.")
        if self._audience(hub, group) not in conn.audiences:
            return self._refuse_link(link, "amqp:unauthorized-access", "Unauthorized access: no token.")
        start = self._start_index(hub, partition, link.remote_source.filter)
        link.open()
        self._consumers.append(_Consumer(conn, link, hub, partition, start))

    @staticmethod
    def _audience(hub: str, group: str | None = None) -> str:
        """The entity part of a token audience, the part the service authorizes (the client names
        the namespace by whatever host:port it dialled, a proxy's included)."""
        return (f"{hub}/consumergroups/{group}" if group else hub).lower()

    def _start_index(self, hub: str, partition: str, filters: Data) -> int:
        """Where a consumer starts, from its selector filter (offset, sequence number or time)."""
        events = self.messages(partition, hub)
        expression = ""
        try:
            filters.rewind()
            if filters.next() is not None:
                value = filters.get_object()
                for key, described in dict(value or {}).items():
                    if str(key) == SELECTOR_FILTER:
                        expression = str(getattr(described, "value", described))
        except (AttributeError, TypeError, ValueError):
            expression = ""
        m = _FILTER.search(expression)
        if m is None:
            return len(events)  # no filter: from the end, like "@latest"
        annotation, op, raw = m.groups()
        if raw == "@latest":
            return len(events)
        value = int(raw)
        for index, event in enumerate(events):
            position = {
                "x-opt-offset": event.offset,
                "x-opt-sequence-number": event.sequence_number,
                "x-opt-enqueued-time": round(event.enqueued_time * 1000),
            }[annotation]
            if position > value or (op == ">=" and position == value):
                return index
        return len(events)

    # -- messages ------------------------------------------------------------------------------------

    def _on_message(self, conn: _Conn, link: Link, delivery: Delivery) -> None:
        raw = link.recv(delivery.pending) or b""
        link.advance()
        formats = conn.formats.get(link.name)
        fmt = formats.popleft() if formats else 0
        entity = _entity(link.remote_target.address)
        outcome = Delivery.ACCEPTED
        if not link.state & Endpoint.LOCAL_ACTIVE:
            pass  # sent before the client saw its link refused: dropped, like the service does
        elif entity == "$cbs":
            self._on_put_token(conn, link, raw)
        elif entity == "$management":
            self._on_management(conn, link, raw)
        else:
            hub, _, rest = entity.partition("/")
            partition = rest.rsplit("/", 1)[-1] if rest else None
            self._store_transfer(hub, partition, raw, fmt)
        delivery.update(outcome)
        delivery.settle()
        if link.credit < 50:
            link.flow(300 - link.credit)

    def _reply(
        self, conn: _Conn, link: Link, node: str, request: Message, status: int, desc: str, body: Any
    ) -> None:
        reply_link = conn.reply_links.get((link.session, node))
        if reply_link is None:
            return
        reply = Message(
            correlation_id=request.id,
            properties={"status-code": status, "status-description": desc},
            body=body,
        )
        conn.outgoing.setdefault(reply_link, deque()).append(bytes(reply.encode()))
        self._flush_replies(conn, reply_link)

    def _flush_replies(self, conn: _Conn, link: Link) -> None:
        queue = conn.outgoing.get(link)
        while queue and link.credit > 0:
            delivery = link.delivery(str(next(conn.tags)).encode())
            link.send(queue.popleft())
            link.advance()
            delivery.settle()

    def _check_token(self, token: str, audience: str) -> tuple[int, str]:
        if self.refuse_tokens:
            return 401, "InvalidSignature: The token has an invalid signature."
        if self.keys is None:
            return ACCEPTED, "Accepted"
        if not token.startswith("SharedAccessSignature "):
            return 401, "Malformed token."
        fields = {k: v[0] for k, v in parse_qs(token[len("SharedAccessSignature ") :]).items()}
        key = self.keys.get(fields.get("skn", ""))
        if key is None:
            return 401, "Unknown SharedAccessKeyName."
        signed = (quote_plus(fields.get("sr", "")) + "\n" + fields.get("se", "")).encode()
        expected = base64.b64encode(hmac.new(key.encode(), signed, hashlib.sha256).digest()).decode()
        if not hmac.compare_digest(expected, fields.get("sig", "")):
            return 401, "InvalidSignature: The token has an invalid signature."
        if int(fields.get("se", "0")) < time.time():
            return 401, "ExpiredToken."
        return ACCEPTED, "Accepted"

    def _on_put_token(self, conn: _Conn, link: Link, raw: bytes) -> None:
        request = Message()
        request.decode(raw)
        props = dict(request.properties or {})
        audience = str(props.get("name", ""))
        status, desc = self._check_token(str(request.body or ""), audience)
        self.token_requests.append((audience, status))
        if status < 300:
            path = urlsplit(audience).path if "://" in audience else audience
            conn.audiences.add(path.strip("/").lower())
        self._reply(conn, link, "$cbs", request, status, desc, None)

    def _on_management(self, conn: _Conn, link: Link, raw: bytes) -> None:
        request = Message()
        request.decode(raw)
        props = dict(request.properties or {})
        hub = str(props.get("name", ""))
        status, desc = self._check_token(str(props.get("security_token", "")), self._audience(hub))
        if status >= 300:
            return self._reply(conn, link, "$management", request, status, desc, None)
        if props.get("operation") != "READ":
            return self._reply(conn, link, "$management", request, 400, "Unsupported operation.", None)
        if hub not in self.hubs:
            return self._reply(
                conn,
                link,
                "$management",
                request,
                404,
                f"The messaging entity '{hub}' could not be found.",
                None,
            )
        if props.get("type") == "com.microsoft:partition":
            partition = str(props.get("partition", ""))
            if not partition.isdigit() or int(partition) >= self.hubs[hub]:
                return self._reply(conn, link, "$management", request, 404, "Partition not found.", None)
            events = self.messages(partition, hub)
            last = events[-1] if events else None
            body = {
                "name": hub,
                "type": "com.microsoft:partition",
                "partition": partition,
                "begin_sequence_number": events[0].sequence_number if events else 0,
                "last_enqueued_sequence_number": last.sequence_number if last else -1,
                "last_enqueued_offset": str(last.offset if last else -1),
                "last_enqueued_time_utc": timestamp(int((last.enqueued_time if last else 0) * 1000)),
                "is_partition_empty": not events,
            }
        else:
            body = {
                "name": hub,
                "type": "com.microsoft:eventhub",
                "created_at": timestamp(int(self.created_at * 1000)),
                "partition_count": self.hubs[hub],
                "partition_ids": Array(UNDESCRIBED, Data.STRING, *[str(i) for i in range(self.hubs[hub])]),
            }
        self._reply(conn, link, "$management", request, 200, "OK", body)

    def _store_transfer(self, hub: str, partition: str | None, raw: bytes, fmt: int) -> None:
        arrived = time.time()
        if fmt == BATCH_FORMAT:
            sections = _sections(raw)
            annotations = next((v for code, v in sections if code == _MESSAGE_ANNOTATIONS), None) or {}
            key = annotations.get(symbol("x-opt-partition-key"))
            inner = [bytes(v) for code, v in sections if code == _DATA]
        else:
            message = Message()
            message.decode(raw)
            key = (message.annotations or {}).get(symbol("x-opt-partition-key"))
            inner = [raw]
        if partition is None:
            count = self.hubs[hub]
            if key is not None:
                partition = str(zlib.crc32(str(key).encode()) % count)
            else:
                partition = str(next(self._round_robin) % count)
        with self._lock:
            events = self._store.setdefault((hub, partition), [])
            for encoded in inner:
                message = Message()
                message.decode(encoded)
                body = message.body
                if isinstance(body, memoryview):
                    body = body.tobytes()
                elif isinstance(body, str):
                    body = body.encode()
                offset = self._offsets.get((hub, partition), 0)
                self._offsets[(hub, partition)] = offset + len(encoded)
                events.append(
                    StoredEvent(
                        hub=hub,
                        partition=partition,
                        sequence_number=len(events),
                        offset=offset,
                        enqueued_time=round(arrived, 3),
                        arrived_at=arrived,
                        partition_key=None if key is None else str(key),
                        body=bytes(body or b""),
                        properties=dict(message.properties or {}),
                        content_type=message.content_type,
                        message_id=message.id,
                        raw=encoded,
                    )
                )

    def _pump_consumers(self) -> None:
        for consumer in list(self._consumers):
            link = consumer.link
            if not link.state & Endpoint.LOCAL_ACTIVE:
                continue
            with self._lock:
                events = self._store.get((consumer.hub, consumer.partition), [])
                ready = events[consumer.next_index : consumer.next_index + max(0, link.credit)]
            for event in ready:
                message = Message()
                message.decode(event.raw)
                annotations = dict(message.annotations or {})
                annotations[symbol("x-opt-sequence-number")] = event.sequence_number
                annotations[symbol("x-opt-offset")] = str(event.offset)
                annotations[symbol("x-opt-enqueued-time")] = timestamp(int(event.enqueued_time * 1000))
                if event.partition_key is not None:
                    annotations[symbol("x-opt-partition-key")] = event.partition_key
                message.annotations = annotations
                delivery = link.delivery(str(next(consumer.conn.tags)).encode())
                link.send(bytes(message.encode()))
                link.advance()
                if link.remote_snd_settle_mode == Link.SND_SETTLED:
                    delivery.settle()
                consumer.next_index += 1


__all__ = ["BATCH_FORMAT", "EventHubsPeer", "StoredEvent", "pad_frame"]
