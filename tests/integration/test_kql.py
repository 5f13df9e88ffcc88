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

import json
import os
import re
import shutil
import subprocess
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
    return {
        f"alert {p.stem}": p.read_text() for p in sorted((ROOT / "infra" / "monitor").glob("alert-*.kql"))
    }


def test_data_explorer_setup_and_dashboard_have_no_errors() -> None:
    tables, functions, queries = adx()
    assert len(queries) >= 8
    errors = check(tables, functions, queries)
    assert {name: found for name, found in errors.items() if found} == {}


def test_the_dcr_transform_the_workbook_and_the_alerts_have_no_errors() -> None:
    stream_schema = "(" + ", ".join(f"{c['name']}: {c['type']}" for c in LAYOUT["columns"]) + ")"
    queries = {"dcr transform": LAYOUT["transformKql"], **workbook_queries(), **alert_queries()}
    assert len(workbook_queries()) >= 6 and len(alert_queries()) == 2
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
