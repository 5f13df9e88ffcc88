"""Regenerate ``infra/tools/bicep-types-index.json``: what Microsoft's type definitions say about the
resource types the templates use, and nothing else (issue 34).

Why: the Bicep lint (``bicep_lint.py``) checked references, secrets and some limits, not property names,
enums or read-only properties, and nothing here can run the Bicep CLI. Microsoft publishes the types the
CLI checks against in ``Azure/bicep-types-az`` (``generated/<service>/<namespace>/<api>/types.json``,
generated from azure-rest-api-specs). That repository is large; the index keeps, for each
``type@apiVersion`` a template names, the types reachable from its body: objects (property names,
read-only / required flags, whether other names are allowed), arrays, string enums (a union of literals) and
discriminated objects. The source commit is written into the file.

    python infra/tools/bicep_types_index.py /path/to/bicep-types-az [infra deploy]

Run it after pinning a new api-version in a template (the lint reports a ``type@apiVersion`` the index
does not have). It needs a checkout (or a bare clone: files are read with ``git show``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = Path(__file__).with_name("bicep-types-index.json")
RESOURCE = re.compile(r"^resource \w+ '([^'@]+)@([^']+)'", re.M)
# bicep-types property flags
READ_ONLY, REQUIRED = 2, 1


def template_types(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for file in sorted(path.rglob("*.bicep")) if path.is_dir() else [path]:
            found |= {f"{t}@{v}" for t, v in RESOURCE.findall(file.read_text(encoding="utf-8"))}
    return found


class Source:
    """The bicep-types-az repository, read through git (works on a bare mirror)."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.commit = self._git("rev-parse", "HEAD").strip()
        self.files = [
            f for f in self._git("ls-tree", "-r", "--name-only", "HEAD", "generated").splitlines()
            if f.endswith("/types.json")
        ]  # fmt: skip
        self._loaded: dict[str, list[dict[str, Any]]] = {}

    def _git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.repo), *args], check=True, capture_output=True, text=True
        ).stdout

    def load(self, file: str) -> list[dict[str, Any]]:
        if file not in self._loaded:
            self._loaded[file] = json.loads(self._git("show", f"HEAD:{file}"))
        return self._loaded[file]

    def find(self, resource: str) -> tuple[str, int] | None:
        """The file and index of ``resource``'s ResourceType (names compared case-insensitively)."""
        kind, version = resource.split("@")
        folder = f"/{kind.split('/')[0].lower()}/{version.lower()}/types.json"
        for file in self.files:
            if not file.lower().endswith(folder):
                continue
            for n, node in enumerate(self.load(file)):
                if node.get("$type") == "ResourceType" and node["name"].lower() == resource.lower():
                    return file, n
        return None


class Index:
    """Types reachable from the resources' bodies, renamed ``<file number>:<index>``."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.files: list[str] = []
        self.types: dict[str, dict[str, Any]] = {}

    def ref(self, file: str, pointer: dict[str, str]) -> str:
        index = int(pointer["$ref"].rsplit("/", 1)[1])
        if file not in self.files:
            self.files.append(file)
        key = f"{self.files.index(file)}:{index}"
        if key not in self.types:
            self.types[key] = {}  # placeholder: types may be recursive
            self.types[key] = self.node(file, self.source.load(file)[index])
        return key

    def node(self, file: str, raw: dict[str, Any]) -> dict[str, Any]:
        kind = raw["$type"]
        if kind == "ObjectType":
            props = {
                name: {"t": self.ref(file, p["type"]), "f": p.get("flags", 0)}
                for name, p in raw.get("properties", {}).items()
            }
            extra = raw.get("additionalProperties")
            return {"k": "o", "p": props, "a": self.ref(file, extra) if extra else None}
        if kind == "ArrayType":
            return {"k": "a", "i": self.ref(file, raw["itemType"])}
        if kind == "StringLiteralType":
            return {"k": "e", "v": [raw["value"]]}
        if kind == "UnionType":
            members = [self.source.load(file)[int(e["$ref"].rsplit("/", 1)[1])] for e in raw["elements"]]
            if all(m["$type"] == "StringLiteralType" for m in members):
                return {"k": "e", "v": sorted(m["value"] for m in members)}
            return {"k": "x"}  # an open enum (`'A' | 'B' | string`) or a mixed union: any value
        if kind == "DiscriminatedObjectType":
            base = {
                name: {"t": self.ref(file, p["type"]), "f": p.get("flags", 0)}
                for name, p in raw.get("baseProperties", {}).items()
            }
            cases = {value: self.ref(file, ref) for value, ref in raw["elements"].items()}
            return {"k": "d", "by": raw["discriminator"], "p": base, "c": cases}
        return {"k": "x"}  # strings, numbers, booleans, any


def build(repo: Path, paths: list[Path]) -> dict[str, Any]:
    source = Source(repo)
    index = Index(source)
    resources: dict[str, str | None] = {}
    for resource in sorted(template_types(paths)):
        found = source.find(resource)
        if found is None:
            resources[resource] = None  # unknown to Microsoft's types: the lint reports it
            continue
        file, n = found
        body = source.load(file)[n]["body"]
        resources[resource] = index.ref(file, body)
    return {
        "description": "Generated by infra/tools/bicep_types_index.py from Azure/bicep-types-az: for each "
        "type@apiVersion the templates use, the types reachable from its body (k: o object with p "
        "properties {t type, f flags: 1 required, 2 read-only} and a the type of other names or null; "
        "a array of i; e enum of v; d discriminated by 'by' with base p and cases c; x anything).",
        "source": {"repository": "Azure/bicep-types-az", "commit": source.commit},
        "files": index.files,
        "resources": resources,
        "types": index.types,
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    paths = [Path(p) for p in argv[1:]] or [ROOT / "infra", ROOT / "deploy"]
    data = build(Path(argv[0]), paths)
    OUTPUT.write_text(json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n")
    missing = [r for r, t in data["resources"].items() if t is None]
    print(f"{OUTPUT.name}: {len(data['resources'])} resource types, {len(data['types'])} types"
          + (f"; not in bicep-types-az: {', '.join(missing)}" if missing else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
