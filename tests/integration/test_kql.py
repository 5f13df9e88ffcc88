"""Every KQL text the project ships, checked by Microsoft's own Kusto language service (npm
``@kusto/language-service-next``, run with Node.js by infra/tools/kql_check.js) against the tables it
declares (issue 26): 0 syntax and 0 semantic errors (an unknown column or table, a wrong type).

* Data Explorer: infra/adx/setup.kql (its commands, the table and function they create) and every tile of
  infra/adx/dashboard.kql against that table and function;
* Azure Monitor: the DCR's transform against its input stream (``source``), the workbook's queries and
  the alert rules against the custom tables, whose columns come from schemas/logs-ingestion.v1.json
  (the file the Bicep and the sink read: declared once).

A query that names a missing column fails the check (the last test), so a green run means something.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "infra" / "tools" / "kql_check.js"
LAYOUT = json.loads((ROOT / "schemas" / "logs-ingestion.v1.json").read_text())


def node_modules() -> Path:
    where = Path(os.environ.get("SE_BRIDGE_KUSTO") or ROOT / ".tools") / "node_modules"
    if not (where / "@kusto" / "language-service-next").exists():
        if os.environ.get("SE_BRIDGE_KUSTO"):
            pytest.fail(f"{where} has no @kusto/language-service-next although SE_BRIDGE_KUSTO is set")
        pytest.skip("the Kusto language service is not installed: `make test` (or `make kusto`) installs it")
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed")
    return where


def check(tables: dict[str, str], functions: list[dict[str, str]], queries: dict[str, str]) -> dict[str, Any]:
    payload = {
        "tables": tables,
        "functions": functions,
        "queries": [{"id": k, "text": v} for k, v in queries.items()],
    }
    command = ["node", str(CHECKER), str(node_modules())]
    proc = subprocess.run(command, input=json.dumps(payload), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {
        r["id"]: [d for d in r["diagnostics"] if d["severity"] == "Error"]
        for r in json.loads(proc.stdout)["results"]
    }


def monitor_tables() -> dict[str, str]:
    schema = "(" + ", ".join(f"{c['name']}: {c['type']}" for c in LAYOUT["columns"]) + ")"
    return {stream["table"]: schema for stream in LAYOUT["streams"].values()}


def adx() -> tuple[dict[str, str], list[dict[str, str]], dict[str, str]]:
    setup = (ROOT / "infra" / "adx" / "setup.kql").read_text()
    table = re.search(r"^\.create-merge table (\w+) (\([^)]*\))", setup, re.M)
    function = next(line for line in setup.splitlines() if line.startswith(".create-or-alter function"))
    fn = re.search(r"(\w+)(\(\)) (\{.*\})\s*$", function)
    assert table and fn
    dashboard = (ROOT / "infra" / "adx" / "dashboard.kql").read_text()
    text = "\n".join(line for line in dashboard.splitlines() if not line.strip().startswith("//"))
    tiles = [block.strip() for block in re.split(r"\n\s*\n", text) if block.strip()]
    commands = [block.strip() for block in re.split(r"\n\s*\n", setup) if block.strip()]
    queries = {f"dashboard tile {i + 1}": q for i, q in enumerate(tiles)}
    queries |= {f"setup command {i + 1}": c for i, c in enumerate(commands)}
    return (
        {table.group(1): table.group(2)},
        [{"name": fn.group(1), "params": fn.group(2), "body": fn.group(3)}],
        queries,
    )


def workbook_queries() -> dict[str, str]:
    workbook = json.loads((ROOT / "infra" / "monitor" / "workbook.json").read_text())
    return {
        f"workbook: {item['name']}": item["content"]["query"]
        for item in workbook["items"]
        if item["type"] == 3
    }


def alert_queries() -> dict[str, str]:
    """The alert rules' queries and the documented one that joins split records back."""
    return {
        f"alert {p.stem}": p.read_text() for p in sorted((ROOT / "infra" / "monitor").glob("alert-*.kql"))
    } | {"records rejoined": (ROOT / "infra" / "monitor" / "records-rejoined.kql").read_text()}


def test_data_explorer_setup_and_dashboard_have_no_errors() -> None:
    tables, functions, queries = adx()
    assert len(queries) >= 8
    errors = check(tables, functions, queries)
    assert {name: found for name, found in errors.items() if found} == {}


def test_the_dcr_transform_the_workbook_and_the_alerts_have_no_errors() -> None:
    stream_schema = "(" + ", ".join(f"{c['name']}: {c['type']}" for c in LAYOUT["columns"]) + ")"
    queries = {"dcr transform": LAYOUT["transformKql"], **workbook_queries(), **alert_queries()}
    assert len(workbook_queries()) >= 6 and len(alert_queries()) == 3
    errors = check({**monitor_tables(), "source": stream_schema}, [], queries)
    assert {name: found for name, found in errors.items() if found} == {}


