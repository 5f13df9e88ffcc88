"""Static checks of Bicep files that need no Azure and no Bicep CLI: parse, references, modules, secrets.

Why this exists: nothing in CI can run ``az deployment`` or ``bicep build``, yet a misspelt parameter,
a module output that does not exist, a file that ``loadTextContent`` cannot find, or a secret that
leaks into public extension settings or an output would only show up at deployment time. This tool
parses each file with pycep-parser (the parser checkov uses) and walks the raw syntax tree, where an
identifier (a reference) and a quoted string (a literal) are still different tokens; pycep's JSON form
loses that difference.

Checks per file:

* it parses;
* every identifier refers to a declared parameter, variable, resource, module or loop/lambda variable
  (also inside ``${...}`` interpolations), and every declared parameter and variable is used;
* every module path exists, every parameter passed to a module is declared there, every required
  module parameter (no default) is passed, and every ``module.outputs.X`` is an output of the module;
* every file named by ``loadTextContent``/``loadJsonContent``/``loadFileAsBase64`` exists;
* every ``@secure()`` parameter flows only into ``protectedSettings`` (VM extensions), a Logic App's
  workflow ``properties.parameters``, or a ``@secure()`` parameter of a module; never into an output
  or any other property;
* every resource's ``type@apiVersion`` is one Microsoft's type definitions know, and its body names
  only properties the type has, sets none of the read-only ones, and gives enum properties a value of
  the enum where it is a literal (``bicep-types-index.json``, derived from Azure/bicep-types-az by
  ``bicep_types_index.py``; issue 34: a misspelt property deployed, or failed, only in Azure).

Run it with the infrastructure tools environment (``make test`` creates ``.venv-infra``)::

    .venv-infra/bin/python infra/tools/bicep_lint.py infra deploy

It prints a JSON report ``{"files": {path: {"errors": [...], "resources": [...], ...}}}`` and exits 1
when any file has an error.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lark import Token, Tree
from pycep import BicepParser

# Building pycep's LALR tables takes ~30 s, loading them ~0.7 s: they are cached, but in the tools'
# virtual environment, not lark's default (a pickle in the world-writable temp directory, where
# another user's file would be loaded, and run, as ours). lark checks the grammar's hash on load.
PARSER = BicepParser(cache=str(Path(sys.prefix) / "pycep-lark.cache"))  # type: ignore[arg-type]
LOAD_FUNCTIONS = {"load_text_content", "load_json_content", "load_yaml_content", "load_file_as_base64"}
# Functions whose result is built from their arguments' structure: a secret inside an argument object
# stays at the same place in the result (union merges objects, the others choose one argument).
STRUCTURAL_FUNCTIONS = {"union", "coalesce"}
TYPES = json.loads(Path(__file__).with_name("bicep-types-index.json").read_text())
# What a resource declaration may hold beside its type's properties: Bicep's own keywords.
BICEP_KEYWORDS = {"parent", "scope", "dependsOn"}


@dataclass
class BicepFile:
    path: Path
    tree: Tree[Token]
    params: dict[str, Tree[Token]] = field(default_factory=dict)  # name -> param element
    variables: dict[str, Any] = field(default_factory=dict)  # name -> value tree
    resources: dict[str, Tree[Token]] = field(default_factory=dict)
    modules: dict[str, Tree[Token]] = field(default_factory=dict)
    outputs: dict[str, Tree[Token]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)

    @property
    def symbols(self) -> set[str]:
        return set(self.params) | set(self.variables) | set(self.resources) | set(self.modules)

    def secure_params(self) -> set[str]:
        return {name for name, element in self.params.items() if _has_decorator(element, "deco_secure")}

    def required_params(self) -> set[str]:
        return {name for name, element in self.params.items() if element.children[3] is None}

    def line(self, node: Any) -> int:
        meta = getattr(node, "meta", None)
        if meta is not None and not getattr(meta, "empty", True):
            return int(meta.line)
        if isinstance(node, Token) and node.line is not None:
            return int(node.line)
        return 0


def _has_decorator(element: Tree[Token], kind: str) -> bool:
    decorator = element.children[0]
    return isinstance(decorator, Tree) and any(
        isinstance(d, Tree) and d.data == kind for d in decorator.children
    )


def _name(token: Any) -> str:
    return str(token).strip("'")


def load(path: Path) -> BicepFile:
    tree = PARSER.lark_parser.parse(path.read_text(encoding="utf-8"))
    bicep = BicepFile(path, tree)
    for element in tree.children:
        if not isinstance(element, Tree):
            continue
        kind = element.data
        if kind in ("param", "var", "output", "resource", "module"):
            name = str(element.children[1])
            table = {
                "param": bicep.params,
                "var": bicep.variables,
                "output": bicep.outputs,
                "resource": bicep.resources,
                "module": bicep.modules,
            }[kind]
            # Outputs have their own namespace (`output location string = location` is fine).
            if (name in bicep.outputs) if kind == "output" else (name in bicep.symbols):
                bicep.errors.append(f"line {bicep.line(element)}: {name!r} is declared twice")
            table[name] = element.children[2] if kind == "var" else element
    return bicep


# -- interpolations ----------------------------------------------------------------------------------


def interpolations(literal: str) -> Iterator[str]:
    """The expressions inside ``${...}`` of a quoted Bicep string (nested braces and strings allowed)."""
    text = literal[1:-1]
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith("${", i):
            depth, j, quoted = 1, i + 2, False
            while j < len(text) and depth:
                c = text[j]
                if c == "\\":
                    j += 2
                    continue
                if c == "'":
                    quoted = not quoted
                elif not quoted and c == "{":
                    depth += 1
                elif not quoted and c == "}":
                    depth -= 1
                j += 1
            yield text[i + 2 : j - 1]
            i = j
            continue
        i += 1


def parse_expression(expression: str) -> Any:
    tree = PARSER.lark_parser.parse(f"var interpolated = {expression}\n")
    element = next(c for c in tree.children if isinstance(c, Tree))
    return element.children[2]


# -- references --------------------------------------------------------------------------------------


def references(
    node: Any, bound: frozenset[str] = frozenset(), prop: bool = False
) -> Iterator[tuple[str, Any]]:
    """(identifier, node) for every reference in a value tree.

    ``prop``: the leftmost identifier of this subtree is a property name (the right side of ``a.b``),
    not a reference. The grammar parses ``a.b == c`` as ``a . (b == c)``, so only the leftmost leaf of
    the right operand is the property; the rest of it is an ordinary expression.
    """
    if node is None or isinstance(node, Token):
        return
    kind = node.data
    children = node.children
    if kind == "string":
        token = children[0]
        if token.type == "STRING":
            if not prop and str(token) not in bound:
                yield str(token), node
        elif token.type == "QUOTED_INTERPOLATION":
            for expression in interpolations(str(token)):
                for name, _ in references(parse_expression(expression), bound):
                    yield name, node  # the quoted string carries the line number
        return
    if kind in ("decorator", "key", "data_type", "type_api_pair", "module_path"):
        return
    if kind == "pair":
        yield from references(children[1], bound)
        return
    if kind == "child_resource":
        yield from references(children[-1], bound)
        return
    if kind in ("property_accessor", "nested_resource_accessor"):
        yield from references(children[0], bound, prop)
        yield from references(children[1], bound, True)
        return
    if kind == "index_accessor":
        yield from references(children[0], bound, prop)
        yield from references(children[1], bound)
        return
    if kind == "loop":
        head, condition, body = children
        names = {str(c) for c in head.children if isinstance(c, Token) and c.type == "STRING"}
        for value in head.children:
            if isinstance(value, Tree):
                yield from references(value, bound)
        inner = bound | names
        yield from references(condition, inner)
        yield from references(body, inner)
        return
    if kind == "filter":
        array, variable, expression = children
        yield from references(array, bound)
        yield from references(expression, bound | {str(variable)})
        return
    first = True
    for child in children:
        if isinstance(child, Tree):
            yield from references(child, bound, prop and first)
            first = False


def access_path(node: Any) -> list[str]:
    """Names along a property chain: ``a.outputs.x.y`` -> [a, outputs, x, y]."""
    if node is None or isinstance(node, Token):
        return []
    if node.data in ("property_accessor", "nested_resource_accessor"):
        return access_path(node.children[0]) + access_path(node.children[1])
    if node.data == "string":
        token = node.children[0]
        return [str(token)] if token.type == "STRING" else []
    if node.data == "index_accessor":
        return access_path(node.children[0])
    for child in node.children:
        if isinstance(child, Tree):
            return access_path(child)
    return []


def walk(node: Any) -> Iterator[Tree[Token]]:
    """Every subtree, including the expressions inside ``${...}`` interpolations."""
    if isinstance(node, Tree):
        yield node
        if node.data == "string" and node.children[0].type == "QUOTED_INTERPOLATION":
            for expression in interpolations(str(node.children[0])):
                yield from walk(parse_expression(expression))
        for child in node.children:
            yield from walk(child)


# -- checks --------------------------------------------------------------------------------------------


def body_object(value: Any) -> Tree[Token] | None:
    """The object of a resource or module value (plain, conditional or loop)."""
    if isinstance(value, Tree):
        if value.data == "object":
            return value
        if value.data in ("deploy_condition", "loop"):
            return body_object(value.children[-1])
    return None


def pairs(obj: Tree[Token] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if obj is None:
        return out
    for child in obj.children:
        if isinstance(child, Tree) and child.data == "pair":
            out[_name(child.children[0].children[0])] = child.children[1]
    return out


def check_references(bicep: BicepFile, files: dict[Path, BicepFile]) -> None:
    declared = bicep.symbols
    elements = [e for e in bicep.tree.children if isinstance(e, Tree)]
    for element in elements:
        if element.data not in ("param", "var", "output", "resource", "module"):
            continue
        value = element.children[-1]
        for name, node in references(value):
            bicep.used.add(name)
            if name not in declared:
                bicep.errors.append(
                    f"line {bicep.line(node)}: {name!r} is not a declared parameter, variable, "
                    f"resource or module (in {element.data} {element.children[1]})"
                )
        for node in walk(value):
            if node.data in LOAD_FUNCTIONS:
                target = node.children[0]
                literal = target.children[0] if isinstance(target, Tree) else target
                if isinstance(literal, Token) and literal.type == "QUOTED_INTERPOLATION":
                    loaded = (bicep.path.parent / _name(literal)).resolve()
                    if not loaded.is_file():
                        bicep.errors.append(
                            f"line {bicep.line(node)}: {node.data} of a missing file {loaded}"
                        )
            if node.data == "property_accessor":
                path = access_path(node)
                if len(path) >= 3 and path[0] in bicep.modules and path[1] == "outputs":
                    module = files.get(module_path(bicep, path[0]))
                    if module is not None and path[2] not in module.outputs:
                        bicep.errors.append(
                            f"line {bicep.line(node)}: module {path[0]} has no output {path[2]!r}"
                        )
    for kind, table in (("parameter", bicep.params), ("variable", bicep.variables)):
        for name in table:
            if name not in bicep.used:
                bicep.errors.append(f"{kind} {name!r} is declared but never used")


# -- documented service limits (docs: the Azure limits the deployment must respect) -------------------

#: Inline code of a Consumption (multitenant) Logic App: 1,024 characters (Standard: 100,000).
CONSUMPTION_INLINE_CODE_CHARS = 1024
CSE_TYPES = {"CustomScript", "CustomScriptExtension"}
EXTENSION_TYPES = {
    "microsoft.compute/virtualmachines/extensions",
    "microsoft.compute/virtualmachinescalesets/extensions",
}


def _resource_type(element: Tree[Token]) -> str:
    return _name(element.children[2].children[0]).split("@")[0].lower()


def _literal_text(node: Any) -> str | None:
    """A string literal's text (None for anything else, an interpolation included). pycep parses a
    bare identifier (a variable or parameter reference) as a ``string`` too, unquoted: not a literal."""
    if isinstance(node, Tree) and node.data == "string":
        token = str(node.children[0])
        if token.startswith("'") and "${" not in token:
            return _name(token)
    return None


def _walk_following_variables(
    bicep: BicepFile, node: Any, seen: frozenset[str] = frozenset()
) -> Iterator[Tree[Token]]:
    """Every subtree of ``node`` and of the variables it uses (a workflow definition is often one)."""
    yield from walk(node)
    for name, _ in references(node):
        if name in bicep.variables and name not in seen:
            seen = seen | {name}
            yield from _walk_following_variables(bicep, bicep.variables[name], seen)


def check_inline_code(bicep: BicepFile) -> None:
    """A Consumption workflow's inline code (an action's ``inputs.code``: a literal or a loaded file)
    longer than the platform takes fails the deployment: say so here."""
    for symbol, element in bicep.resources.items():
        if _resource_type(element) != "microsoft.logic/workflows":
            continue
        for node in _walk_following_variables(bicep, element.children[-1]):
            if node.data != "pair" or _name(node.children[0].children[0]) != "code":
                continue
            value, size = node.children[1], None
            if isinstance(value, Tree) and value.data == "function" and isinstance(value.children[0], Tree):
                call = value.children[0]
                if call.data == "load_text_content":
                    source = bicep.path.parent / (_literal_text(call.children[0]) or "")
                    size = len(source.read_text(encoding="utf-8")) if source.is_file() else None
            elif (text := _literal_following_variables(bicep, value)) is not None:
                size = len(text)  # a literal, or a variable holding one
            if size is not None and size > CONSUMPTION_INLINE_CODE_CHARS:
                bicep.errors.append(
                    f"line {bicep.line(node)}: inline code of {size} characters in workflow {symbol}: a "
                    f"Consumption Logic App takes at most {CONSUMPTION_INLINE_CODE_CHARS} (Standard 100,000)"
                )


def _mentions_cse(bicep: BicepFile, node: Any) -> bool:
    """Whether ``node`` (following variables) names a Custom Script extension type."""
    return any(_literal_text(sub) in CSE_TYPES for sub in _walk_following_variables(bicep, node))


def check_one_custom_script(bicep: BicepFile) -> None:
    """A VM or scale set takes one Custom Script extension: two in one template for the same parent
    fail (and one next to an existing bootstrap script replaces it: docs/deploy.md)."""
    per_parent: dict[str, list[str]] = {}
    for symbol, element in bicep.resources.items():
        if _resource_type(element) not in EXTENSION_TYPES or not _mentions_cse(bicep, element.children[-1]):
            continue
        parent = access_path(pairs(body_object(element.children[-1])).get("parent"))[:1]
        per_parent.setdefault(parent[0] if parent else f"(no parent: {symbol})", []).append(symbol)
    for parent, symbols in per_parent.items():
        if len(symbols) > 1:
            bicep.errors.append(
                f"{len(symbols)} Custom Script extensions for {parent} ({', '.join(symbols)}): a VM or "
                "scale set takes one"
            )


#: A VM Application version's install, update and remove commands: 4,096 characters each; its name
#: Major.Minor.Patch (Azure Compute Gallery "VM Applications overview" and its error messages).
VM_APP_COMMAND_CHARS = 4096
VM_APP_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


def _literal_following_variables(
    bicep: BicepFile, node: Any, seen: frozenset[str] = frozenset()
) -> str | None:
    """The text of ``node``: a literal, an interpolation of literal variables (``${name}``), or a
    variable holding either (None when any part is only known at deployment)."""
    if isinstance(node, Tree) and node.data == "string" and str(node.children[0]).startswith("'"):
        text = str(node.children[0])[1:-1]
        for name in set(re.findall(r"\$\{(\w+)\}", text)):
            if name not in bicep.variables or name in seen:
                return None
            value = _literal_following_variables(bicep, bicep.variables[name], seen | {name})
            if value is None:
                return None
            text = text.replace("${" + name + "}", value)
        return None if "${" in text else text
    names = access_path(node)
    if len(names) == 1 and names[0] in bicep.variables and names[0] not in seen:
        return _literal_following_variables(bicep, bicep.variables[names[0]], seen | {names[0]})
    return None


def check_vm_application(bicep: BicepFile) -> None:
    """A gallery application version whose commands are longer than the platform takes, or whose
    name is not Major.Minor.Patch, fails the deployment: say so here."""
    for symbol, element in bicep.resources.items():
        if _resource_type(element) != "microsoft.compute/galleries/applications/versions":
            continue
        body = pairs(body_object(element.children[-1]))
        name = _literal_following_variables(bicep, body.get("name"))
        if name is not None and not VM_APP_VERSION.match(name):
            bicep.errors.append(f"version {symbol}: name {name} is not Major.Minor.Patch")
        for node in walk(element.children[-1]):
            if node.data != "pair" or _name(node.children[0].children[0]) not in (
                "install",
                "update",
                "remove",
            ):
                continue
            text = _literal_following_variables(bicep, node.children[1])
            if text is not None and len(text) > VM_APP_COMMAND_CHARS:
                bicep.errors.append(
                    f"line {bicep.line(node)}: {_name(node.children[0].children[0])} command of {len(text)} "
                    f"characters in {symbol}: a VM Application takes at most {VM_APP_COMMAND_CHARS}"
                )


#: Days an Event Hubs tier keeps messages at most (Basic 1, Standard 7; Premium and Dedicated 90).
RETENTION_DAYS = {"basic": 1, "standard": 7, "premium": 90}


def _max_value(element: Tree[Token]) -> int | None:
    decorator = element.children[0]
    for d in decorator.children if isinstance(decorator, Tree) else []:
        if isinstance(d, Tree) and d.data == "deco_max_val":
            return int(str(d.children[0]))
    return None


def check_retention(bicep: BicepFile) -> None:
    """A hub of a namespace whose tier is written in the file keeps messages no longer than that tier
    allows: a literal, or a parameter whose @maxValue says so (a larger value fails the deployment)."""
    tiers = {
        symbol: _literal_text(pairs(body_object(pairs(body_object(e.children[-1])).get("sku"))).get("name"))
        for symbol, e in bicep.resources.items()
        if _resource_type(e) == "microsoft.eventhub/namespaces"
    }
    for symbol, element in bicep.resources.items():
        if _resource_type(element) != "microsoft.eventhub/namespaces/eventhubs":
            continue
        body = pairs(body_object(element.children[-1]))
        parent = access_path(body.get("parent"))[:1]
        limit = RETENTION_DAYS.get(str(tiers.get(parent[0]) if parent else "").lower())
        value = pairs(body_object(body.get("properties"))).get("messageRetentionInDays")
        if limit is None or value is None:
            continue
        if isinstance(value, Tree) and value.data == "int":
            days: int | None = int(str(value.children[0]))
        else:
            names = [n for n, _ in references(value)]
            days = (
                _max_value(bicep.params[names[0]]) if len(names) == 1 and names[0] in bicep.params else None
            )
            days = days if days is not None else 10**9  # unbounded: the tier's limit is not enforced
        if days > limit:
            shown = days if days < 10**9 else "unbounded"
            bicep.errors.append(
                f"hub {symbol}: messageRetentionInDays may be {shown}, but its namespace's tier keeps "
                f"messages at most {limit} days (bound the parameter with @maxValue)"
            )


def module_path(bicep: BicepFile, symbol: str) -> Path:
    return (bicep.path.parent / _name(bicep.modules[symbol].children[2].children[0])).resolve()


def check_modules(bicep: BicepFile, files: dict[Path, BicepFile]) -> None:
    for symbol, element in bicep.modules.items():
        target = module_path(bicep, symbol)
        module = files.get(target)
        if module is None:
            if not target.is_file():
                bicep.errors.append(f"module {symbol}: {target} does not exist")
            continue
        given = set(pairs(body_object(pairs(body_object(element.children[-1])).get("params"))))
        for name in sorted(given - set(module.params)):
            bicep.errors.append(f"module {symbol}: {target.name} has no parameter {name!r}")
        for name in sorted(module.required_params() - given):
            bicep.errors.append(f"module {symbol}: required parameter {name!r} of {target.name} is not given")


# -- secrets -------------------------------------------------------------------------------------------


def taint(bicep: BicepFile, node: Any, secure: set[str], seen: frozenset[str] = frozenset()) -> set[str]:
    """Secure parameters whose value may end up anywhere in ``node``'s value."""
    found: set[str] = set()
    for name, _ in references(node):
        if name in secure:
            found.add(name)
        elif name in bicep.variables and name not in seen:
            found |= taint(bicep, bicep.variables[name], secure, seen | {name})
    return found


