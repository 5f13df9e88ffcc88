"""The approver's Event Hubs source: the real azure-eventhub SDK against the AMQP test peer
(``tests/peers/amqp_eventhubs.py``), checkpoints and partition ownership in a real Azurite (Blob
Storage emulator from npm, ``tests/azurite.py``), the IMDS emulator, the agent and the approver as real
processes.

* emulator -> agent -> (file sink); ``se-bridge decide`` publishes to the peer's decisions hub; the
  approver reads it, relays through the agent; exactly one StartRequest, the audit records, and the
  partition's checkpoint blob in Azurite;
* an approver killed (SIGKILL) after consuming a decision and before committing it: the restarted one
  takes its partitions back at once, processes the decision with exactly one StartRequest, and a
  second restart does not read it again (the checkpoint is honoured);
* start-up: a refused storage key, a missing container or a refused hub credential stop the approver
  with exit 2 and no secret in what it prints; an unreachable storage account does not: the approver
  waits for it and works once it answers.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from azurite import Azurite, require_azurite
from brokers import free_port
from peers.amqp_eventhubs import EventHubsPeer, StoredEvent
from procs import (
    DECISION_KEY,
    Emulator,
    approver_api,
    approver_command,
    decide,
    pem_files,
    scrape,
    start_approver,
    wait_until,
)

from bridge.streams import SourceError
from bridge.streams.eventhubs import parse_source_spec

KEY = DECISION_KEY  # Ed25519 (the agents prove each decision with its public half)
EH_KEY = secrets.token_urlsafe(32)  # the hub's SAS key: must never reach a log line
CONTAINER = "checkpoints"


# --------------------------------------------------------------------------------------------------
# The spec (no process, no network)
# --------------------------------------------------------------------------------------------------


def test_spec_options_and_defaults() -> None:
    hub, source = parse_source_spec(
        "eventhubs://ns.servicebus.windows.net/decisions?credential=managed"
        "&client_id=0f8fad5b-d9cb-469f-a165-70867728950e"
        "&checkpoint_url=https://acct.blob.core.windows.net/checkpoints&consumer_group=se-bridge-approver"
        "&load_balancing_interval=10&send_timeout=5"
    )
    assert (hub.namespace, hub.hub, hub.credential) == ("ns.servicebus.windows.net", "decisions", "managed")
    assert source.consumer_group == "se-bridge-approver"
    assert (source.account_url, source.container) == ("https://acct.blob.core.windows.net", "checkpoints")
    assert (source.load_balancing_interval, source.ownership_expiration) == (10.0, 60.0)
    assert source.has_store

    hub, source = parse_source_spec(
        "eventhubs://127.0.0.1:5672/decisions?connection_string_env=EH&checkpoint_connection_string_file="
        "/etc/se-bridge/storage.conn&checkpoint_container=cp-1",
        group="from-the-command-line",
    )
    assert hub.uses_connection_string and source.container == "cp-1" and source.account_url is None
    assert source.consumer_group == "from-the-command-line"  # the spec's consumer_group wins when given
    hub, source = parse_source_spec("eventhubs://ns.servicebus.windows.net/decisions")
    assert source.consumer_group == "$Default" and not source.has_store
    assert (source.load_balancing_interval, source.ownership_expiration) == (30.0, 180.0)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("checkpoint_connection_string=DefaultEndpointsProtocol", "never put a secret"),
        ("checkpoint_account_key=c2VjcmV0", "never put a secret"),
        ("connection_string=Endpoint", "never put a secret"),
        ("checkpoint_url=https://a.blob.core.windows.net/cp%3Fsv%3D1%26sig%3Dtopsecret", "no SAS token"),
        ("checkpoint_url=http://a.blob.core.windows.net/cpts", "only sent over TLS"),
        ("checkpoint_url=https://a.blob.core.windows.net/", "names no container"),
        ("checkpoint_container=cpts", "checkpoint_container needs"),
        ("checkpoint_connection_string_env=CP", "needs checkpoint_container"),
        (
            "checkpoint_connection_string_env=CP&checkpoint_connection_string_file=/x&checkpoint_container=cpt",
            "not both",
        ),
        ("checkpoint_connection_string_env=CP&checkpoint_container=Bad_Name", "blob container name"),
        ("checkpoint_connection_string_file=relative&checkpoint_container=cpts", "absolute path"),
        ("consumer_group=a/b", "consumer_group"),
        ("load_balancing_interval=10&ownership_expiration=5", "longer than"),
        ("load_balancing_interval=soon", "must be a number"),
        ("prefetch=3", "unknown option 'prefetch'"),
    ],
)
def test_spec_mistakes_are_refused_without_echoing_values(query: str, expected: str) -> None:
    with pytest.raises(SourceError) as caught:
        parse_source_spec(f"eventhubs://ns.servicebus.windows.net/decisions?{query}")
    message = str(caught.value)
    assert expected in message and message.startswith("eventhubs source"), message
    assert "topsecret" not in message and "c2VjcmV0" not in message


def test_checkpoint_url_needs_the_hubs_entra_id_credential() -> None:
    with pytest.raises(SourceError, match="uses the hub's Entra ID credential"):
        parse_source_spec(
            "eventhubs://ns.servicebus.windows.net/decisions?connection_string_env=EH"
            "&checkpoint_url=https://a.blob.core.windows.net/cpts"
        )


# --------------------------------------------------------------------------------------------------
# Real processes: helpers
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def peer() -> Iterator[EventHubsPeer]:
    with EventHubsPeer({"decisions": 2, "single": 1}, keys={"K": EH_KEY}) as p:
        yield p
    assert p.errors == [], p.errors


@pytest.fixture
def store() -> Iterator[Azurite]:
    with Azurite(require_azurite()) as running:
        running.create_container(CONTAINER)
        yield running


def env_for(peer: EventHubsPeer, store: Azurite, hub: str = "decisions", **more: str) -> dict[str, str]:
    return {
        **os.environ,
        "EH_CONN": peer.connection_string(hub, "K", EH_KEY),
        "CP_CONN": store.connection_string(),
        **more,
    }


def source_spec(peer: EventHubsPeer, hub: str = "decisions", **options: str) -> str:
    query = {
        "connection_string_env": "EH_CONN",
        "checkpoint_connection_string_env": "CP_CONN",
        "checkpoint_container": CONTAINER,
        "open_timeout": "10",
        **options,
    }
    return f"eventhubs://127.0.0.1:{peer.port}/{hub}?" + "&".join(f"{k}={v}" for k, v in query.items())


def two_fleet_approvers(
    tmp_path: Path, spec: str, agent: Any, fleet: tuple[str, ...], env: dict[str, str]
) -> tuple[list[Path], list[subprocess.Popen[bytes]], list[str]]:
    """Two fleet approver instances on one hub, each once it owns one of its two partitions: their
    work directories, processes and API addresses."""
    workdirs = [tmp_path / "a", tmp_path / "b"]
    procs = []
    for workdir in workdirs:
        workdir.mkdir()
        audit = f"file://{workdir}/audit.jsonl"
        procs.append(start_approver(workdir, spec, audit, agent.api or "", KEY, *fleet, env=env))
    try:
        apis = [approver_api(w) for w in workdirs]
        wait_until(
            lambda: [scrape(a, "se_bridge_approver_partitions_owned") for a in apis] == [1.0, 1.0],
            60,
            what="one partition each",
        )
    except BaseException:
        for proc in procs:
            stop(proc)
        raise
    return workdirs, procs, apis


def topology_args(tmp_path: Path, spec: str, relay: str) -> tuple[str, ...]:
    """A checkpoint store is for fleet approvers (local ones would split the partitions between VMs
    and are refused): with one, the approver runs in fleet mode and learns the agent from the agent's
    file sink (``records.jsonl`` in ``tmp_path``), its relay URL being the agent's test address."""
    if "checkpoint_" not in spec:
        return ()
    events = f"file://{tmp_path}/records.jsonl"
    return ("--mode", "fleet", "--events-source", events, "--relay-url-template", relay)


def approver_args(tmp_path: Path, spec: str, relay: str, *extra: str) -> list[str]:
    audit = f"file://{tmp_path}/approver-audit.jsonl"
    # The peer's checkpoint paths checked below name the $Default consumer group.
    topology = topology_args(tmp_path, spec, relay)
    return approver_command(tmp_path, spec, audit, relay, KEY, "--group", "$Default", *topology, *extra)


def start_eh_approver(
    tmp_path: Path, spec: str, relay: str, env: dict[str, str], *extra: str
) -> subprocess.Popen[bytes]:
    audit = f"file://{tmp_path}/approver-audit.jsonl"
    topology = topology_args(tmp_path, spec, relay)
    return start_approver(
        tmp_path, spec, audit, relay, KEY, "--group", "$Default", *topology, *extra, env=env
    )


def approver_logs(tmp_path: Path, last_run_only: bool = False) -> list[dict[str, Any]]:
    path = tmp_path / "approver.log"
    if not path.exists():
        return []
    lines = path.read_bytes().splitlines()
    out: list[dict[str, Any]] = []
    for line in lines:
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            entry = {"msg": line.decode(errors="replace")}
        if last_run_only and entry.get("msg") == "--- approver start ---":
            out = []
        out.append(entry)
    return out


def decide_on_event_hubs(
    tmp_path: Path, peer: EventHubsPeer, env: dict[str, str], event_id: str, hub: str
) -> str:
    pem_files(tmp_path, "ops", KEY)
    sink = f"eventhubs://127.0.0.1:{peer.port}/{hub}?connection_string_env=EH_CONN"
    published = decide(sink, event_id, tmp_path / "ops.key", env=env)
    assert EH_KEY not in published["output"]
    return published["decisionId"]


def audits(tmp_path: Path, decision_id: str) -> list[dict[str, Any]]:
    path = tmp_path / "approver-audit.jsonl"
    if not path.exists():
        return []
    records = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return [r for r in records if r.get("decisionId") == decision_id]


def decision_event(peer: EventHubsPeer, hub: str, decision_id: str) -> StoredEvent:
    return wait_until(
        lambda: next(
            (e for e in peer.messages(hub=hub) if orjson.loads(e.body)["decisionId"] == decision_id), None
        ),
        10,
        what="the decision on the hub",
    )


def checkpoint_of(store: Azurite, peer: EventHubsPeer, hub: str, partition: str) -> dict[str, str] | None:
    """The checkpoint blob's metadata, under the names the SDK reads it back with."""
    name = f"127.0.0.1:{peer.port}/{hub}/$default/checkpoint/{partition}"
    return store.blobs(CONTAINER).get(name)


def owners(store: Azurite, peer: EventHubsPeer, hub: str) -> dict[str, str | None]:
    prefix = f"127.0.0.1:{peer.port}/{hub}/$default/ownership/"
    return {
        name.rsplit("/", 1)[1]: meta.get("ownerid")
        for name, meta in store.blobs(CONTAINER).items()
        if name.startswith(prefix)
    }


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def assert_no_secret(tmp_path: Path, store: Azurite) -> None:
    text = (tmp_path / "approver.log").read_text()
    assert EH_KEY not in text and store.key not in text


# --------------------------------------------------------------------------------------------------
# Real processes: the tests
# --------------------------------------------------------------------------------------------------


