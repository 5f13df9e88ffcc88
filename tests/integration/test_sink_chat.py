"""Chat notifications (issue 26): the webhook sink's ``format=teams`` and ``format=slack``.

* A real agent posts to a local receiver (Teams and Slack cannot be reached from here) for each
  transition a person cares about, nothing for its first look; each Teams body is the Workflows
  webhook's message with an Adaptive Card 1.4, with the console link.
* Slack's Block Kit limits hold for any record (50 blocks, 3 000 characters per section, 150 per
  header), and mrkdwn control characters are escaped.
* A wave of 200 VMs in one set is one message per transition, not 200 (the first VM of the event
  posts); the approver's audit records and Azure's unwatched findings are messages too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import records
from helpers import doc, event
from peers.http_receiver import HttpReceiver
from procs import Emulator
from records import typed

from bridge.agent.diff import diff
from bridge.azure.events import VmRef as AzureVm
from bridge.azure.records import finding_record
from bridge.imds.instance import VmIdentity
from bridge.records import approval_record, scheduled_events_record
from bridge.sinks import SinkError, create_sink
from bridge.sinks.chat import SLACK_MAX_BLOCKS, SLACK_MAX_HEADER, SLACK_MAX_TEXT, ChatOptions, chat_message

CONSOLE = "https://console.contoso.example"


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as r:
        yield r


def test_an_agent_posts_an_adaptive_card_per_transition(
    make_agent: Any, receiver: HttpReceiver, tmp_path: Path
) -> None:
    emulator = Emulator()
    try:
        spec = f"{receiver.url}/workflows#format=teams&console_url={CONSOLE}"
        agent = make_agent(emulator.url, "--sink", f"file://{tmp_path / 'records.jsonl'}", sink=spec).start()
        freeze = emulator.add_event(eventType="Freeze", durationInSeconds=5, description="Host update")
        agent.wait_for_change(freeze, "scheduled")
        emulator.control("POST", f"events/{freeze}/start")
        agent.wait_for_change(freeze, "started")
        emulator.control("POST", f"events/{freeze}/complete")
        agent.wait_for_change(freeze, "completed")
        receiver.wait_for(lambda reqs: len(reqs) >= 3, what="three messages")
    finally:
        emulator.stop()
    bodies = [orjson.loads(r.body) for r in receiver.requests()]
    assert len(bodies) == 3  # the first observation (no event) posted nothing
    titles = []
    for body in bodies:
        assert body["type"] == "message"
        (attachment,) = body["attachments"]
        assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
        card = attachment["content"]
        assert (card["type"], card["version"]) == ("AdaptiveCard", "1.4")
        assert card["$schema"] == "http://adaptivecards.io/schemas/adaptive-card.json"
        assert [b["type"] for b in card["body"]] == ["TextBlock", "FactSet"]
        assert card["actions"] == [{"type": "Action.OpenUrl", "title": "Open in the console",
                                    "url": f"{CONSOLE}/events/{freeze}"}]  # fmt: skip
        titles.append(card["body"][0]["text"])
    assert [t.split(":")[0] for t in titles] == ["Freeze scheduled", "Freeze started", "Freeze completed"]
    facts = {f["title"]: f["value"] for f in bodies[0]["attachments"][0]["content"]["body"][1]["facts"]}
    assert facts["Event"] == freeze and "minutes\\)" in facts["Not before"] and facts["Duration"] == "5 s"


def test_slack_messages_keep_block_kit_limits_and_escape_mrkdwn() -> None:
    vm = VmIdentity(vm_id="v", name="vm-a")
    huge = "<b>&" + "x" * 10_000
    before, after = (
        doc(1),
        doc(
            2,
            event(
                str(uuid.uuid4()),
                etype="Reboot",
                Description=huge,
                resources=["vm-a", *(f"vm-{n}" for n in range(300))],
            ),
        ),
    )
    record = scheduled_events_record(vm, before, after, diff(before, after), 0.0)
    message = chat_message(typed(record), "slack", ChatOptions(CONSOLE, one_per_set=False))
    assert message is not None
    blocks = message["blocks"]
    assert len(blocks) <= SLACK_MAX_BLOCKS and len(blocks[0]["text"]["text"]) <= SLACK_MAX_HEADER
    section = blocks[1]["text"]["text"]
    assert len(section) <= SLACK_MAX_TEXT and "&lt;b&gt;&amp;" in section and "<b>" not in section
    assert blocks[2]["elements"][0]["url"].startswith(f"{CONSOLE}/events/")


def test_a_wave_of_200_vms_in_one_set_is_one_message_per_transition() -> None:
    names = [f"web_{n}" for n in range(200)]
    event_id = str(uuid.uuid4())
    before, after = doc(1), doc(2, event(event_id, etype="Reboot", resources=names))
    posted = []
    for name in names:
        record = scheduled_events_record(
            VmIdentity(vm_id=name, name=name), before, after, diff(before, after), 0.0
        )
        posted.append(chat_message(typed(record), "teams"))
    assert sum(m is not None for m in posted) == 1
    assert "\\(+180 more\\)" in posted[0]["attachments"][0]["content"]["body"][0]["text"]  # type: ignore[index]
    changes = diff(before, after)
    records = [
        scheduled_events_record(VmIdentity(vm_id=n, name=n), before, after, changes, 0.0) for n in names
    ]
    every = [chat_message(typed(record), "teams", ChatOptions(one_per_set=False)) for record in records]
    assert sum(m is not None for m in every) == 200


def test_approvals_and_unwatched_vms_are_messages_and_other_records_are_not() -> None:
    audit = approval_record("approver", decision_id="d", event_ids=["E1"], target="vm-a", issued_by="alice",
                            requester=None, outcome="approved", reason=None, detail=None, results=[],
                            record_id=str(uuid.uuid4()))  # fmt: skip
    message = chat_message(typed(audit), "slack")
    assert message is not None and message["text"] == "Maintenance approved: vm-a"
    vm_c = AzureVm("sub", "rg", "vm-c", "/subscriptions/sub/resourceGroups/rg/providers/x/vm-c")
    finding = finding_record(
        "unwatched", "E1", vm_c, "no agent", 0.0, grace_seconds=60, azure_state="Scheduled", agent_vms=[]
    )
    assert (
        "No agent watches vm-c"
        in chat_message(typed(finding), "teams")["attachments"][0]["content"]["body"][0]["text"]  # type: ignore[index]
    )
    assert chat_message(typed(records.heartbeat(records.vm_block("vm-a"))), "teams") is None
    assert chat_message(typed({**finding, "finding": "outcome"}), "slack") is None


def test_chat_options_are_checked() -> None:
    with pytest.raises(SinkError, match="console_url"):
        create_sink("https://hooks.example/x#format=json&console_url=https://c.example")
    with pytest.raises(SinkError, match="https://"):
        create_sink("https://hooks.example/x#format=slack&console_url=http://c.example")
    assert create_sink("https://hooks.example/x#format=slack&one_per_set=false").chat.one_per_set is False  # type: ignore[attr-defined]


def test_a_user_template_gets_json_strings_so_its_json_stays_json(tmp_path: Path) -> None:
    """``format=template``: for anything else than Teams or Slack, a file whose placeholders ($title,
    $text, $url, $event_id, $record_type) are replaced by JSON strings; quotes and line breaks in an
    event's description cannot break the body."""
    from bridge.sinks.chat import chat_body

    template = tmp_path / "message.json"
    template.write_text('{"content": $text, "link": $url, "id": $event_id, "kind": $record_type}')
    sink = create_sink(
        f"https://hooks.example/x#format=template&template_file={template}&console_url={CONSOLE}"
    )
    event_id = str(uuid.uuid4())
    before = doc(1)
    after = doc(
        2, event(event_id, etype="Redeploy", Description='say "hi"\nthen } break', resources=["vm-a"])
    )
    record = scheduled_events_record(
        VmIdentity(vm_id="v", name="vm-a"), before, after, diff(before, after), 0.0
    )
    body = chat_body(typed(record), "template", sink.chat)  # type: ignore[attr-defined]
    assert body is not None
    message = orjson.loads(body)
    assert message["id"] == event_id and message["link"] == f"{CONSOLE}/events/{event_id}"
    assert 'say "hi"\nthen } break' in message["content"] and message["kind"] == "scheduledEvents"
    with pytest.raises(SinkError, match="template_file"):
        create_sink("https://hooks.example/x#format=template")
    with pytest.raises(SinkError, match="template_file"):
        create_sink(f"https://hooks.example/x#format=slack&template_file={template}")


