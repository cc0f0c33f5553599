"""docs/quickstart.md, run at tiny scale: every `dflash ...` command of the page that needs
no engine, in order, with the tiny target and a few steps in place of Qwen3-8B and 8 GPUs.
A command added to the page fails here until it is given its tiny form below."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO
from helpers.apps import write_conversations

PAGE = REPO / "docs" / "quickstart.md"
# the page's words -> the tiny run's (applied in order, to the whole command)
TINY = [
    ("experiment=qwen3_8b target.path=$TARGET", "experiment=tiny_cpu"),
    ("target=qwen3_8b target.path=$TARGET", "target=tiny_qwen3"),
    (" data.require_chat_template=true", ""),  # the tiny byte tokenizer has none
    (" trainer.devices=8", " trainer.max_steps=4 trainer.val_check_interval=2 eval.after_train=false"),
    ("benchmark=gsm8k", "benchmark=smoke benchmark.max_samples=1 decoding.max_new_tokens=8 hf_generate=false warmup_tokens=0"),
    (
        "regenerate.output_dir=$DFLASH_ARTIFACTS/data/mine",
        "regenerate.output_dir=$DFLASH_ARTIFACTS/data/mine regenerate.max_new_tokens=24",
    ),
]
NEEDS_ENGINE = ("regenerate.server_url=",)


def page_commands() -> list[str]:
    """The `dflash ...` lines of the page's bash blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("dflash ")]


def tiny(command: str) -> str:
    for page, ours in TINY:
        command = command.replace(page, ours)
    return command.replace("dflash ", f"{sys.executable} -m dflash.console ", 1)


def test_the_page_lists_the_commands_this_test_runs():
    commands = page_commands()
    assert [c.split()[1] for c in commands] == ["regenerate", "regenerate", "train", "export", "evaluate", "tables"]
    assert sum(any(mark in c for mark in NEEDS_ENGINE) for c in commands) == 1


@pytest.mark.slow
def test_quickstart_at_tiny_scale(tmp_path):
    write_conversations(tmp_path / "my_prompts.jsonl", 12)
    artifacts = tmp_path / "artifacts"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    env.update(DFLASH_ARTIFACTS=str(artifacts), TARGET="/nonexistent/never/read")
    for command in page_commands():
        if any(mark in command for mark in NEEDS_ENGINE):
            continue
        result = subprocess.run(["bash", "-c", tiny(command)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (command, result.stderr[-3000:])
    drafter = artifacts / "runs" / "mine" / "drafter"
    assert (drafter / "README.md").read_text().startswith("---\n")
    assert list((artifacts / "runs" / "mine" / "tensorboard").glob("version_0/events.out.tfevents.*"))
    assert (artifacts / "drafters" / "mine" / "model.safetensors").is_file()
    (results,) = (artifacts / "evaluate").glob("*/*/results.json")
    assert json.loads(results.read_text())["tau"] >= 1
    assert (artifacts / "tables" / "evaluate" / "tables.md").is_file()
    assert not (tmp_path / "outputs").exists()  # nothing outside DFLASH_ARTIFACTS
