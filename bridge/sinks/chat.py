"""Chat messages for the webhook sink's ``format=teams`` and ``format=slack`` (issue 26): on-call people
learn of maintenance from a notification, not a dashboard.

One message per record a person cares about, none for the others (the sink acknowledges those without
posting):

* a ``scheduledEvents`` record with a transition: ``scheduled``, ``started``, ``startedWithoutNotice``,
  ``completed``, ``canceled`` (not ``present``: an agent's first look is no news), naming the event, its
  type and source, the VMs, NotBefore in UTC and "in N minutes" (from the record's own time), and a
  link to the event in the console when ``console_url`` is given;
* an ``approval`` record (an approver's audit): approved or refused, by whom, why;
* a ``reconciliation`` finding ``unwatched`` (bridge.azure): the VM nobody watches.

**A wave is one message per set, not one per VM.** Every VM of an availability set or scale-set update
domain sees the same event, and each agent posts on its own; only the agent of the first VM the event
names (its ``Resources``, sorted, case-insensitive) posts it, so 200 VMs of one set make one message
per transition. (If that VM's agent is down, nobody posts: the console and the alert rule "an agent
stopped reporting" are what catches it; ``one_per_set=false`` makes every VM post.)

Shapes, as the services document them: Teams' Workflows webhook (Power Automate "When a Teams webhook
request is received") takes ``{"type": "message", "attachments": [{"contentType":
"application/vnd.microsoft.card.adaptive", "content": <Adaptive Card 1.4>}]}``; Slack's incoming webhook
takes ``{"text": <fallback>, "blocks": [...]}`` with Block Kit's limits (50 blocks, 3 000 characters per
section text, 150 per header).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from string import Template
from typing import Literal
from urllib.parse import quote

from bridge.records.approval import Approval
from bridge.records.azure import Finding
from bridge.records.reader import RECORD_TYPES, Record
from bridge.records.scheduled_events import ScheduledEvents
from bridge.schemas import JsonObject, json_list
from bridge.support.timeutil import epoch_of

Style = Literal["teams", "slack"]
CHAT_FORMATS = ("teams", "slack", "template")
MAX_TEMPLATE_BYTES = 64 * 1024
TRANSITIONS = {
    "scheduled": "scheduled",
    "started": "started",
    "startedWithoutNotice": "started without notice",
    "completed": "completed",
    "canceled": "canceled",
}
ADAPTIVE_CARD_VERSION = "1.4"
ADAPTIVE_CARD_SCHEMA = "http://adaptivecards.io/schemas/adaptive-card.json"
SLACK_MAX_BLOCKS = 50
SLACK_MAX_TEXT = 3000
SLACK_MAX_HEADER = 150
MAX_VMS_NAMED = 20
#: A fact's text at most: a record's free text (an event's description) must not make a message larger
#: than a chat service takes (Teams' Workflows: about 28 KB a message).
MAX_FACT = 1000


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """The webhook spec's chat options: ``console_url`` (the console's https:// address, for a link to
    the event) and ``one_per_set`` (module docstring)."""

    console_url: str | None = None
    one_per_set: bool = True
    template: str | None = None  # format=template: the text of template_file

    @classmethod
    def take(cls, options: dict[str, str], style: str) -> ChatOptions:
        """Pop the chat options from a webhook spec's options; ``ValueError`` for a wrong one."""
        url, per_set = options.pop("console_url", None), options.pop("one_per_set", None)
        template_file = options.pop("template_file", None)
        if (url is not None or per_set is not None) and style not in CHAT_FORMATS:
            raise ValueError("console_url and one_per_set only apply to format=teams, slack or template")
        if url is not None and not url.startswith("https://"):
            raise ValueError("console_url must be the console's https:// address")
        if per_set not in (None, "true", "false"):
            raise ValueError("one_per_set must be true or false")
        if (template_file is not None) != (style == "template"):
            raise ValueError("format=template needs template_file=/path (and only it takes one)")
        template = _read_template(template_file) if template_file else None
        if template is not None:
            _check_template(template)
        return cls(url, per_set != "false", template)


def _read_template(path: str) -> str:
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"template_file {path}: {exc.strerror}") from None
    if len(data) > MAX_TEMPLATE_BYTES:
        raise ValueError(f"template_file {path} is over {MAX_TEMPLATE_BYTES} bytes")
    return data.decode("utf-8")


def _check_template(template: str) -> None:
    """A template that yields no JSON would fail every message at the receiver, one by one, at 3 a.m.:
    refused at start instead (issue 31), rendered once with values that hold every JSON escape."""
    import orjson

    sample = 'a "quoted" \\ back\nslash </x> <!channel> [l](https://x) é'
    rendered = _render(template, dict.fromkeys(("title", "text", "url", "event_id", "record_type"), sample))
    try:
        orjson.loads(rendered)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"template_file does not yield JSON once filled in: {exc}") from None


def _render(template: str, values: dict[str, str]) -> bytes:
    import orjson

    return (
        Template(template).safe_substitute({k: orjson.dumps(v).decode() for k, v in values.items()}).encode()
    )


def chat_body(record: Record, style: str, options: ChatOptions) -> bytes | None:
    """The request body for ``record`` (read by :class:`~bridge.records.reader.Reader`) in a chat
    format, or None when nothing is posted for it."""
    import orjson

    if style != "template":
        message = chat_message(record, style, options)  # type: ignore[arg-type]
        return None if message is None else orjson.dumps(message)
    lines = _lines(record, options.one_per_set)
    if not lines or options.template is None:
        return None
    title, facts, link = lines
    url = _console_link(options, link)
    values = {"title": title, "text": "\n".join([title, *(f"{k}: {v}" for k, v in facts)]), "url": url,
              "event_id": link or "", "record_type": RECORD_TYPES[type(record)]}  # fmt: skip
    return _render(options.template, values)


