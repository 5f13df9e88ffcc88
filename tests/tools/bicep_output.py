"""Evaluate one output of a Bicep file for given parameters, e.g. ``deploy/vm-extension.bicep``'s
``settings`` (what the installer renders into config.toml), so tests check what a deployment really
produces. Run with the infrastructure venv (pycep): ``python bicep_output.py FILE OUTPUT PARAMS_JSON``.

A mock of the Bicep compiler for the subset these files use to build settings: literals, string
interpolation, object and array literals, parameters (with defaults) and variables, ``for``
expressions over an array, the ternary and ``==``/``!``, and ``union``, ``concat``, ``empty``,
``json``, ``string``. pycep's JSON form writes an
identifier and a string literal alike, so a bare string that names a parameter or variable is read as
that reference (no settings literal of these files equals one of their symbol names); a dotted one
(``identity.clientId``, ``${vault.properties.vaultUri}``) walks the symbol's object. A resource's
runtime properties (what Azure fills in: a vault's URI) come from the parameters' ``__resources__``
object, as the test states them. Anything else raises, so an expression this does not understand
fails the test instead of being guessed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from pycep import BicepParser


class Evaluator:
    def __init__(self, tree: dict[str, Any], params: dict[str, Any]) -> None:
        self.tree, self.params, self.cache = tree, params, {}
        self.locals: dict[str, Any] = {}  # a `for` expression's item

    def symbol(self, name: str) -> Any:
        if name in self.locals:
            return self.locals[name]
        if name in self.cache:
            return self.cache[name]
        if name in self.params:
            value = self.params[name]
        elif name in self.tree["parameters"]:
            if "default" not in self.tree["parameters"][name]:
                raise KeyError(f"parameter {name} has no default and was not given")
            value = self.eval(self.tree["parameters"][name]["default"])
        else:
            value = self.eval(self.tree["variables"][name]["value"])
        self.cache[name] = value
        return value

    def is_symbol(self, name: str) -> bool:
        return (
            name in self.locals
            or name in self.params
            or name in self.tree["parameters"]
            or name in self.tree["variables"]
            or name in self.params.get("__resources__", {})
        )

    def path(self, dotted: str) -> Any:
        head, *rest = dotted.split(".")
        resources = self.params.get("__resources__", {})
        value = (
            resources[head] if head in resources and head not in self.tree["variables"] else self.symbol(head)
        )
        for part in rest:
            value = value[part]
        return value

    def eval(self, node: Any) -> Any:
        if isinstance(node, str):
            if self.is_symbol(node.split(".")[0]) and re.fullmatch(r"[A-Za-z_][\w.]*", node):
                return self.path(node)
            return re.sub(r"\$\{([A-Za-z_][\w.]*)\}", lambda m: str(self.path(m.group(1))), node)
        if isinstance(node, (bool, int, float)) or node is None:
            return node
        if isinstance(node, list):
            return [self.eval(x) for x in node]
        if "loop_type" in node:  # [for item in array: config]
            detail = node["loop_type"]["detail"]
            out = []
            for item in self.eval(detail["array_name"]):
                self.locals[detail["item_name"]] = item
                try:
                    out.append(self.eval(node["config"]))
                finally:
                    del self.locals[detail["item_name"]]
            return out
        if "function" in node:
            function = node["function"]
            return self.call(function["type"], [self.eval(a) for a in function["parameters"].values()])
        if "operator" in node:
            return self.operator(node["operator"]["type"], node["operator"]["operands"])
        return {k: self.eval(v) for k, v in node.items()}

    def call(self, name: str, args: list[Any]) -> Any:
        if name == "union":
            out: dict[str, Any] = {}
            for a in args:
                out.update(a)
            return out
        if name == "concat":
            return [x for a in args for x in a]
        if name == "empty":
            return not args[0]
        if name == "json":
            return json.loads(args[0])
        if name == "string":
            return json.dumps(args[0])
        raise NotImplementedError(f"function {name}")

    def operator(self, kind: str, operands: dict[str, Any]) -> Any:
        if kind == "conditional":
            branch = "true_value" if self.eval(operands["condition"]) else "false_value"
            return self.eval(operands[branch])
        if kind == "equals":
            return self.eval(operands["operand_1"]) == self.eval(operands["operand_2"])
        if kind == "not_equals":
            return self.eval(operands["operand_1"]) != self.eval(operands["operand_2"])
        if kind in ("logical_not", "not"):
            return not self.eval(operands["bool_value"])
        raise NotImplementedError(f"operator {kind}")


def main() -> int:
    path, output, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    # The LALR tables cached in the tools' environment (infra/tools/bicep_lint.py says why not /tmp).
    parser = BicepParser(cache=str(Path(sys.prefix) / "pycep-lark.cache"))  # type: ignore[arg-type]
    tree = parser.parse(text=Path(path).read_text())
    value = Evaluator(tree, params).eval(tree["outputs"][output]["value"])
    print(json.dumps(value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