def test_end_to_end_through_event_hubs_with_blob_checkpoints(
    emulator: Emulator, make_agent, peer: EventHubsPeer, store: Azurite, tmp_path: Path
) -> None:
    env = env_for(peer, store)
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    approver = start_eh_approver(tmp_path, source_spec(peer), agent.api or "", env)
    try:
        decision_id = decide_on_event_hubs(tmp_path, peer, env, eid, "decisions")
        wait_until(lambda: emulator.state()["startRequests"] == {eid: 1}, 60, what="one StartRequest")
        mine = wait_until(lambda: audits(tmp_path, decision_id), 30, what="the approver's audit record")
        assert [(a["component"], a["outcome"]) for a in mine] == [("approver", "approved")]
        theirs = wait_until(
            lambda: [a for a in agent.records("approval") if a["decisionId"] == decision_id],
            30,
            what="the agent's audit record",
        )
        assert [(a["component"], a["outcome"]) for a in theirs] == [("agent", "approved")]
        agent.wait_for_change(eid, "started", timeout=30)

        event = decision_event(peer, "decisions", decision_id)
        checkpoint = wait_until(
            lambda: checkpoint_of(store, peer, "decisions", event.partition), 30, what="checkpoint blob"
        )
        assert checkpoint == {"offset": str(event.offset), "sequencenumber": str(event.sequence_number)}
        # Both partitions are owned under the stable owner id kept in the state directory.
        owner_file = next((tmp_path / "approver-state").glob("source-eventhubs-*.owner"))
        assert owners(store, peer, "decisions") == {
            "0": owner_file.read_text().strip(),
            "1": owner_file.read_text().strip(),
        }
        assert emulator.state()["startRequests"] == {eid: 1}
    finally:
        assert stop(approver) == 0
    # A clean stop releases the partitions (another approver could take them over at once).
    assert set(owners(store, peer, "decisions").values()) == {None}
    assert_no_secret(tmp_path, store)


def test_killed_before_commit_reprocessed_once_then_checkpoint_honoured(
    emulator: Emulator, make_agent, peer: EventHubsPeer, store: Azurite, tmp_path: Path
) -> None:
    """One partition: a restarted approver must take it back at once (without the stable owner id the
    SDK would wait 3 minutes for the killed owner's claim to expire), and a later decision on the same
    partition proves what comes before it was not read again."""
    env = env_for(peer, store, hub="single")
    spec = source_spec(peer, hub="single")
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    # A relay that accepts the connection and never answers: the approver consumes the decision,
    # records it as started and is stuck waiting for the agent, before any checkpoint.
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        first = start_eh_approver(
            tmp_path, spec, f"http://127.0.0.1:{silent.getsockname()[1]}", env, "--relay-timeout", "120"
        )
        decision_id = decide_on_event_hubs(tmp_path, peer, env, eid, "single")
        journal = tmp_path / "approver-state" / "decisions.jsonl"
        wait_until(
            lambda: journal.exists() and decision_id.encode() in journal.read_bytes(), 60, what="consumed"
        )
        first.kill()
        first.wait(10)
    finally:
        silent.close()
    assert emulator.state()["startRequests"] == {}
    assert checkpoint_of(store, peer, "single", "0") is None
    event = decision_event(peer, "single", decision_id)

    second = start_eh_approver(tmp_path, spec, agent.api or "", env)
    try:
        wait_until(lambda: emulator.state()["startRequests"] == {eid: 1}, 60, what="one StartRequest")
        wait_until(
            lambda: (
                checkpoint_of(store, peer, "single", "0")
                == {"offset": str(event.offset), "sequencenumber": str(event.sequence_number)}
            ),
            30,
            what="the checkpoint after the restart",
        )
    finally:
        assert stop(second) == 0
    assert [a["outcome"] for a in audits(tmp_path, decision_id)] == ["approved"]

    third = start_eh_approver(tmp_path, spec, agent.api or "", env)
    try:
        later = emulator.add_event(eventType="Freeze")
        agent.wait_for_change(later, "scheduled")
        later_id = decide_on_event_hubs(tmp_path, peer, env, later, "single")
        wait_until(
            lambda: emulator.state()["startRequests"] == {eid: 1, later: 1}, 60, what="the later decision"
        )
        wait_until(lambda: audits(tmp_path, later_id), 30, what="the later audit record")
    finally:
        assert stop(third) == 0
    third_run = approver_logs(tmp_path, last_run_only=True)
    assert not [e for e in third_run if "re-read" in str(e.get("msg"))], third_run
    assert [a["outcome"] for a in audits(tmp_path, decision_id)] == ["approved"]
    assert emulator.state()["startRequests"] == {eid: 1, later: 1}
    assert_no_secret(tmp_path, store)


