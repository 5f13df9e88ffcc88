"""Listen addresses, loopback checks and HTTP over a Unix socket: a leaf module, so sinks and
services can ask without importing the configuration (which knows about every layer)."""

from __future__ import annotations

import http.client
import ipaddress
import socket


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port). (``unix:/path`` is handled by the callers.)"""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:8710")
    host = host.strip("[]")
    if not 0 <= int(port) <= 65535:
        raise ValueError("port must be 0-65535")
    return host, int(port)


def host_name(host_header: str) -> str:
    """The name a ``Host`` header gives, lower-cased, without its port (``[::1]:8710`` -> ``[::1]``):
    what the agent's and the console's DNS-rebinding checks compare with their own names."""
    name = host_header.strip().lower()
    if name.startswith("["):
        return name[: name.find("]") + 1] if "]" in name else name
    return name.rpartition(":")[0] if name.count(":") == 1 else name


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8, ``::1``, and IPv4 loopback seen through a dual-stack listener
    (``::ffff:127.0.0.1``, which is what a ``[::]`` listener reports for a 127.0.0.1 client)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (``unix:/path`` listeners; ``requests`` speaks TCP only)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock
