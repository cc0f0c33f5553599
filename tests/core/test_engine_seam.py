"""The engine in one room (dflash/engine/__init__.py): code outside dflash/engine/ imports the
package's own names, never one of its modules, so the engine's insides can move freely."""

from __future__ import annotations

import ast

from helpers import REPO


def engine_modules_imported_outside() -> list[str]:
    found = []
    for path in sorted((REPO / "dflash").rglob("*.py")):
        if path.parent.name == "engine":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.relative_to(REPO)}:{node.lineno} {name}" for name in names if name.startswith("dflash.engine.")]
    return found


def test_code_outside_the_engine_calls_it_through_its_package_alone():
    assert engine_modules_imported_outside() == []
    uses = (REPO / "dflash" / "decoding" / "loop.py").read_text()
    assert "from dflash.engine import argmax" in uses  # the walk looks where the engine is used