def test_the_check_fails_on_a_column_no_table_has() -> None:
    tables, functions, _ = adx()
    errors = check(
        {**tables, **monitor_tables()},
        functions,
        {
            "adx": "SeBridgeRecordsUnique() | where NoSuchColumn == 1",
            "monitor": "SeBridgeRecords_CL | project VmNmae",
            "type": "SeBridgeRecords_CL | summarize sum(VmName)",
        },
    )
    assert "NoSuchColumn" in errors["adx"][0]["message"]
    assert "VmNmae" in errors["monitor"][0]["message"]
    assert errors["type"], "summing a string column is a semantic error"


# -- the alert rules evaluated ------------------------------------------------------------------------
#
# The language service checks names and types, not what a rule finds. Azure Monitor cannot run here,
# so the rules' KQL runs on duckdb-kql (KQL translated to DuckDB SQL; it refuses what it does not
# cover rather than guess) over rows generated for the case, restricted, as Azure restricts them, to
# the rule's time range: overrideQueryTimeRange when set, else windowSize x evaluation periods.

MONITOR = ROOT / "infra" / "modules" / "monitor.bicep"
_SQL_TYPES = {"datetime": "TIMESTAMP", "string": "VARCHAR", "dynamic": "JSON", "int": "INTEGER"}


def _duration(text: str) -> dt.timedelta:
    found = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?)?", text)
    assert found and any(found.groups()), text
    days, hours, minutes = (int(g or 0) for g in found.groups())
    return dt.timedelta(days=days, hours=hours, minutes=minutes)


def alert_rule(name: str) -> tuple[str, dt.timedelta]:
    """A rule of monitor.bicep as Azure runs it: its query (the horizon as deployed by default) and
    the time range its rows are taken from."""
    module = MONITOR.read_text()
    body = re.search(
        rf"resource {name} 'Microsoft\.Insights/scheduledQueryRules@[^']+' = \{{(.*?)\n\}}", module, re.S
    )
    assert body, name
    text = body.group(1)
    variables = dict(re.findall(r"^var (\w+) = '([^']*)'$", module, re.M))
    override = re.search(r"overrideQueryTimeRange: (\w+|'[^']+')", text)
    if override:
        value = override.group(1)
        span = _duration(value.strip("'") if value.startswith("'") else variables[value])
    else:
        periods = re.search(r"numberOfEvaluationPeriods: (\d+)", text)
        window = re.search(r"windowSize: '([^']+)'", text)
        assert window
        span = _duration(window.group(1)) * int(periods.group(1) if periods else 1)
    query = re.search(r"query: (loadTextContent\('([^']+)'\)|\w+)", text)
    assert query
    if query.group(2):
        kql = (MONITOR.parent / query.group(2)).read_text()
    else:
        assert query.group(1) == "unapprovedQuery"
        kql = (ROOT / "infra" / "monitor" / "alert-unapproved.kql").read_text()
        default = re.search(r"param alertHorizonMinutes int = (\d+)", module)
        assert default and "let horizon = 30m;" in kql
        kql = kql.replace("let horizon = 30m;", f"let horizon = {default.group(1)}m;")
    return kql, span


class Workspace:
    """The three custom tables in DuckDB; rows outside the rule's time range never reach the query."""

    def __init__(self) -> None:
        import duckdb_kql

        self.kql = duckdb_kql
        self.con = duckdb_kql.connect()  # TimeZone UTC
        self.now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        self.rows: dict[str, list[list[Any]]] = {s["table"]: [] for s in LAYOUT["streams"].values()}
        columns = ", ".join(f'"{c["name"]}" {_SQL_TYPES[c["type"]]}' for c in LAYOUT["columns"])
        for table in self.rows:
            self.con.sql(f'CREATE TABLE "{table}" ({columns})')

    def add(self, table: str, ago: dt.timedelta, kind: str, vm: str, record: dict[str, Any],
            event_ids: tuple[str, ...] = (), group: str = "rg-a") -> None:  # fmt: skip
        sub = uuid.uuid4()
        rid = f"/subscriptions/{sub}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/{vm}"
        self.rows[table].append([self.now - ago, str(uuid.uuid4()), kind, vm, vm + "-id", rid,
                                 json.dumps(list(event_ids)), json.dumps(record), None, 0, 1])  # fmt: skip

    def heartbeats(self, vm: str, last: dt.timedelta, interval: float = 300.0,
                   events: list[Any] | None = None, span: dt.timedelta = dt.timedelta(days=3),
                   group: str = "rg-a") -> None:  # fmt: skip
        beat = {"intervalSeconds": interval, **({} if events is None else {"events": events})}
        at = last
        while at <= span:
            self.add("SeBridgeRecords_CL", at, "heartbeat", vm, beat, group=group)
            at += dt.timedelta(seconds=interval)

    def run(self, rule: str) -> list[dict[str, Any]]:
        kql, span = alert_rule(rule)
        for table, rows in self.rows.items():
            self.con.sql(f'DELETE FROM "{table}"')
            kept = [row for row in rows if row[0] >= self.now - span]
            if kept:
                marks = ", ".join("?" * len(kept[0]))
                self.con.executemany(f'INSERT INTO "{table}" VALUES ({marks})', kept)
        result = self.kql.kql(self.con, kql)
        names = result.columns
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