def secret_flows(
    bicep: BicepFile, node: Any, path: list[str], secure: set[str], seen: frozenset[str] = frozenset()
) -> Iterator[tuple[str, list[str]]]:
    """(secure parameter, property path) for every place a secret lands, following objects, arrays,
    variables, conditionals and union() structurally; any other expression is opaque (whatever it
    reads lands at its own path)."""
    if node is None or isinstance(node, Token):
        return
    kind = node.data
    if kind == "object":
        for name, value in pairs(node).items():
            yield from secret_flows(bicep, value, [*path, name], secure, seen)
        return
    if kind == "array":
        for item in node.children:
            yield from secret_flows(bicep, item, [*path, "[]"], secure, seen)
        return
    if kind in ("loop", "deploy_condition"):
        yield from secret_flows(bicep, node.children[-1], path, secure, seen)
        for part in node.children[:-1]:
            for name in taint(bicep, part, secure, seen):
                yield name, path
        return
    if kind == "string" and node.children[0].type == "STRING":
        name = str(node.children[0])
        if name in secure:
            yield name, path
        elif name in bicep.variables and name not in seen:
            yield from secret_flows(bicep, bicep.variables[name], path, secure, seen | {name})
        return
    if kind == "operator" and isinstance(node.children[0], Tree) and node.children[0].data == "conditional":
        condition, when_true, when_false = node.children[0].children
        for name in taint(bicep, condition, secure, seen):
            yield name, path
        yield from secret_flows(bicep, when_true, path, secure, seen)
        yield from secret_flows(bicep, when_false, path, secure, seen)
        return
    if kind == "function" and node.children[0].data in STRUCTURAL_FUNCTIONS:
        for argument in node.children[0].children:
            yield from secret_flows(bicep, argument, path, secure, seen)
        return
    for name in taint(bicep, node, secure, seen):
        yield name, path


