"""`--help` of every app (dflash.usage) and what answering it and a bad value imports:
both must come back within seconds, so neither may import what only a run needs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from dflash import CONF_DIR
from dflash.usage import GROUPS, _groups, app_help
from helpers import REPO

APPS = ["train", "evaluate", "regenerate", "export", "tables", "demo", "demo_tiny"]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("app", APPS)
def test_help_has_two_examples_and_no_internal_entries(app):
    text = app_help(app)
    examples = text.split("Examples:\n")[1].split("\n\n")[0].splitlines()
    assert len(examples) == 2 and all(e.strip().startswith(("python -m dflash.", "make ")) for e in examples), examples
    assert "_schema" not in text and "_common" not in text and "_eval" not in text


def test_train_help_describes_each_group_and_marks_defaults():
    text = app_help("train")
    for group in ("target", "drafter", "data", "training", "trainer", "logger", "experiment"):
        assert f"  {group:<13} {GROUPS[group]}" in text
    assert "* tiny_qwen3" in text and "  qwen3_8b " in text  # the default option is marked, the others listed
    options = {p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")}
    assert all(f" {name} " in text for name in options)


def test_every_group_an_app_offers_is_described():
    for app in APPS:
        groups = {group for group, _ in _groups(app, yaml.safe_load((CONF_DIR / f"{app}.yaml").read_text()))}
        assert groups <= set(GROUPS), (app, sorted(groups - set(GROUPS)))


@pytest.mark.parametrize("app", ["train", "evaluate"])
def test_help_exits_0_without_importing_torch(app):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-X", "importtime", "-m", f"dflash.{app}", "--help"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "Config groups" in result.stdout, result.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "dflash.usage" in imported and not imported & {"torch", "lightning", "transformers", "dflash.schema"}


PROMPTS = CONF_DIR / "experiment" / "data" / "tiny_prompts.jsonl"  # shipped: the data check passes
REFUSED_BEFORE_TORCH = {
    "a wrong type": ("train", ["training.learning_rate=abc"], "training.learning_rate: expected float, got 'abc'"),
    "a schema's range": (
        "train",
        [f"data.path={PROMPTS}", "trainer.max_steps=0", "trainer.max_epochs=null"],
        "trainer.max_steps: set",
    ),
    "a missing data.path": ("train", ["data.path=/nonexistent/chats.jsonl"], "data.path: '/nonexistent/chats.jsonl' does"),
    "a method's own check": ("train", [f"data.path={PROMPTS}", "drafter.block_size=1"], "drafter.block_size: must be >= 2"),
    "an evaluation setting": ("evaluate", ["decoding.block_size=0"], "decoding.block_size: must be >= 1, got 0"),
    "a demo setting": ("demo", ["evaluation.math=0"], "evaluation.math: must be an integer >= 1, got 0"),
    "a DSpark setting": ("evaluate", ["dspark.confidence_threshold=1.5"], "dspark.confidence_threshold: "),
    "a DFlash2 setting": ("evaluate", ["dflash2.p_min=1.5"], "dflash2.p_min: must be in [0, 1)"),
    "a DFlash2 training setting": (
        "train",
        [f"data.path={PROMPTS}", "method=dflash2", "method.selector_rank=0"],
        "method.selector_rank: ",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED_BEFORE_TORCH))
def test_a_bad_value_is_refused_before_torch_is_imported(case, tmp_path):
    app, args, line = REFUSED_BEFORE_TORCH[case]
    result = _python(
        f"import os, sys; os.environ['DFLASH_ARTIFACTS'] = {str(tmp_path)!r}; sys.argv = ['dflash.{app}', *{args}]\n"
        f"from dflash.cli.{app} import main\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    print('exit', exit.code, 'lightning' in sys.modules, 'torch' in sys.modules)\n"
    )
    assert result.stdout.strip() == "exit 2 False False", result.stderr[-2000:]
    assert result.stderr.strip().startswith(f"error: {line}"), result.stderr[-2000:]


def test_apps_that_never_train_import_no_lightning():
    """Lightning and torchmetrics cost seconds of imports per process: evaluate and export
    (and the library code they call) must not import them (dflash.progress, dflash.layout)."""
    modules = ["dflash.cli.evaluate", "dflash.cli.export", "dflash.eval", "dflash.eval.evaluator", "dflash.methods"]
    modules += ["dflash.specs", "dflash.training.export", "dflash.training.model_card", "dflash.eagle3.io", "dflash.progress"]
    result = _python(
        f"import importlib, sys\nfor m in {modules}:\n    importlib.import_module(m)\nprint('lightning' in sys.modules)"
    )
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def test_printing_the_config_checks_nothing_the_run_would_read(tmp_path):
    """`--cfg job` only prints: a data.path that a sweep's earlier stage has yet to write is no error."""
    result = _python(
        f"import os, sys; os.environ['DFLASH_ARTIFACTS'] = {str(tmp_path)!r}\n"
        "sys.argv = ['dflash.train', 'data.path=/nonexistent/chats.jsonl', '--cfg', 'job']\n"
        "from dflash.cli.train import main\nmain()\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "path: /nonexistent/chats.jsonl" in result.stdout