def test_what_a_keyless_writer_of_the_decisions_topic_says_never_becomes_a_link_or_a_mention(
    tmp_path: Path,
) -> None:
    """Issue 31, finding 8: a message on the decisions topic without a key, ``eventId: "[Approve
    now](https://evil.example/x)"``, was refused with that text in the audit's ``detail``, which the
    Teams card rendered as a link; Slack's fallback text carried ``<!channel>`` unescaped. The real
    validation makes the detail, the real formats render it."""
    import time as _time

    from bridge.decisions import DecisionKeys, DecisionRefused, ValidationPolicy, validate

    evil = {"schemaVersion": 1, "recordType": "decision", "decisionId": "d-12345678",
            "eventId": "[Approve now](https://evil.example/x)", "action": "approve",
            "target": "<!channel> vm-a", "issuedBy": "[ops](https://evil.example/y)",
            "issuedAt": "2026-11-26T10:00:00Z", "expiresAt": "2026-11-26T10:10:00Z"}  # fmt: skip
    with pytest.raises(DecisionRefused) as refused:
        validate(evil, ValidationPolicy(DecisionKeys()), _time.time())
    assert "evil.example" not in refused.value.detail and "eventId" in refused.value.detail
    audit = typed(records.approval(
        outcome="refused", event_ids=[evil["eventId"]], target=evil["target"], issuedBy=evil["issuedBy"],
        reason="schema", detail="[Approve now](https://evil.example/x) <!channel>",
    ))  # fmt: skip
    card = chat_message(audit, "teams", ChatOptions(CONSOLE))
    assert card is not None
    content = card["attachments"][0]["content"]
    texts = [content["body"][0]["text"], *(f["value"] for f in content["body"][1]["facts"])]
    assert all("](" not in t and "[Approve" not in t.replace("\\[", "") for t in texts)
    slack = chat_message(audit, "slack", ChatOptions(CONSOLE))
    assert slack is not None
    mrkdwn = [slack["text"], slack["blocks"][1]["text"]["text"]]  # the header is plain_text: never parsed
    assert all("<!channel>" not in t and "&lt;!channel&gt;" in t for t in mrkdwn)
    template = tmp_path / "bad.tmpl"
    template.write_text('{"text": "$text" }')  # quoted twice once filled: not JSON
    with pytest.raises(ValueError, match="does not yield JSON"):
        ChatOptions.take({"template_file": str(template)}, "template")
