"""``se-bridge``: the agent, the IMDS emulator, the demo and the record validator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bridge import __version__
from bridge.config import AGENT_SETTINGS, ENV_PREFIX, ConfigError

DESCRIPTION = """\
Forward Azure IMDS Scheduled Events (Freeze, Reboot, Redeploy, Preempt, Terminate) from this VM to
durable destinations, one normalized JSON record per document change, at least once.
"""

AGENT_EPILOG = f"""\
Every flag can also be set in the TOML file given by --config (keys as the flag names with '_',
at the top level or in an [agent] table) or in an environment variable {ENV_PREFIX}<NAME>.
Precedence: flag > environment > file > default.

Sinks:
  file:///var/log/se-bridge/records.jsonl   append one record per line, fsync before confirming
  stdout:                                    one record per line on standard output

Examples:
  se-bridge agent --sink file:///var/log/se-bridge/records.jsonl --state-dir /var/lib/se-bridge
  se-bridge agent --imds-url http://127.0.0.1:8080 --sink stdout: --state-dir /tmp/se --poll-interval 0.5

Signals: SIGTERM or SIGINT stops polling, delivers what is queued (up to --shutdown-timeout), exits 0.
Exit codes: 0 stopped cleanly, 2 configuration refused.
"""


def build_parser() -> argparse.ArgumentParser:
    from bridge.config import add_arguments

    parser = argparse.ArgumentParser(
        prog="se-bridge", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"se-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    agent = sub.add_parser(
        "agent",
        help="poll IMDS and forward every document change to the sinks",
        description="Poll IMDS Scheduled Events and forward every change, durably, to the configured sinks.",
        epilog=AGENT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(agent, AGENT_SETTINGS)

    simulate = sub.add_parser(
        "simulate",
        help="run the IMDS Scheduled Events emulator (for tests, demos and labs)",
        description="A faithful IMDS Scheduled Events emulator with real and accelerated scenarios, "
        "fault injection and a control API (see docs/emulator.md).",
    )
    from bridge.imds.emulator.cli import add_arguments as add_emulator_arguments

    add_emulator_arguments(simulate)

    demo = sub.add_parser(
        "demo",
        help="run emulator + agent + file sink on accelerated scenarios for about a minute",
        description="End-to-end demo on this machine, no cloud account: the IMDS emulator plays every "
        "scenario at 60x speed, the agent forwards each change to a JSONL file, and each change is "
        "printed as it happens.",
    )
    demo.add_argument("--output", default="demo-output", metavar="DIR", help="where records and logs go")
    demo.add_argument("--speed", type=float, default=60.0, help="emulator time acceleration (default 60)")
    demo.add_argument("--scenario", default="tour", help="emulator scenario to play (default: tour)")

    validate = sub.add_parser(
        "validate",
        help="validate records (JSON or JSONL files) against the schemas",
        description="Validate each record in the given files (JSON Lines, or one JSON document) against "
        "the JSON Schema of its recordType. Exit 0 when every record is valid, 1 otherwise.",
    )
    validate.add_argument("files", nargs="+", type=Path, metavar="FILE")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "agent":
            return _agent(args)
        if args.command == "simulate":
            from bridge.imds.emulator.cli import run

            return run(args)
        if args.command == "demo":
            from bridge.demo import run_demo

            return run_demo(Path(args.output), speed=args.speed, scenario=args.scenario)
        if args.command == "validate":
            return _validate(args.files)
    except ConfigError as err:
        print(f"se-bridge: configuration refused: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


def _agent(args: argparse.Namespace) -> int:
    from bridge.config import load_agent_config
    from bridge.observability import setup_logging

    config = load_agent_config(args)
    setup_logging(config.log_level)
    from bridge.agent.service import Agent

    return Agent(config).run()


def _validate(files: list[Path]) -> int:
    from bridge.schemas import validate_record

    total = bad = 0
    for file in files:
        try:
            data = file.read_bytes()
        except OSError as exc:
            print(f"{file}: cannot read: {exc.strerror}", file=sys.stderr)
            bad += 1
            continue
        for where, record in _records_in(data):
            total += 1
            errors = validate_record(record) if not isinstance(record, Exception) else [f"not JSON: {record}"]
            if errors:
                bad += 1
                for error in errors:
                    print(f"{file}:{where}: {error}")
    print(f"{total - bad} valid, {bad} invalid, {total} records")
    return 0 if bad == 0 and total > 0 else 1


def _records_in(data: bytes) -> list[tuple[int, object]]:
    """(line number, record or parse error) for a JSON Lines file, a JSON document or a JSON array."""
    import orjson

    try:
        whole = orjson.loads(data)
    except orjson.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        return [(1, whole)]
    if isinstance(whole, list):
        return list(enumerate(whole, 1))
    out: list[tuple[int, object]] = []
    for number, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                out.append((number, orjson.loads(line)))
            except orjson.JSONDecodeError as exc:
                out.append((number, exc))
    return out


if __name__ == "__main__":
    sys.exit(main())