def _event(
    event_id: str, starts_in: dt.timedelta, now: dt.datetime, status: str = "Scheduled"
) -> dict[str, Any]:
    return {"eventId": event_id, "eventType": "Redeploy", "eventStatus": status, "affectsThisVm": True,
            "notBefore": (now + starts_in).strftime("%Y-%m-%dT%H:%M:%SZ")}  # fmt: skip


def test_the_silent_agent_alert_reports_a_vm_silent_for_20_minutes() -> None:
    """Issue 34: with the default 300 s heartbeat the rule allowed 15 minutes of silence and looked
    back 15 minutes: a dead agent left no row to find, and the alert could never fire."""
    ws, minute = Workspace(), dt.timedelta(minutes=1)
    ws.heartbeats("vm-dead", last=20 * minute)
    ws.heartbeats("vm-alive", last=2 * minute)
    ws.heartbeats("vm-fast", last=4 * minute, interval=60.0, span=dt.timedelta(hours=3))  # 3 x 60 s allowed
    ws.add(
        "SeBridgeRecords_CL", 10 * minute, "scheduledEvents", "vm-changed", {"events": []}
    )  # no heartbeat: 15 min
    found = {row["Subject"]: row for row in ws.run("silent")}
    assert set(found) == {"vm-dead", "vm-fast"}
    assert found["vm-dead"]["Vms"] == 1 and found["vm-dead"]["SilentFor"] >= 20 * minute


def test_the_silent_agent_alert_stays_under_300_alerts_when_a_region_goes_quiet() -> None:
    """A log alert raises at most 300 alerts per evaluation: 400 silent VMs are reported by resource
    group instead, every one of them counted."""
    ws = Workspace()
    for n in range(400):
        beat = {"intervalSeconds": 300}
        ws.add(
            "SeBridgeRecords_CL", dt.timedelta(minutes=25), "heartbeat", f"vm-{n}", beat, group=f"rg-{n % 3}"
        )
    rows = ws.run("silent")
    assert len(rows) == 3 and sum(row["Vms"] for row in rows) == 400
    assert {row["Subject"] for row in rows} == {
        "resource group rg-0",
        "resource group rg-1",
        "resource group rg-2",
    }


def test_the_unapproved_alert_sees_an_event_announced_three_days_ahead() -> None:
    """Issue 34: the rule read 5 minutes of rows, and an event's only record is the change that
    announced it, days before (Azure gives up to 7 days' notice of some). Heartbeats now restate the
    open events; the rule reads 2 days and takes each VM's newest record."""
    ws = Workspace()
    day, minute = dt.timedelta(days=1), dt.timedelta(minutes=1)
    cases = {
        "vm-far": ("E-FAR", 20 * minute),  # announced 3 days ago, starts in 20 min: alert
        "vm-approved": ("E-APPROVED", 20 * minute),
        "vm-prepared": ("E-PREPARED", 20 * minute),
        "vm-later": ("E-LATER", 3 * 60 * minute),  # beyond the 30 min horizon
    }
    for vm, (event_id, starts_in) in cases.items():
        event = _event(event_id, starts_in, ws.now)
        ws.add("SeBridgeRecords_CL", 3 * day, "scheduledEvents", vm, {"events": [event]}, (event_id,))
        ws.heartbeats(vm, last=3 * minute, events=[event])
    ws.add(
        "SeBridgeApprovals_CL",
        10 * minute,
        "approval",
        "vm-approved",
        {"outcome": "approved"},
        ("E-APPROVED",),
    )
    ws.add(
        "SeBridgeRecords_CL",
        5 * minute,
        "preparation",
        "vm-prepared",
        {"eventId": "E-PREPARED", "result": "prepared"},
    )
    # An older agent's heartbeats carry no events: its newest scheduledEvents record speaks for it.
    ws.add(
        "SeBridgeRecords_CL",
        day,
        "scheduledEvents",
        "vm-old-agent",
        {"events": [_event("E-OLD", 10 * minute, ws.now)]},
    )
    ws.heartbeats("vm-old-agent", last=minute)
    # Started since: the newest record says so.
    ws.add(
        "SeBridgeRecords_CL",
        day,
        "scheduledEvents",
        "vm-started",
        {"events": [_event("E-GO", 10 * minute, ws.now)]},
    )
    ws.heartbeats("vm-started", last=minute, events=[_event("E-GO", 10 * minute, ws.now, status="Started")])
    found = {row["Subject"]: row for row in ws.run("unapproved")}
    assert set(found) == {"vm-far E-FAR", "vm-old-agent E-OLD"}
    assert 18 <= found["vm-far E-FAR"]["MinutesLeft"] <= 20