def run_approver_once(tmp_path: Path, spec: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        approver_args(tmp_path, spec, "http://127.0.0.1:9"),
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )


def test_refused_credentials_or_missing_container_stop_the_approver_with_exit_2(
    peer: EventHubsPeer, store: Azurite, tmp_path: Path
) -> None:
    wrong_key = secrets.token_urlsafe(32)
    wrong_storage_key = base64.b64encode(secrets.token_bytes(48)).decode()
    cases = [
        (
            env_for(peer, store, CP_CONN=store.connection_string(key=wrong_storage_key)),
            source_spec(peer),
            "credential refused",
        ),
        (env_for(peer, store), source_spec(peer, checkpoint_container="missing-container"), "not found"),
        (
            {**env_for(peer, store), "EH_CONN": peer.connection_string("decisions", "K", wrong_key)},
            source_spec(peer),
            "credential refused by the Event Hubs namespace",
        ),
        (env_for(peer, store, hub="nohub"), source_spec(peer, hub="nohub"), "hub not found"),
    ]
    for env, spec, expected in cases:
        done = run_approver_once(tmp_path, spec, env)
        output = done.stdout + done.stderr
        assert done.returncode == 2, output
        assert "configuration refused" in output and expected in output, output
        for secret in (EH_KEY, store.key, wrong_key, wrong_storage_key):
            assert secret not in output
    assert not (tmp_path / "approver-audit.jsonl").exists()


