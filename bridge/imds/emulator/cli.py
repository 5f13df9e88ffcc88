"""Command line of the emulator, shared by ``python -m bridge.imds.emulator`` and ``se-bridge simulate``.

``add_arguments``/``run`` are split so the project CLI can mount the same flags on its own sub-command.
The first stdout line is a JSON object with the URL, flushed at once, so a parent process started with
``--port 0`` can read the port it got.
"""

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

import orjson

from .fleet import fleet_profiles
from .profile import DEFAULT_VMSS_INSTANCE, DEFAULT_VMSS_NAME, VmProfile
from .scenarios import SCENARIOS
from .server import EmulatorServer

ACCELERATED_SPEED = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the emulator's flags to ``parser``."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8080, help="port to listen on, 0 = any free port (default 8080)"
    )
    parser.add_argument(
        "--scenario",
        default="idle",
        choices=list(SCENARIOS),
        metavar="NAME",
        help="scenario to start with (default idle; see --list-scenarios)",
    )
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="time acceleration: scenario durations are divided by it (default 1)",
    )
    speed.add_argument(
        "--accelerated",
        action="store_const",
        const=ACCELERATED_SPEED,
        dest="speed",
        help="same as --speed 60: a 15-minute notice lasts 15 s",
    )
    parser.add_argument(
        "--rate-limit",
        type=float,
        default=5.0,
        help="IMDS requests allowed per sliding second before 429; 0 disables (default 5)",
    )
    parser.add_argument(
        "--approval-delay",
        type=float,
        default=1.0,
        help="seconds (scaled by speed) from an approval POST to Started (default 1)",
    )
    parser.add_argument(
        "--initial-incarnation", type=int, default=1, help="first DocumentIncarnation (default 1)"
    )
    parser.add_argument(
        "--vm-name", default=None, help="name of a standalone emulated VM (default vm-bridge-0)"
    )
    parser.add_argument(
        "--vmss-name",
        default=None,
        help=f"emulate an instance of this scale set (compute.name <vmss>_<N>; terminate defaults to "
        f"{DEFAULT_VMSS_NAME})",
    )
    parser.add_argument(
        "--instance-id",
        type=int,
        default=None,
        help=f"scale-set instance index (default {DEFAULT_VMSS_INSTANCE}); implies a scale-set profile",
    )
    parser.add_argument(
        "--private-ip",
        default=None,
        help="the VM's private IP in /metadata/instance (default 10.0.0.4; fleet tests use loopback ones)",
    )
    parser.add_argument(
        "--fleet",
        type=int,
        default=0,
        metavar="N",
        help="serve N VMs under /vm/<name>/ with availability-set semantics (docs/emulator.md, 'Fleets')",
    )
    parser.add_argument(
        "--fleet-prefix", default="fleet-vm-", help="name prefix of the fleet's VMs (default fleet-vm-)"
    )
    parser.add_argument(
        "--fleet-first-ip",
        default="127.0.1.1",
        help="private IP of the first fleet VM, the others follow (default 127.0.1.1: loopback, so one "
        "machine can host every VM's agent)",
    )
    parser.add_argument(
        "--hold-until-served",
        action="store_true",
        help="a timed transition waits until the current document was served once, so a polling client "
        "sees every state at any speed (demos and tests; real IMDS keeps states for minutes)",
    )
    parser.add_argument("--list-scenarios", action="store_true", help="print the scenarios and exit")
    parser.add_argument(
        "--log-requests",
        action="store_true",
        help="log one JSON line per IMDS request to stderr (DEBUG level; off by default)",
    )


def _profile(args: argparse.Namespace) -> VmProfile | None:
    if args.vm_name and (args.vmss_name or args.instance_id is not None):
        raise ValueError("use either --vm-name or --vmss-name/--instance-id")
    extra = {"private_ip": args.private_ip} if args.private_ip else {}
    if args.vmss_name or args.instance_id is not None:
        instance = DEFAULT_VMSS_INSTANCE if args.instance_id is None else args.instance_id
        return VmProfile.scale_set(args.vmss_name or DEFAULT_VMSS_NAME, instance, **extra)
    if args.vm_name or extra:
        return VmProfile(name=args.vm_name or "vm-bridge-0", **extra)
    return None  # let the scenario pick (terminate -> scale-set instance)


def _list_scenarios(speed: float) -> None:
    print(f"{'scenario':<24}{'real':>8}{'x' + format(speed, 'g'):>10}  summary")
    for name, scenario in SCENARIOS.items():
        real = scenario.length
        print(f"{name:<24}{real:>7.0f}s{real / speed:>9.1f}s  {scenario.summary}")


def run(args: argparse.Namespace) -> int:
    """Serve in the foreground until SIGTERM or SIGINT; return the process exit code (0 on a clean stop)."""
    if args.list_scenarios:
        _list_scenarios(args.speed if args.speed != 1.0 else ACCELERATED_SPEED)
        return 0
    if args.log_requests:
        emulator_logger = logging.getLogger("bridge.imds.emulator")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        emulator_logger.addHandler(handler)
        emulator_logger.setLevel(logging.DEBUG)
    try:
        fleet = fleet_profiles(args.fleet, args.fleet_prefix, args.fleet_first_ip) if args.fleet else None
        server = EmulatorServer(
            host=args.host,
            port=args.port,
            scenario=args.scenario,
            speed=args.speed,
            rate_limit=args.rate_limit,
            vm=None if fleet else _profile(args),
            approval_delay=args.approval_delay,
            initial_incarnation=args.initial_incarnation,
            fleet=fleet,
            hold_until_served=args.hold_until_served,
        ).start()
    except (ValueError, OSError) as exc:
        print(orjson.dumps({"msg": "emulator failed to start", "error": str(exc)}).decode(), file=sys.stderr)
        return 2

    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _on_signal)
    line: dict[str, object] = {
        "msg": "emulator listening",
        "url": server.url,
        "scenario": args.scenario,
        "speed": args.speed,
        "vm": server.vm.compute_name,
    }
    if server.fleet is not None:
        line["fleet"] = [
            {"name": name, "url": server.vm_url(name), "privateIp": state.vm.private_ip}
            for name, state in server.fleet.states.items()
        ]
    sys.stdout.write(orjson.dumps(line).decode() + "\n")
    sys.stdout.flush()
    try:
        # A timed wait keeps the main thread responsive to signals on every platform; 1 s is not a busy loop.
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        for sig, handler_ in previous.items():
            signal.signal(sig, handler_)
    return 0
