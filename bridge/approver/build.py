"""An approver from its configuration: keys, topology checks, source, sinks, router, ARM path.

Kept apart from :mod:`bridge.approver.service` (what an approver does) because everything here runs
once, at start, and turns a configuration mistake into one :class:`~bridge.settings.ConfigError` line
(exit 2) before any state is touched beyond the state directory's lock.
"""

from __future__ import annotations

from pathlib import Path

from bridge.approver.arm import ArmAcknowledger
from bridge.approver.config import ApproverConfig
from bridge.approver.fleet import FleetView
from bridge.approver.routing import FleetRouter, LocalRouter, RelayClient
from bridge.approver.service import Approver
from bridge.coordination import CoordinationPolicy
from bridge.decisions import DecisionKeys, SigningKey, ValidationPolicy, load_signing_key
from bridge.shell.statedir import lock_state_dir
from bridge.signing import KeyRing
from bridge.streams import SourceError, create_source, topology


def build_approver(config: ApproverConfig) -> Approver:
    """From an :class:`bridge.approver.config.ApproverConfig` (flags, TOML, environment)."""
    from bridge.settings import ConfigError
    from bridge.signing import KeyRing
    from bridge.sinks import SinkError, create_sink

    try:
        # Ed25519 public keys, and HMAC keys while a migration lasts (bridge.decisions)
        keys = DecisionKeys.from_specs(config.key)
        relay_keys = KeyRing.from_specs(config.relay_key)
        coordinator_key = _coordinator_key(config)
        audit_signer = None
        if config.sign_key:
            key_id, _, where = config.sign_key.partition("=")
            audit_signer = (key_id, KeyRing.from_specs([f"{key_id}={where}"]).get(key_id) or b"")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not keys and not config.allow_unsigned:
        raise ConfigError(
            "key: at least one --key KEYID=PATH is required (or --allow-unsigned, for labs only)"
        )
    policy = ValidationPolicy(
        keys, config.allow_unsigned, frozenset(config.issuer), config.max_skew, config.max_ttl
    )
    _check_relay_signing(config, relay_keys)
    _check_fleet_only(config)
    state_dir = Path(config.state_dir)
    lock = lock_state_dir(state_dir)  # before any file in it is read, compacted or replaced
    relay = RelayClient(relay_keys, config.relay_timeout, config.relay_ca_file)
    try:
        topology.check(config.mode, config.source)
        for spec in config.events_source:
            topology.check_events_reader(spec)
        group = topology.source_group(config.mode, config.source, config.group, state_dir)
        source = create_source(config.source, state_dir, group=group)
        sinks = [create_sink(spec) for spec in config.sink]
        router = (
            _fleet_router(config, state_dir) if config.mode == "fleet" else LocalRouter(config.relay, relay)
        )
    except (SinkError, SourceError, ValueError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    approver = Approver(
        source,
        router,
        relay,
        policy,
        sinks,
        state_dir,
        lock=lock,
        arm=_arm_acknowledger(config),
        arm_mode=config.arm,
        coordination_policy=(
            CoordinationPolicy.of(config.coordinate_deadline, config.coordinate_on_deadline)
            if config.coordinate
            else None
        ),
        instance=topology.instance_id(state_dir),
        coordinator_key=coordinator_key,
        audit_signer=audit_signer,
        standby_after=config.standby_after if config.mode == "fleet" else 0.0,
    )
    if config.listen:
        try:
            approver.serve(config.listen, read_token_file=config.read_token_file)
        except (OSError, ValueError) as exc:
            approver.close()
            raise ConfigError(f"listen: cannot serve on {config.listen}: {exc}") from None
    return approver


def _coordinator_key(config: ApproverConfig) -> tuple[str, SigningKey] | None:
    """The key the fleet coordinator signs its approvals with: agents act on no unsigned decision,
    so a coordinating approver without one could never approve (refused at start instead)."""
    if not config.coordinate:
        return None
    if not config.coordinate_key:
        raise ValueError(
            "coordinate_key: --coordinate needs --coordinate-key KEYID=PATH, an Ed25519 private key "
            "(se-bridge keygen) whose public half the agents hold as --decision-key KEYID=PATH"
        )
    key_id, _, path = config.coordinate_key.partition("=")
    key = load_signing_key(path)
    if isinstance(key, bytes):
        raise ValueError("coordinate_key: an Ed25519 private key (PEM) is required, not a shared key")
    return key_id, key


def _check_fleet_only(config: ApproverConfig) -> None:
    """What only a fleet approver does, and what it needs to do it."""
    from bridge.settings import ConfigError

    if config.coordinate and config.mode != "fleet":
        raise ConfigError("coordinate: only a fleet approver coordinates (--mode fleet)")
    if config.arm != "off" and not config.arm_scope:
        raise ConfigError(
            "arm_scope: --arm needs at least one --arm-scope /subscriptions/<id>[/resourceGroups/<name>]: "
            "the scopes an acknowledgement may go to (VM resource ids come from the events stream)"
        )
    if config.arm != "off" and config.mode != "fleet":
        raise ConfigError(
            "arm: only a fleet approver approves through ARM (--mode fleet): before it acts it checks "
            "the event as the agents reported it on the events stream, which a local approver does not read"
        )


def _fleet_router(config: ApproverConfig, state_dir: Path) -> FleetRouter:
    """The fleet approver's router: it learns agents and events from the events stream."""
    from bridge.settings import ConfigError
    from bridge.signing import KeyRing

    if not config.events_source:
        raise ConfigError("events_source: fleet mode needs --events-source (the events stream)")
    learn = [
        create_source(s, state_dir / "fleet", group=topology.events_group(s, config.group, state_dir))
        for s in config.events_source
    ]
    # Identities pinned in the state directory; Azure's channel believed only when signed.
    view = FleetView(state_dir, azure_keys=KeyRing.from_specs(config.azure_key))
    return FleetRouter(learn, config.relay_url_template, view)


def _check_relay_signing(config: ApproverConfig, relay_keys: KeyRing) -> None:
    """Refuse to start when every relay request would be refused for want of a key: an agent answers
    unsigned requests with 401 (unless it runs in development mode), and a decision relayed that way
    is spent for nothing. Only a local agent's Unix socket takes unsigned requests (its file mode is
    the check), and ``--arm only`` never calls an agent."""
    from bridge.settings import ConfigError

    if relay_keys or config.arm == "only":
        return
    if config.mode == "local" and (config.relay.startswith("unix:") or config.relay_unsigned):
        return
    where = config.relay if config.mode == "local" else "every agent"
    raise ConfigError(
        f"relay_key: {where} refuses unsigned relay requests; give --relay-key KEYID=PATH with the key "
        "the agent's --relay-key names (make one: head -c 32 /dev/urandom | base64 > relay.key), or "
        "--relay-unsigned for a development agent run with --relay-allow-unsigned-loopback"
    )


def _arm_acknowledger(config: ApproverConfig) -> ArmAcknowledger | None:
    """The ARM path when ``--arm`` asks for it (its credential is built, nothing is contacted)."""
    if config.arm == "off":
        return None
    from bridge.settings import ConfigError
    from bridge.transports.azure import check_client_id, make_credential
    from bridge.transports.base import Owner

    owner = Owner("arm", lambda message: ConfigError(message))
    client_id = check_client_id(owner, "arm_client_id", config.arm_client_id)
    credential = make_credential(owner, "arm_credential", config.arm_credential, client_id)
    return ArmAcknowledger(
        credential, config.arm_endpoint, config.arm_api_version, audience=config.arm_audience,
        ca_file=config.arm_ca_file, timeout=config.relay_timeout, allowed_scopes=config.arm_scope,
    )  # fmt: skip