def test_unreachable_namespace_and_checkpoint_store_are_waited_for(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    """Decided behaviour: a namespace or a storage account that does not answer at start is not a
    configuration error. The approver starts, says so, retries every load balancing round and works
    once both answer (nothing listens on their ports at first: connections are refused)."""
    late_peer = EventHubsPeer({"decisions": 2}, port=free_port(), keys={"K": EH_KEY})
    late_store = Azurite(require_azurite())
    late_store.port = free_port()
    env = env_for(late_peer, late_store)
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    spec = source_spec(late_peer, load_balancing_interval="1")
    approver = start_eh_approver(tmp_path, spec, agent.api or "", env)
    try:

        def warned(prefix: str) -> dict[str, Any] | None:
            return next((e for e in approver_logs(tmp_path) if str(e.get("msg")).startswith(prefix)), None)

        store_warning = wait_until(lambda: warned("checkpoint store unreachable"), 60, what="store warning")
        assert f"127.0.0.1:{late_store.port}" in store_warning["store"]
        wait_until(lambda: warned("event hubs namespace unreachable"), 60, what="namespace warning")
        wait_until(lambda: warned("approver started"), 30, what="the approver running")
        assert approver.poll() is None

        late_peer.start()
        decision_id = decide_on_event_hubs(tmp_path, late_peer, env, eid, "decisions")
        # Nothing is read without the checkpoint store: after the decision was published the approver
        # kept polling (two more failed reads, counted in /metrics) and relayed nothing.
        api = approver_api(tmp_path)
        failed = scrape(api, "se_bridge_approver_source_errors_total")
        wait_until(
            lambda: scrape(api, "se_bridge_approver_source_errors_total") >= failed + 2, 30, what="reads"
        )
        assert emulator.state()["startRequests"] == {}
        assert scrape(api, "se_bridge_approver_source_ready") == 0
        late_store.start(port=late_store.port)
        late_store.create_container(CONTAINER)
        wait_until(lambda: emulator.state()["startRequests"] == {eid: 1}, 60, what="one StartRequest")
        wait_until(lambda: audits(tmp_path, decision_id), 30, what="the audit record")
        event = decision_event(late_peer, "decisions", decision_id)
        wait_until(
            lambda: checkpoint_of(late_store, late_peer, "decisions", event.partition), 30, what="checkpoint"
        )
        assert approver.poll() is None
    finally:
        assert stop(approver) == 0
        late_store.close()
        late_peer.stop()
    assert_no_secret(tmp_path, late_store)
    assert late_peer.errors == []


def test_without_a_checkpoint_store_positions_stay_in_the_state_directory(
    emulator: Emulator, make_agent, peer: EventHubsPeer, tmp_path: Path
) -> None:
    """Local mode (one approver per VM, each reading every decision): no store, no load balancing,
    positions in the state directory; a restart does not read a committed decision again."""
    env = {**os.environ, "EH_CONN": peer.connection_string("single", "K", EH_KEY)}
    spec = f"eventhubs://127.0.0.1:{peer.port}/single?connection_string_env=EH_CONN"
    agent = make_agent(emulator.url).start()
    first_event = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(first_event, "scheduled")
    approver = start_eh_approver(tmp_path, spec, agent.api or "", env)
    try:
        first_id = decide_on_event_hubs(tmp_path, peer, env, first_event, "single")
        wait_until(lambda: emulator.state()["startRequests"] == {first_event: 1}, 60, what="StartRequest")
        wait_until(lambda: audits(tmp_path, first_id), 30, what="the audit record")
    finally:
        assert stop(approver) == 0
    positions_file = next((tmp_path / "approver-state").glob("source-eventhubs-*.positions"))
    stored = decision_event(peer, "single", first_id)
    assert orjson.loads(positions_file.read_bytes()) == {
        "0": {"offset": str(stored.offset), "sequenceNumber": stored.sequence_number}
    }

    approver = start_eh_approver(tmp_path, spec, agent.api or "", env)
    try:
        later = emulator.add_event(eventType="Freeze")
        agent.wait_for_change(later, "scheduled")
        later_id = decide_on_event_hubs(tmp_path, peer, env, later, "single")
        wait_until(lambda: audits(tmp_path, later_id), 60, what="the later decision's audit record")
    finally:
        assert stop(approver) == 0
    last_run = approver_logs(tmp_path, last_run_only=True)
    assert not [e for e in last_run if "re-read" in str(e.get("msg"))], last_run
    assert emulator.state()["startRequests"] == {first_event: 1, later: 1}
    assert [a["outcome"] for a in audits(tmp_path, first_id)] == ["approved"]
    text = (tmp_path / "approver.log").read_text()
    assert EH_KEY not in text


def test_two_fleet_approvers_share_the_hub_and_one_takes_over_after_a_kill(
    emulator: Emulator, make_agent, peer: EventHubsPeer, store: Azurite, tmp_path: Path
) -> None:
    """Issue 11: fleet approvers on Event Hubs share the decisions' partitions through the checkpoint
    store's ownership (one each here, reported in /metrics); one is killed (SIGKILL, so it releases
    nothing); once its ownership expires the other claims its partition and every decision published
    after the kill ends approved with one StartRequest each."""
    import signal

    env = env_for(peer, store)
    agent = make_agent(emulator.url).start()
    events = [emulator.add_event(eventType="Freeze") for _ in range(4)]
    agent.wait_for_change(events[-1], "scheduled")
    spec = source_spec(peer, load_balancing_interval="1", ownership_expiration="4")
    fleet = ("--mode", "fleet", "--events-source", f"file://{agent.sink_path}",
             "--relay-url-template", agent.api or "", "--group", "$Default")  # fmt: skip
    workdirs, procs, apis = two_fleet_approvers(tmp_path, spec, agent, fleet, env)
    try:
        assert len(set(owners(store, peer, "decisions").values())) == 2
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        decided = [decide_on_event_hubs(tmp_path, peer, env, e, "decisions") for e in events]
        wait_until(
            lambda: scrape(apis[1], "se_bridge_approver_partitions_owned") == 2.0, 60, what="the takeover"
        )
        survivor = next((workdirs[1] / "approver-state").glob("source-eventhubs-*.owner")).read_text().strip()
        assert set(owners(store, peer, "decisions").values()) == {survivor}
        everything = dict.fromkeys(events, 1)
        wait_until(lambda: emulator.state()["startRequests"] == everything, 60, what="every StartRequest")

        def outcomes() -> dict[str, str]:
            path = workdirs[1] / "audit.jsonl"
            lines = path.read_bytes().splitlines() if path.exists() else []
            return {r["decisionId"]: r["outcome"] for r in map(orjson.loads, lines)}

        wait_until(lambda: set(outcomes()) >= set(decided), 30, what="the survivor's audit records")
        assert {outcomes()[d] for d in decided} == {"approved"}
    finally:
        for proc in procs:
            stop(proc)


def test_a_standby_carries_a_dead_instances_decisions_before_its_ownership_expires(
    emulator: Emulator, make_agent, peer: EventHubsPeer, store: Azurite, tmp_path: Path
) -> None:
    """Issue 19: Event Hubs moves a dead instance's partition only once its ownership expires (60 s
    here). The survivor's standby reads every partition in the ``default-standby`` consumer group,
    sees the dead owner's checkpoint stand still, and carries its decisions to IMDS while the
    ownership has not moved: an order, not a time, is asserted."""
    import signal

    env = env_for(peer, store)
    agent = make_agent(emulator.url).start()
    events = [emulator.add_event(eventType="Freeze") for _ in range(8)]
    agent.wait_for_change(events[-1], "scheduled")
    spec = source_spec(peer, load_balancing_interval="2", ownership_expiration="60")
    fleet = ("--mode", "fleet", "--events-source", f"file://{agent.sink_path}", "--relay-url-template",
             agent.api or "", "--group", "$Default", "--standby-after", "2")  # fmt: skip
    workdirs, procs, apis = two_fleet_approvers(tmp_path, spec, agent, fleet, env)
    try:
        # Decisions spread over both partitions (``decide`` keys them by target: one partition), so
        # each instance owns some and both partitions get a checkpoint while both instances live.
        from azure.eventhub import EventData, EventHubProducerClient

        from bridge.decisions import new_decision, sign

        producer = EventHubProducerClient.from_connection_string(env["EH_CONN"])

        def publish(event_ids: list[str]) -> list[str]:
            ids = []
            for index, event_id in enumerate(event_ids):
                decision = sign(new_decision(event_id, "vm-bridge-0", "tests", 600), "ops", KEY)
                batch = producer.create_batch(partition_id=str(index % 2))
                batch.add(EventData(orjson.dumps(decision)))
                producer.send_batch(batch)
                ids.append(decision["decisionId"])
            return ids

        first = publish(events[:4])
        wait_until(lambda: len(emulator.state()["startRequests"]) == 4, 60, what="the first 4 approved")
        assert [scrape(a, "se_bridge_approver_standby_acted_total") for a in apis] == [0, 0]
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        later = publish(events[4:])
        everything = dict.fromkeys(events, 1)
        wait_until(lambda: emulator.state()["startRequests"] == everything, 60, what="every StartRequest")
        assert scrape(apis[1], "se_bridge_approver_partitions_owned") == 1.0  # ownership not moved yet
        assert scrape(apis[1], "se_bridge_approver_standby_acted_total") >= 1

        def outcomes() -> dict[str, set[str]]:
            out: dict[str, set[str]] = {}
            for workdir in workdirs:
                path = workdir / "audit.jsonl"
                for record in map(orjson.loads, path.read_bytes().splitlines() if path.exists() else []):
                    out.setdefault(record["decisionId"], set()).add(record["outcome"])
            return out

        wait_until(lambda: set(outcomes()) >= {*first, *later}, 30, what="every decision audited")
        assert all(found == {"approved"} for found in outcomes().values())
    finally:
        with contextlib.suppress(NameError):
            producer.close()
        for proc in procs:
            stop(proc)