def check_secrets(bicep: BicepFile, files: dict[Path, BicepFile]) -> list[dict[str, str]]:
    secure = bicep.secure_params()
    flows: list[dict[str, str]] = []
    if not secure:
        return flows
    for symbol, element in bicep.resources.items():
        resource_type = _name(element.children[2].children[0]).split("@")[0]
        for name, path in secret_flows(bicep, element.children[-1], [], secure):
            where = ".".join(path)
            flows.append({"parameter": name, "to": f"resource {symbol} ({resource_type}) {where}"})
            allowed = (
                "protectedSettings" in path
                # a managed Run Command's protected parameters (encrypted like protectedSettings)
                or (
                    resource_type.endswith("/runCommands")
                    and path[:2] == ["properties", "protectedParameters"]
                )
                or (resource_type == "Microsoft.Logic/workflows" and path[:2] == ["properties", "parameters"])
                # a Key Vault secret's value: where secrets are meant to be
                or (resource_type == "Microsoft.KeyVault/vaults/secrets" and path == ["properties", "value"])
            )
            if not allowed:
                bicep.errors.append(
                    f"secure parameter {name!r} flows into {resource_type} {symbol} at {where or '(body)'}: "
                    "secrets belong in protectedSettings or a Key Vault secret"
                )
    for symbol, element in bicep.modules.items():
        module = files.get(module_path(bicep, symbol))
        module_secure = module.secure_params() if module else set()
        for name, path in secret_flows(bicep, element.children[-1], [], secure):
            flows.append({"parameter": name, "to": f"module {symbol} {'.'.join(path)}"})
            if not (len(path) == 2 and path[0] == "params" and path[1] in module_secure):
                bicep.errors.append(
                    f"secure parameter {name!r} flows into module {symbol} at {'.'.join(path)}, "
                    "which is not a @secure() parameter there"
                )
    for symbol, element in bicep.outputs.items():
        for name, _ in secret_flows(bicep, element.children[-1], [], secure):
            bicep.errors.append(f"secure parameter {name!r} flows into output {symbol!r}")
    return flows


