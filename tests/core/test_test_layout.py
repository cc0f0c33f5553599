"""The test suite's own layout (tests/README.md): a folder per dflash package, tests/core/ for
the top-level modules, tests/e2e/ for entry points and whole pipelines, shared doubles in
tests/helpers/, and no test file importing another."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

TESTS = REPO / "tests"
PACKAGES = sorted(p.parent.name for p in (REPO / "dflash").glob("*/__init__.py"))
TEST_FOLDERS = {*PACKAGES, "core", "e2e"}


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, at any depth; relative imports as '.name'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found.append((node.lineno, module))
            # `from helpers import x` may name a submodule; `from . import test_x` names a test file
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def is_test_module(module: str) -> bool:
    parts = module.lstrip(".").split(".")
    return module.startswith(".") or parts[0] == "tests" or any(p.startswith("test_") or p == "conftest" for p in parts)


def test_no_test_file_imports_another_test_file():
    offenders = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in python_files()
        for line, module in imported_modules(path)
        if is_test_module(module)
    ]
    assert not offenders, "tests import shared code from `helpers` (tests/helpers/), never from a test file:\n" + "\n".join(
        offenders
    )


def test_the_checker_sees_each_way_of_importing_a_test_file(tmp_path):
    source = tmp_path / "test_example.py"
    source.write_text(
        "import tests.decoding.test_greedy\nfrom conftest import hf_greedy\nfrom . import test_tree\n"
        "def f():\n    from test_sampling import exact_joint\nfrom helpers.decoding import hf_greedy\n"
    )
    flagged = {line for line, module in imported_modules(source) if is_test_module(module)}
    assert flagged == {1, 2, 3, 5}


def test_test_files_live_in_a_package_folder_or_e2e():
    assert {"cli", "data", "decoding", "drafter", "eagle3", "eval", "reports", "sweep", "target", "training"} <= set(PACKAGES)
    folders = {
        p.name for p in TESTS.iterdir() if p.is_dir() and p.name not in {"helpers", "__pycache__"} and not p.name.startswith(".")
    }
    assert folders <= TEST_FOLDERS, (
        f"unknown test folders {sorted(folders - TEST_FOLDERS)}: name them after a dflash package, core or e2e"
    )
    loose = sorted(p.name for p in TESTS.glob("*.py") if p.name != "conftest.py")
    assert not loose, f"{loose} sit in tests/ itself: tests go in tests/<package>/ or tests/e2e/, shared code in tests/helpers/"
    nested = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if len(p.relative_to(TESTS).parts) != 2)
    assert not nested, f"test files one folder deep only: {nested}"
    assert not list((TESTS / "helpers").glob("test_*.py")), "tests/helpers/ holds no test files"
