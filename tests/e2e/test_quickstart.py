"""docs/quickstart.md as a user follows it: the tiny path's blocks (each one marked by `MARK`
on the line before it) run as written, from the checkout, with `DFLASH_ARTIFACTS` set; the
`dflash` commands of the other path, which need GPUs, composed as their apps compose them."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from dflash.cli.common import CONF_DIR
from helpers import REPO

PAGE = REPO / "docs" / "quickstart.md"
MARK = "<!-- tiny path: tests/e2e/test_quickstart.py runs this block -->"


def bash_blocks() -> list[tuple[bool, str]]:
    """(marked as the tiny path's, its text) of each bash block of the page, in order."""
    found = re.findall(r"^([^\n]*)\n```bash\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)
    return [(line.strip() == MARK, text) for line, text in found]


def dflash_commands(texts: list[str]) -> list[str]:
    return [line.strip() for text in texts for line in text.splitlines() if line.strip().startswith("dflash ")]


def test_the_tiny_path_runs_every_stage_and_the_other_path_composes():
    tiny = [text for marked, text in bash_blocks() if marked]
    assert [c.split()[1] for c in dflash_commands(tiny)] == ["regenerate", "train", "export", "evaluate", "tables"]
    others = dflash_commands([text for marked, text in bash_blocks() if not marked])
    assert [c.split()[1] for c in others] == ["regenerate", "regenerate", "train", "export", "evaluate", "tables"]
    # a key or group the app does not have fails here, as it would on the GPU machine
    values = {"TARGET": "/models/Qwen3-8B", "DFLASH_ARTIFACTS": "/data/dflash"}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for command in others:
            app, *overrides = shlex.split(re.sub(r"\$(\w+)", lambda m: values[m.group(1)], command))[1:]
            compose(app, overrides=overrides)


@pytest.mark.slow
def test_the_tiny_path_runs_as_written(tmp_path):
    bindir = Path(sys.executable).parent  # where this environment's `dflash` console script is
    assert (bindir / "dflash").is_file(), "the tiny path runs the `dflash` command: make install puts it there"
    artifacts = tmp_path / "artifacts"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    env.update(DFLASH_ARTIFACTS=str(artifacts), PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    leaks = [REPO / name for name in ("outputs", "multirun", "lightning_logs", "artifacts/runs/tiny", "artifacts/data/tiny_cpu")]
    absent = [path for path in leaks if not path.exists()]
    for marked, text in bash_blocks():
        if marked:
            result = subprocess.run(["bash", "-e", "-c", text], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
            assert result.returncode == 0, (text, result.stderr[-3000:])
    drafter = artifacts / "runs" / "tiny" / "drafter"
    assert (drafter / "README.md").read_text().startswith("---\n")
    assert list((artifacts / "runs" / "tiny" / "tensorboard").glob("version_0/events.out.tfevents.*"))
    assert (artifacts / "drafters" / "tiny" / "model.safetensors").is_file()
    (results,) = (artifacts / "evaluate").glob("*/*/results.json")
    assert json.loads(results.read_text())["tau"] >= 1
    assert (artifacts / "tables" / "evaluate" / "tables.md").is_file()
    assert not [path for path in absent if path.exists()]  # nothing outside DFLASH_ARTIFACTS
