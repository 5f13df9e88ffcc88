"""JSON Schemas of every record, and validation against them (``se-bridge validate``, tests).

``schemas/`` at the top of the repository is the source of truth; the wheel carries a copy inside
the package (``bridge/schemas/``, see pyproject.toml). ``jsonschema`` is imported lazily: the agent
never validates on its hot path, it builds records that the test suite proves valid.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

# recordType -> schema file. Every record the bridge writes or reads has one.
SCHEMAS = {
    "scheduledEvents": "record.v1.schema.json",
    "approval": "approval.v1.schema.json",
    "decision": "decision.v1.schema.json",
    "preparation": "preparation.v1.schema.json",
}


def schema_path(filename: str) -> Path:
    packaged = resources.files("bridge") / "schemas" / filename
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "schemas" / filename


@cache
def load_schema(filename: str) -> dict[str, Any]:
    return orjson.loads(schema_path(filename).read_bytes())


@cache
def _validator(filename: str) -> Any:
    from jsonschema import Draft202012Validator

    schema = load_schema(filename)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def validate_record(record: Any) -> list[str]:
    """Every schema violation of ``record`` as readable text (empty list: valid)."""
    if not isinstance(record, dict):
        return ["record is not a JSON object"]
    filename = SCHEMAS.get(record.get("recordType"))  # type: ignore[arg-type]
    if filename is None:
        return [f"unknown recordType {record.get('recordType')!r} (known: {', '.join(SCHEMAS)})"]
    return validate_document(record, filename)


def validate_document(document: Any, filename: str) -> list[str]:
    """Every violation of ``document`` against the schema in ``filename``, as readable text."""
    errors = sorted(
        _validator(filename).iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path]
    )
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]
