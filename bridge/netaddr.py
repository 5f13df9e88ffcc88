"""Listen addresses and loopback checks: a leaf module, so sinks and services can ask without
importing the configuration (which knows about every layer)."""

from __future__ import annotations

import ipaddress


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port). (``unix:/path`` is handled by the callers.)"""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:8710")
    host = host.strip("[]")
    if not 0 <= int(port) <= 65535:
        raise ValueError("port must be 0-65535")
    return host, int(port)


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
