"""Counts of the code's shape for docs/architecture.md (issue 32), measured the same way every time.

* explicit ``Any``: names ``Any`` in bridge/'s syntax trees outside imports (annotations, casts);
* ``dict[str, Any]``: occurrences of that annotation;
* classes over 300 lines outside the IMDS emulator (a test double of Azure, not product code);
* modules at the root of bridge/;
* setting names declared in more than one config class (and of those, with different types).

Run it: ``.venv/bin/python tests/codecounts.py [bridge-dir]``.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

CONFIG_CLASSES = ("AgentConfig", "ApproverConfig", "ConsoleConfig", "AzureChannelConfig")


def counts(root: Path) -> dict[str, int]:
    any_names = dict_any = 0
    big: list[str] = []
    fields: dict[str, dict[str, str]] = defaultdict(dict)  # name -> class -> annotation
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        imports = {id(n) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for n in node.names}
        for node in ast.walk(tree):
            is_name = isinstance(node, ast.Name) and node.id == "Any" and id(node) not in imports
            if is_name or (isinstance(node, ast.Attribute) and node.attr == "Any"):
                any_names += 1
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 300 and "emulator" not in path.parts:
                    big.append(f"{path.name}:{node.name}")
                if node.name in CONFIG_CLASSES or node.name.endswith("Settings"):
                    for item in node.body:
                        annotation = ast.unparse(item.annotation) if isinstance(item, ast.AnnAssign) else ""
                        if (
                            isinstance(item, ast.AnnAssign)
                            and isinstance(item.target, ast.Name)
                            and not (annotation.startswith("ClassVar"))
                        ):
                            fields[item.target.id][node.name] = ast.unparse(item.annotation)
        dict_any += source.count("dict[str, Any]")
    repeated = {name: by for name, by in fields.items() if len(by) > 1}
    return {
        "explicit Any": any_names,
        "dict[str, Any]": dict_any,
        "classes over 300 lines": len(big),
        "modules at the root of bridge/": len(list(root.glob("*.py"))),
        "settings declared in more than one class": len(repeated),
        "of them with different types": sum(1 for by in repeated.values() if len(set(by.values())) > 1),
    }


if __name__ == "__main__":
    for key, value in counts(Path(sys.argv[1] if len(sys.argv) > 1 else "bridge")).items():
        print(f"{key}: {value}")