# -- Microsoft's types -------------------------------------------------------------------------------


def check_types(bicep: BicepFile, index: dict[str, Any] = TYPES) -> None:
    """Each resource's body against its type (module docstring). Only literals are judged: an
    expression's value is Azure's to check."""
    for symbol, element in bicep.resources.items():
        resource = _name(element.children[2].children[0])
        known = {k.lower(): v for k, v in index["resources"].items()}
        if resource.lower() not in known:
            bicep.errors.append(
                f"line {bicep.line(element)}: {resource} is not in bicep-types-index.json "
                "(a new api-version? run infra/tools/bicep_types_index.py)"
            )
            continue
        if element.children[3] is not None or known[resource.lower()] is None:  # `existing`: a name
            continue
        # Bicep's own way to accept a property its types lack (BCP037), with the reason beside it.
        lines = bicep.path.read_text(encoding="utf-8").splitlines()
        allowed = {n + 2 for n, line in enumerate(lines) if "#disable-next-line BCP037" in line}
        body = body_object(element.children[-1])
        for problem in _against(body, known[resource.lower()], index, allowed=allowed, top=True):
            bicep.errors.append(f"line {bicep.line(element)}: {symbol} ({resource}): {problem}")


def _keys(obj: Tree[Token]) -> Iterator[tuple[str, int, Any]]:
    """An object literal's properties: name, line, value."""
    for child in obj.children:
        if isinstance(child, Tree) and child.data == "pair":
            token = child.children[0].children[0]
            yield _name(token), getattr(token, "line", 0), child.children[1]