def test_the_unapproved_alert_reports_a_wave_as_one_alert() -> None:
    """A wave of 400 VMs would be 400 alerts, past the 300 a log alert raises per evaluation (the
    rest dropped): past 250 rows, one row per event type and quarter hour, counting every VM."""
    ws = Workspace()
    for n in range(400):
        event = _event(f"E-{n}", dt.timedelta(minutes=20), ws.now)
        ws.heartbeats(f"vm-{n}", last=dt.timedelta(minutes=2), events=[event], span=dt.timedelta(minutes=30))
    rows = ws.run("unapproved")
    assert 1 <= len(rows) <= 2 and sum(row["Vms"] for row in rows) == 400  # one quarter hour, or two
    # (duckdb-kql 1.1.2 ignores make_list's size limit, which Kusto applies: the sample's size is
    # Kusto's business, not checked here.)
    assert all(row["Subject"].startswith("Redeploy from ") and row["Sample"] for row in rows)


def test_a_record_split_into_parts_is_joined_back_whole_in_order() -> None:
    """Issue 34: the documented rejoin concatenated the parts in whatever order make_list saw them,
    and the sink cut its parts at byte offsets, through a character (a cut 'é' or emoji became lone
    surrogates). The sink now cuts between characters; infra/monitor/records-rejoined.kql orders the
    parts by PartIndex, drops repeats (at-least-once) and waits for every part."""
    from bridge.sinks.logsingestion import MAX_FIELD_BYTES, rows_of

    long = {"recordId": "R-LONG", "observedAt": "2026-11-27T10:00:00Z", "recordType": "scheduledEvents",
            "vm": {"name": "vm-a"}, "raw": {"Description": "é🛠x" * 40_000}}  # fmt: skip
    rows = rows_of(long)
    assert len(rows) >= 4 and all(len(r["RecordText"].encode("utf-8")) <= MAX_FIELD_BYTES for r in rows)
    broken = rows_of({**long, "recordId": "R-MISSING"})[1:]  # part 0 never arrived
    ws = Workspace()
    for row in [*reversed(rows), rows[1], *broken]:  # out of order, one part twice
        ws.rows["SeBridgeRecords_CL"].append([
            ws.now, row["RecordId"], row["RecordType"], row["VmName"], row["VmId"], row["VmResourceId"],
            json.dumps(row["EventIds"]), None, row["RecordText"], row["PartIndex"], row["PartCount"],
        ])  # fmt: skip
    kql = (ROOT / "infra" / "monitor" / "records-rejoined.kql").read_text()
    table = ws.rows["SeBridgeRecords_CL"]
    ws.con.executemany(f'INSERT INTO "SeBridgeRecords_CL" VALUES ({", ".join("?" * 11)})', table)
    result = ws.kql.kql(ws.con, kql)
    found = [dict(zip(result.columns, row, strict=True)) for row in result.fetchall()]
    assert [row["RecordId"] for row in found] == ["R-LONG"]
    assert json.loads(found[0]["Record"]) == long


@pytest.mark.parametrize("rule", ["unapproved", "silent"])
def test_no_alert_query_looks_further_back_than_its_rule_lets_it(rule: str) -> None:
    """Issue 34: an `ago(7d)` in a rule that reads 15 minutes finds nothing older than 15 minutes
    (ARM does not widen the range for `ago()` as the portal does). Every `ago()` of a rule's query
    fits the time range the rule gives it, which is at most 2 days."""
    kql, span = alert_rule(rule)
    assert span <= dt.timedelta(days=2)
    units = {"d": "days", "h": "hours", "m": "minutes"}
    reaches = [dt.timedelta(**{units[u]: int(n)}) for n, u in re.findall(r"\bago\((\d+)([dhm])\)", kql)]
    assert reaches and max(reaches) <= span, (rule, max(reaches), span)
