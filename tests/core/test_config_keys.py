"""Library checks name fields, not dotted config keys (docs/design.md invariant 23): the few
checks across groups may name full keys, and no more than the 30 of issue 39's goal."""

from __future__ import annotations

import ast
import re

from helpers import REPO

DOTTED = re.compile(r"^[a-z_][a-z_0-9]*(\.[a-z_0-9\[\]]+)+\.?$")
CHECKS = {"require", "ConfigError", "reading", "check_writable_dir", "config_key", "weight_dtype", "check_checkpoint_fits"}


def _keys(node: ast.AST):
    """Dotted keys among the string literals (and f-string heads) under `node`; file names are not keys."""
    in_fstrings = {id(part) for item in ast.walk(node) if isinstance(item, ast.JoinedStr) for part in item.values}
    for item in ast.walk(node):
        if id(item) in in_fstrings:
            continue
        if isinstance(item, ast.Constant) and isinstance(item.value, str) and DOTTED.match(item.value):
            if not item.value.endswith((".json", ".yaml", ".py")):
                yield item.value
        elif isinstance(item, ast.JoinedStr) and item.values and isinstance(item.values[0], ast.Constant):
            if re.match(r"^[a-z_]+\.[a-z_.]*$", str(item.values[0].value)):
                yield f"{item.values[0].value}..."


def dotted_keys_in_library_checks() -> list[str]:
    """`file:line key` for every dotted key passed to a check, assigned to KEY / key, or a
    `key` parameter's default, in dflash/ but its entry points (cli/) and schema layer."""
    found = []
    for path in sorted((REPO / "dflash").rglob("*.py")):
        relative = path.relative_to(REPO / "dflash")
        if relative.parts[0] == "cli" or str(relative) in ("schema.py", "structured.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            places = []
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                places = [*node.args, *(k.value for k in node.keywords)] if name in CHECKS else []
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("KEY", "key") for t in node.targets):
                places = [node.value]
            elif isinstance(node, ast.FunctionDef):
                args = node.args.args[len(node.args.args) - len(node.args.defaults) :]
                places = [d for a, d in zip(args, node.args.defaults) if a.arg == "key"]
            found += [f"{relative}:{node.lineno} {key}" for place in places for key in set(_keys(place))]
    return found


def test_library_checks_name_at_most_30_dotted_keys():
    found = dotted_keys_in_library_checks()
    assert len(found) <= 30, "\n".join(found)


def test_the_count_sees_the_forms_checks_use():
    tree = ast.parse('require(x, "drafter.block_size", "m")\nKEY = "eval.tau_real"\nrequire(x, f"sweep.grids.{g}", "m")')
    assert [key for node in tree.body for key in _keys(node)] == ["drafter.block_size", "eval.tau_real", "sweep.grids...."]