def _against(
    value: Any, key: str, index: dict[str, Any], path: str = "", allowed: set[int] | None = None,
    top: bool = False,
) -> Iterator[str]:  # fmt: skip
    node = index["types"][key]
    allowed = allowed or set()
    if not isinstance(value, Tree):
        return
    if (
        value.data == "operator"
        and value.children
        and getattr(value.children[0], "data", "") == "conditional"
    ):
        for branch in value.children[0].children[1:]:  # both values of `c ? a : b`
            yield from _against(branch, key, index, path, allowed)
        return
    if value.data == "object" and node["k"] in ("o", "d"):
        given = pairs(value)
        props = dict(node["p"])
        if node["k"] == "d":
            case = _literal_text(given.get(node["by"]))
            chosen = node["c"].get(case) if case is not None else None
            if chosen is None:
                if case is not None:
                    yield f"{path}{node['by']}: {case!r} is none of {sorted(node['c'])}"
                return  # the case is an expression: the base properties alone cannot say
            props |= index["types"][chosen]["p"]
            extra = index["types"][chosen]["a"]
        else:
            extra = node["a"]
        for name, line, item in _keys(value):
            if (top and name in BICEP_KEYWORDS) or line in allowed:
                continue
            prop = props.get(name) or next((p for n, p in props.items() if n.lower() == name.lower()), None)
            if prop is None:
                if extra is None:
                    yield f"{path}{name}: no such property (has: {', '.join(sorted(props)[:40])})"
                else:
                    yield from _against(item, extra, index, f"{path}{name}.", allowed)
                continue
            if prop["f"] & 2:
                yield f"{path}{name}: read-only, Azure sets it"
                continue
            yield from _against(item, prop["t"], index, f"{path}{name}.", allowed)
    elif value.data == "array" and node["k"] == "a":
        for item in value.children:
            yield from _against(item, node["i"], index, path.rstrip(".") + "[].", allowed)
    elif value.data == "loop" and node["k"] == "a":
        yield from _against(value.children[-1], node["i"], index, path.rstrip(".") + "[].", allowed)
    elif node["k"] == "e":
        text = _literal_text(value)
        if text is not None and text.lower() not in {v.lower() for v in node["v"]}:
            yield f"{path.rstrip('.')}: {text!r} is none of {node['v'][:20]}"


