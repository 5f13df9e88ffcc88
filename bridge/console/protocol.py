"""The console's HTTP connections, bounded like the agent's listener (issue 31, finding 9).

uvicorn's HTTP/1.1 protocol gives a fresh connection all the time in the world: no deadline before
its first request, none while a request trickles in (its keep-alive timeout is cancelled by the
first byte of the next request). 1 200 idle or slowloris connections pinned the console's 1 024
file descriptors for good and its ``/healthz`` failed. This protocol adds, around uvicorn's own:

* a **request deadline**: from the connection's start, and again after each response, the whole
  request (headers and body) must arrive within ``REQUEST_TIMEOUT`` seconds, else the connection
  is closed. A request fully received (a page following the live stream, a decision being
  published) is never cut by it;
* a **connection budget**: beyond ``MAX_CONNECTIONS`` open connections, a new one gets
  ``TRIAGE_TIMEOUT`` (a probe or a page asks at once; an idle socket is gone within a second), so
  descriptors are bounded by the budget plus a second's worth of new connections, and the
  platform's probes are still answered during a flood.

Headers are bounded by uvicorn's ``h11_max_incomplete_event_size``, bodies by the app (a declared
length over the cap is refused before anything is read: :mod:`bridge.console.app`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: Seconds a connection has to deliver a whole request (the agent's listener: 10 s).
REQUEST_TIMEOUT = 10.0
#: Connections served with the full deadline; beyond them, a new one gets TRIAGE_TIMEOUT.
MAX_CONNECTIONS = 256
TRIAGE_TIMEOUT = 1.0
#: Headers of one request, at most (uvicorn's h11 setting).
MAX_HEADER_BYTES = 32 * 1024


class BoundedH11Protocol(H11Protocol):
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # The console binds its own socket (IPPROTO 0), so asyncio leaves Nagle on for the connections
        # it accepts: uvicorn writes a response's headers and body apart, and every request after the
        # first on a kept-alive connection waited ~44 ms for the browser's delayed ACK (every page
        # load: /api/me, /api/fleet, each page of events; bench/console_bench.py).
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        crowded = len(self.connections) > MAX_CONNECTIONS
        self._arm(TRIAGE_TIMEOUT if crowded else REQUEST_TIMEOUT)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm(REQUEST_TIMEOUT)  # the next request on this connection has its own deadline

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.conn.their_state is h11.DONE:
            return  # the whole request arrived: the app answers (or streams) at its own pace
        if not self.transport.is_closing():
            self.transport.close()