def chat_message(record: Record, style: Style, options: ChatOptions | None = None) -> JsonObject | None:
    """The message for ``record``, or None when it is nothing a person needs to read."""
    options = options or ChatOptions()
    lines = _lines(record, options.one_per_set)
    if not lines:
        return None
    title, facts, link = lines
    url = _console_link(options, link) or None
    if style == "teams":
        return _teams(_markdown(title), [(k, _markdown(v)) for k, v in facts], url)
    return _slack(title, facts, url)


Lines = tuple[str, list[tuple[str, str]], str | None]


def _lines(record: Record, one_per_set: bool) -> Lines | None:
    if isinstance(record, ScheduledEvents):
        return _transition(record, one_per_set)
    if isinstance(record, Approval) and record.outcome in ("approved", "refused"):
        events = ", ".join(record.event_ids) or "-"
        title = f"Maintenance {record.outcome}: {record.target or 'unknown VM'}"
        by = record.issued_by or record.component or "-"
        facts = [
            ("Events", events),
            ("By", by),
            ("Reason", record.reason or "ok"),
            ("Detail", record.detail or ""),
        ]
        return title, [f for f in facts if f[1]], record.event_ids[0] if record.event_ids else None
    if isinstance(record, Finding) and record.finding == "unwatched":
        vm = record.vm.name if record.vm is not None and record.vm.name else "a VM"
        title = f"No agent watches {vm}: Azure announced maintenance for it"
        return title, [("Event", record.event_id), ("Azure", str(record.azure_state))], record.event_id
    return None


def _transition(record: ScheduledEvents, one_per_set: bool) -> Lines | None:
    vm = record.vm.name if record.vm is not None else ""
    events = {e.event_id: e for e in record.events}
    for change in record.changes:
        if change.change not in TRANSITIONS:
            continue
        event = events.get(change.event_id)
        resources = list(event.resources) if event is not None and event.resources else [vm]
        if one_per_set and resources and vm.lower() != min(r.lower() for r in resources):
            continue  # another VM of the set posts this one
        named = ", ".join(resources[:MAX_VMS_NAMED]) + (
            f" (+{len(resources) - MAX_VMS_NAMED} more)" if len(resources) > MAX_VMS_NAMED else ""
        )
        title = f"{change.event_type} {TRANSITIONS[change.change]}: {named}"
        facts = [("Event", change.event_id), ("Source", (event.source if event else None) or "-")]
        not_before = epoch_of(event.not_before) if event is not None else None
        if event is not None and not_before is not None:
            observed = record.observed_at or None
            ahead = "" if observed is None else f" (in {max(0, round((not_before - observed) / 60))} minutes)"
            facts.append(("Not before", f"{event.not_before}{ahead}"))
        if event is not None and event.duration:
            facts.append(("Duration", f"{event.duration} s"))
        if event is not None and event.description:
            facts.append(("Description", _cut(event.description, MAX_FACT)))
        return title, facts, change.event_id
    return None


def _teams(title: str, facts: list[tuple[str, str]], url: str | None) -> JsonObject:
    card: JsonObject = {
        "$schema": ADAPTIVE_CARD_SCHEMA,
        "type": "AdaptiveCard",
        "version": ADAPTIVE_CARD_VERSION,
        "body": [
            {"type": "TextBlock", "text": title, "weight": "Bolder", "size": "Medium", "wrap": True},
            {"type": "FactSet", "facts": [{"title": k, "value": v} for k, v in facts]},
        ],
    }
    if url:
        card["actions"] = [{"type": "Action.OpenUrl", "title": "Open in the console", "url": url}]
    attachment: JsonObject = {
        "contentType": "application/vnd.microsoft.card.adaptive",
        "contentUrl": None,
        "content": card,
    }
    return {"type": "message", "attachments": [attachment]}


def _slack(title: str, facts: list[tuple[str, str]], url: str | None) -> JsonObject:
    text = "\n".join(f"*{k}:* {_escape(v)}" for k, v in facts)
    blocks: list[JsonObject] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(title, SLACK_MAX_HEADER)}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut(text, SLACK_MAX_TEXT)}},
    ]
    if url:
        button: JsonObject = {"type": "button", "text": {"type": "plain_text", "text": "Open in the console"}}
        button["url"] = url
        blocks.append({"type": "actions", "elements": [button]})
    # The fallback text is mrkdwn too (notifications, old clients): escaped like the section (issue 31:
    # a `<!channel>` in a VM or event name reached it).
    return {"text": _cut(_escape(title), SLACK_MAX_TEXT), "blocks": json_list(blocks[:SLACK_MAX_BLOCKS])}


_MARKDOWN = re.compile(r"([\\`\[\]()!<>])")


def _markdown(text: str) -> str:
    """Text shown as is in an Adaptive Card (TextBlock and FactSet values render Markdown): the
    punctuation of links, images, code and inline HTML is backslash-escaped (issue 31: ``[Approve
    now](https://evil.example/x)`` in a refused decision's text became a link). Emphasis characters
    are left alone: VM names hold ``_``, and a stray italic misleads nobody."""
    return _MARKDOWN.sub(r"\\\1", text)


def _escape(text: str) -> str:
    """Slack's mrkdwn control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _console_link(options: ChatOptions, event_id: str | None) -> str:
    """The console's page of the event (the id comes from a record: quoted, never pasted)."""
    if not options.console_url or not event_id:
        return ""
    return f"{options.console_url.rstrip('/')}/events/{quote(event_id, safe='')}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