def lint(paths: list[Path]) -> dict[str, Any]:
    files: dict[Path, BicepFile] = {}
    report: dict[str, Any] = {"files": {}}
    for path in paths:
        try:
            files[path.resolve()] = load(path)
        except Exception as exc:  # any parse error of lark or pycep
            report["files"][str(path)] = {"errors": [f"does not parse: {str(exc).strip()[:800]}"]}
    for bicep in files.values():
        check_references(bicep, files)
        check_modules(bicep, files)
        check_inline_code(bicep)
        check_one_custom_script(bicep)
        check_retention(bicep)
        check_vm_application(bicep)
        check_types(bicep)
        flows = check_secrets(bicep, files)
        report["files"][str(bicep.path)] = {
            "errors": bicep.errors,
            "params": sorted(bicep.params),
            "secure_params": sorted(bicep.secure_params()),
            "outputs": sorted(bicep.outputs),
            "modules": {s: str(module_path(bicep, s)) for s in bicep.modules},
            "resources": [
                {
                    "symbol": s,
                    "type": _name(e.children[2].children[0]),
                    "existing": e.children[3] is not None,
                    "scope": access_path(pairs(body_object(e.children[-1])).get("scope"))[:1],
                }
                for s, e in bicep.resources.items()
            ],
            "secret_flows": flows,
        }
    return report


def main(argv: list[str]) -> int:
    paths: list[Path] = []
    for arg in argv or ["infra", "deploy"]:
        p = Path(arg)
        paths.extend(sorted(p.rglob("*.bicep")) if p.is_dir() else [p])
    report = lint(paths)
    print(json.dumps(report, indent=2))
    return 1 if any(f["errors"] for f in report["files"].values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
