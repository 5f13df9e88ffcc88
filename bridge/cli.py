"""``se-bridge``: the agent, the IMDS emulator, the demo and the record validator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bridge import __version__
from bridge.agent.config import AgentConfig
from bridge.approver.config import ApproverConfig
from bridge.azure.config import AzureChannelConfig
from bridge.console.config import ConsoleConfig
from bridge.settings import ConfigError

DESCRIPTION = """\
Forward Azure IMDS Scheduled Events (Freeze, Reboot, Redeploy, Preempt, Terminate) from this VM to
durable destinations, one normalized JSON record per document change, at least once.
"""

AGENT_EPILOG = f"""\
Every flag can also be set in the TOML file given by --config (keys as the flag names with '_',
at the top level or in an [agent] table) or in an environment variable {AgentConfig.env_prefix}<NAME>.
Precedence: flag > environment > file > default.

Sinks (details and every option: README.md and docs/sink-*.md):
  file:///var/log/se-bridge/records.jsonl            one record per line, fsync before confirming
  stdout:                                             one record per line on standard output
  kafka://broker:9092/topic[?options]                 idempotent producer, key = vmId
  eventhubs://<ns>.servicebus.windows.net/<hub>[?..]  managed identity by default
  https://host/path[?query][#options]                 webhook: JSON, CloudEvents or Event Grid, HMAC

Examples:
  se-bridge agent --sink file:///var/log/se-bridge/records.jsonl --state-dir /var/lib/se-bridge
  se-bridge agent --imds-url http://127.0.0.1:8080 --sink stdout: --state-dir /tmp/se --poll-interval 0.5

Signals: SIGTERM or SIGINT stops polling, delivers what is queued (up to --shutdown-timeout), exits 0.
Exit codes: 0 stopped cleanly, 2 configuration refused.
"""


APPROVER_EPILOG = f"""\
Every flag can also be set in the [approver] table of the TOML file given by --config, or in an
environment variable {ApproverConfig.env_prefix}<NAME>. Precedence: flag > environment > file > default.

Examples (the relay key is the file the agent's --relay-key names; make one with
head -c 32 /dev/urandom | base64 > relay.key; docs/approvals.md walks through a whole local setup):
  se-bridge approver --source kafka://10.0.0.5:9092/decisions --key ops1=/etc/se-bridge/ops1.key \\
      --relay-key relay=/etc/se-bridge/relay.key --sink kafka://10.0.0.5:9092/events \\
      --state-dir /var/lib/se-bridge/approver
  se-bridge approver --source file:///tmp/decisions.jsonl --key k1=/tmp/k1.key --sink stdout: \\
      --relay http://127.0.0.1:8710 --relay-key relay=/tmp/relay.key --state-dir /tmp/approver

Decisions must be signed (HMAC-SHA256 over their canonical JSON; see docs/approvals.md); unsigned,
expired, replayed or unknown-key decisions are refused and audited, never relayed.
"""


CONSOLE_EPILOG = f"""\
Every flag can also be set in the [console] table of the TOML file given by --config, or in an
environment variable {ConsoleConfig.env_prefix}<NAME>. Needs the 'console' extra.

Examples:
  se-bridge console --auth entra --approver-role Maintenance.Approve \\
      --events-source 'eventhubs://ns.servicebus.windows.net/se-records?consumer_group=console' \\
      --sink 'eventhubs://ns.servicebus.windows.net/se-decisions?credential=managed' \\
      --key console=https://vault.vault.azure.net/secrets/console-key --listen 0.0.0.0:8720
  se-bridge console --auth lab --events-source file:///tmp/records.jsonl \\
      --sink file:///tmp/decisions.jsonl --key console=/tmp/console.key --state-dir /tmp/console
"""


AZURE_EPILOG = f"""\
Every flag can also be set in the [azure_channel] table of the TOML file given by --config, or in an
environment variable {AzureChannelConfig.env_prefix}<NAME>. Needs the 'eventhubs' extra for eventhubs://.

Examples:
  NS=eventhubs://ns.servicebus.windows.net
  se-bridge azure-channel --listen 0.0.0.0:8730 \\
      --source "$NS/se-azure-events?credential=managed&consumer_group=azure-channel&checkpoint_url=$BLOB" \\
      --events-source "$NS/se-records?credential=managed" --sink "$NS/se-records?credential=managed"
  se-bridge azure-channel --source file:///tmp/event-grid.jsonl --events-source file:///tmp/records.jsonl \\
      --sink file:///tmp/azure.jsonl --state-dir /tmp/azure-channel --grace 60
