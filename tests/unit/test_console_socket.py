"""The console's connections send at once (found by bench/console_bench.py: every request after the
first on a kept-alive connection took ~44 ms, /healthz included: uvicorn writes a response's headers
and body apart, and with Nagle on the body waited for the client's delayed ACK)."""

from __future__ import annotations

import asyncio
import socket

from bridge.console.service import _bind


def test_the_connections_the_console_accepts_have_nagle_off() -> None:
    async def accepted_nodelay() -> int:
        found: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                found.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        listening = _bind("127.0.0.1", 0)
        server = await asyncio.get_running_loop().create_server(Probe, sock=listening)
        with socket.create_connection(listening.getsockname()[:2]):
            value = await asyncio.wait_for(found, 5)
        server.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0
