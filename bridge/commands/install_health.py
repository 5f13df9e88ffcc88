"""Wait until every service an installed ``config.toml`` enables answers ``/healthz``.

The installers (deploy/linux/install.sh, deploy/windows/install.ps1) run
``<venv>/bin/python -m bridge.commands.install_health <config.toml>`` after (re)starting the services,
so the VM extension fails when a service does not come up: an approver that exits at start (a configuration
its loader refuses, a topology that would lose decisions) used to be restarted every 5 s for ever
while the extension reported success, because only the agent was probed.

The addresses come from the services' own loaders (what the services listen on): the agent's
``listen`` (unless the file is a central VM's, with no agent), the approver's when the ``[approver]``
table has a ``source``, and Azure's channel's when ``[azure_channel]`` has one. A wildcard listener is
probed on loopback (``0.0.0.0`` -> ``127.0.0.1``, ``::`` -> ``::1``: Windows cannot connect to the
wildcard address), a ``unix:`` one over its socket; ``off`` cannot be probed and is reported so.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path

from bridge.agent.config import load_agent_config
from bridge.approver.config import load_approver_config
from bridge.azure.config import load_azure_channel_config
from bridge.commands.install_config import enabled
from bridge.http.netaddr import UnixHTTPConnection, parse_listen
from bridge.settings import ConfigError

_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def enabled_listeners(config: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{service: listen address}`` of every service the file enables ("" when it has none), with
    the ``SE_BRIDGE_*`` overrides of ``environ`` (the installer's environment) applied."""
    args = argparse.Namespace(config=str(config))
    env = os.environ if environ is None else environ
    on = enabled(tomllib.loads(config.read_text()))
    out: dict[str, str] = {}
    if "agent" in on:
        out["agent"] = load_agent_config(args, environ=env).listen
    if "approver" in on:
        out["approver"] = load_approver_config(args, environ=env).listen
    if "azure_channel" in on:
        out["azure-channel"] = load_azure_channel_config(args, environ=env).listen
    return out


def healthy(listen: str, timeout: float = 3.0) -> bool:
    """Whether ``GET /healthz`` on ``listen`` answers 200 now."""
    if listen.startswith("unix:"):
        conn: http.client.HTTPConnection = UnixHTTPConnection(listen[len("unix:") :], timeout)
    else:
        host, port = parse_listen(listen)
        conn = http.client.HTTPConnection(_WILDCARDS.get(host, host), port, timeout=timeout)
    try:
        conn.request("GET", "/healthz", headers={"Host": "localhost"})
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def wait(listeners: dict[str, str], timeout: float) -> list[str]:
    """The services still not healthy after ``timeout`` seconds (an empty list: all are)."""
    pending = {name: listen for name, listen in listeners.items() if listen}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for name in [n for n, listen in pending.items() if healthy(listen)]:
            print(f"se-bridge-install: {name} healthy on {pending.pop(name)}")
        if pending:
            time.sleep(1.0)
    return sorted(pending)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bridge.commands.install_health", description=__doc__)
    parser.add_argument("config", type=Path)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    try:
        listeners = enabled_listeners(args.config)
    except ConfigError as exc:
        print(f"se-bridge-install: {args.config}: {exc}", file=sys.stderr)
        return 2
    for name, listen in listeners.items():
        if not listen:
            print(f"se-bridge-install: {name} has no listener (listen = off): not checked")
    failed = wait(listeners, args.timeout)
    for name in failed:
        print(
            f"se-bridge-install: the {name} did not become healthy within {args.timeout:g} s "
            f"(GET /healthz on {listeners[name]})",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