"""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; ``command`` (the sub-command about to run) lets heavy sub-parsers load lazily."""
    from bridge.settings import add_arguments

    parser = argparse.ArgumentParser(
        prog="se-bridge", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"se-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.set_defaults(subcommands=sub.choices)  # each sub-command's parser, for its own errors

    agent = sub.add_parser(
        "agent",
        help="poll IMDS and forward every document change to the sinks",
        description="Poll IMDS Scheduled Events and forward every change, durably, to the configured sinks.",
        epilog=AGENT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(agent, AgentConfig)

    simulate = sub.add_parser(
        "simulate",
        help="run the IMDS Scheduled Events emulator (for tests, demos and labs)",
        description="A faithful IMDS Scheduled Events emulator with real and accelerated scenarios, "
        "fault injection and a control API (see docs/emulator.md).",
    )
    if command == "simulate":  # the emulator is imported only when it runs, never by the agent
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
    demo.add_argument(
        "--console",
        action="store_true",
        help="instead: keep a fleet of three VMs, their agents, the fleet approver and the ops console "
        "running, for a person to open the console and approve (Ctrl-C stops them)",
    )

    approver = sub.add_parser(
        "approver",
        help="carry signed decisions from a topic to IMDS through the agent's relay API",
        description="Consume decisions (Kafka, Event Hubs, a file or stdin), refuse anything not proven "
        "valid (schema, signature, issuer, expiry, replay), relay the rest to the agent that posts the "
        "StartRequest, and publish every outcome as an audit record.",
        epilog=APPROVER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(approver, ApproverConfig)

    console = sub.add_parser(
        "console",
        help="serve the ops console: the fleet's maintenance, live, and approvals (docs/console.md)",
        description="A web console for ops teams: every VM and its pending events from the events stream, "
        "each event's timeline and audit, history, and signed approvals published to the decisions topic. "
        "Runs behind Entra ID (--auth entra or oauth2-proxy), or --auth lab.",
        epilog=CONSOLE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(console, ConsoleConfig)

    azure = sub.add_parser(
        "azure-channel",
        help="read Azure's own Scheduled Events channel (Event Grid) and reconcile it with the agents' "
        "records (docs/azure-channel.md)",
        description="Publish every Scheduled Event Azure itself reports (Event Grid system topic "
        "Microsoft.ResourceNotifications.MaintenanceResources delivered to an Event Hub), deduplicated, "
        "as azureScheduledEvent records, and the findings of joining them with the agents' records: "
        "VMs nobody watches (unwatched), how each event ended (outcome), events only agents saw (agentOnly).",
        epilog=AZURE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(azure, AzureChannelConfig)

    decide = sub.add_parser(
        "decide",
        help="publish one signed approval decision (the ops tool)",
        description="Build, sign and publish one decision to the decisions topic. Exits non-zero with a "
        "message when it cannot publish.",
    )
    decide.add_argument(
        "--sink", required=True, metavar="SPEC", help="the decisions topic (same specs as sinks)"
    )
    decide.add_argument("--event-id", required=True, help="EventId of the scheduled event to approve")
    decide.add_argument("--target", required=True, help="the VM (vm.name or vm.vmId of the event record)")
    decide.add_argument(
        "--key-id", required=True, help="id of the signing key, as configured in the approver"
    )
    decide.add_argument(
        "--key-file",
        required=True,
        type=Path,
        help="the signing key: an Ed25519 private key (PEM, se-bridge keygen), or a shared HMAC key "
        "during a migration (agents act only on Ed25519 decisions)",
    )
    decide.add_argument("--reason", help="why (kept in the audit trail)")
    decide.add_argument(
        "--ttl", type=float, default=900.0, help="seconds the decision stays valid (default 900)"
    )
    decide.add_argument("--issued-by", default=None, help="issuer name (default: user@host)")
    decide.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the sink to confirm")

    keygen = sub.add_parser(
        "keygen",
        help="write a new Ed25519 key pair for signing decisions",
        description="Write PREFIX.key (the private key, mode 0600: for a signer: the console, decide, the "
        "signer Function, a coordinating fleet approver) and PREFIX.pub (the public key: for agents' "
        "--decision-key and approvers' --key). Refuses to overwrite.",
    )
    keygen.add_argument("prefix", type=Path, metavar="PREFIX", help="path without extension, e.g. keys/ops")

    validate = sub.add_parser(
        "validate",
        help="validate records (JSON or JSONL files) against the schemas",
        description="Validate each record in the given files (JSON Lines, or one JSON document) against "
        "the JSON Schema of its recordType. Exit 0 when every record is valid, 1 otherwise.",
    )
    validate.add_argument("files", nargs="+", type=Path, metavar="FILE")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the sub-command's parser: its usage, not the top level's, is the help
        args.subcommands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return _COMMANDS[args.command](args)
    except ConfigError as err:
        print(f"se-bridge: configuration refused: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `se-bridge demo | head`: the reader left, nothing to report
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 2


def _simulate(args: argparse.Namespace) -> int:
    from bridge.imds.emulator.cli import run

    return run(args)


def _decide(args: argparse.Namespace) -> int:
    from bridge.commands.decide import decide

    return decide(args)


def _keygen(args: argparse.Namespace) -> int:
    import os

    from bridge.decisions import generate_key_pair

    private, public = generate_key_pair()
    key_file, pub_file = args.prefix.with_suffix(".key"), args.prefix.with_suffix(".pub")
    try:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(private)
        with open(pub_file, "xb") as out:
            out.write(public)
    except OSError as exc:
        print(f"se-bridge keygen: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"private key: {key_file} (keep it with the signer only)\npublic key:  {pub_file}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.console:
        from bridge.commands.demo_console import run_console_demo

        return run_console_demo(Path(args.output) / "console")
    from bridge.commands.demo import run_demo
    from bridge.imds.emulator.scenarios import SCENARIOS

    if args.scenario not in SCENARIOS:  # a typo: one line, not a traceback (issue 33)
        raise ConfigError(
            f"scenario: no scenario {args.scenario[:64]!r} (known: {', '.join(sorted(SCENARIOS))})"
        )
    return run_demo(Path(args.output), speed=args.speed, scenario=args.scenario)


def _agent(args: argparse.Namespace) -> int:
    from bridge.agent.config import load_agent_config
    from bridge.support.observability import setup_logging

    config = load_agent_config(args)
    setup_logging(config.log_level)
    from bridge.agent.service import Agent

    return Agent(config).run()


def _approver(args: argparse.Namespace) -> int:
    from bridge.approver.config import load_approver_config
    from bridge.support.observability import setup_logging

    config = load_approver_config(args)
    setup_logging(config.log_level)
    from bridge.approver.build import build_approver

    return build_approver(config).run()


def _console(args: argparse.Namespace) -> int:
    from bridge.console.config import load_console_config
    from bridge.support.observability import setup_logging

    config = load_console_config(args)
    setup_logging(config.log_level)
    try:
        from bridge.console.service import main as console_main
    except ImportError as exc:
        raise ConfigError(
            f"the console needs the 'console' extra (pip install 'scheduled-events-bridge[console]'): {exc}"
        ) from None
    return console_main(config)


def _azure_channel(args: argparse.Namespace) -> int:
    from bridge.azure.config import load_azure_channel_config
    from bridge.azure.service import build
    from bridge.support.observability import setup_logging

    config = load_azure_channel_config(args)
    setup_logging(config.log_level)
    return build(config).run()


def _validate(files: list[Path]) -> int:
    from bridge.schemas import validate_record

    total = bad = unreadable = 0
    for file in files:
        try:
            data = file.read_bytes()
        except OSError as exc:
            print(f"{file}: cannot read: {exc.strerror}", file=sys.stderr)
            unreadable += 1
            continue
        for where, record in _records_in(data):
            total += 1
            errors = validate_record(record) if not isinstance(record, Exception) else [f"not JSON: {record}"]
            if errors:
                bad += 1
                for error in errors:
                    print(f"{file}:{where}: {error}")
    files_note = f", {unreadable} file(s) unreadable" if unreadable else ""
    print(f"{total - bad} valid, {bad} invalid, {total} records{files_note}")
    return 0 if bad == 0 and unreadable == 0 and total > 0 else 1


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


_COMMANDS = {
    "agent": _agent,
    "simulate": _simulate,
    "demo": _demo,
    "validate": lambda args: _validate(args.files),
    "approver": _approver,
    "decide": _decide,
    "keygen": _keygen,
    "console": _console,
    "azure-channel": _azure_channel,
}
