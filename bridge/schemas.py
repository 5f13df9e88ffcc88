"""JSON Schemas of every record, and validation against them (``se-bridge validate``, tests).

``schemas/`` at the top of the repository is the source of truth; the wheel carries a copy inside
the package (``bridge/schemas/``, see pyproject.toml).

Validation uses ``jsonschema-rs`` (Draft 2020-12, formats checked), imported lazily: the agent never
validates on its hot path, it builds records that the test suite proves valid. The approver validates
every decision it reads, and there the pure-Python ``jsonschema`` cost 360 us per decision (measured
with ``timeit`` on this repository's decision schema), a fifth of the fleet approver's CPU per
decision in ``bench/fleet_bench.py``'s burst; ``jsonschema-rs`` checks the same schema in about 3 us.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeAlias

import orjson

#: A JSON value as orjson reads and writes it: what records, decisions and relay bodies are made of.
#: The contract modules (relay_api, the agent's relay, records) type their JSON with it instead of
#: ``Any`` (mypy's disallow_any_explicit holds there: issue 32).
JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
#: A JSON object.
JsonObject: TypeAlias = "dict[str, JsonValue]"


def json_list(items: Iterable[JsonValue]) -> list[JsonValue]:
    """``items`` as a JSON array (a ``list[str]`` is no ``list[JsonValue]`` to mypy: lists are
    invariant; an iterable is not)."""
    return list(items)


def json_object(fields: Mapping[str, JsonValue]) -> JsonObject:
    """``fields`` as a JSON object (a ``dict[str, str]`` is no ``JsonObject`` to mypy, a mapping is)."""
    return dict(fields)


# recordType -> schema file. Every record the bridge writes or reads has one.
SCHEMAS = {
    "scheduledEvents": "record.v1.schema.json",
    "approval": "approval.v1.schema.json",
    "decision": "decision.v1.schema.json",
    "preparation": "preparation.v1.schema.json",
    "heartbeat": "heartbeat.v1.schema.json",
    "impact": "impact.v1.schema.json",
    "azureScheduledEvent": "azure-event.v1.schema.json",
    "reconciliation": "reconciliation.v1.schema.json",
}


def schema_path(filename: str) -> Path:
    packaged = resources.files("bridge") / "schemas" / filename
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "schemas" / filename


@cache
def load_schema(filename: str) -> dict[str, Any]:
    schema: dict[str, Any] = orjson.loads(schema_path(filename).read_bytes())
    return schema


@cache
def _validator(filename: str, part: str | None = None) -> Any:
    import jsonschema_rs

    schema = load_schema(filename)
    jsonschema_rs.meta.validate(schema)  # a broken schema fails loudly, not as "everything valid"
    if part is not None:  # one property's own schema (self-contained: no references out of it)
        schema = {"$schema": schema["$schema"], **schema["properties"][part]}
    return jsonschema_rs.Draft202012Validator(schema, validate_formats=True)


def validate_record(record: object) -> list[str]:
    """Every schema violation of ``record`` as readable text (empty list: valid)."""
    if not isinstance(record, dict):
        return ["record is not a JSON object"]
    filename = SCHEMAS.get(record.get("recordType"))  # type: ignore[arg-type]
    if filename is None:
        return [f"unknown recordType {record.get('recordType')!r} (known: {', '.join(SCHEMAS)})"]
    return validate_document(record, filename)


def validate_document(document: object, filename: str, part: str | None = None) -> list[str]:
    """Every violation of ``document`` against the schema in ``filename`` (or against the schema of
    its property ``part``: a block a caller hands in to be copied into a record), as readable text."""
    validator = _validator(filename, part)
    if validator.is_valid(document):
        return []
    errors = sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.instance_path])
    return [f"{'/'.join(map(str, e.instance_path)) or '<root>'}: {e.message}" for e in errors]
