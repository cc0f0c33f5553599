"""Bad inputs at load and config time, as a user gives them to each entry point: one line
`error: <key>: ...` on stderr, exit status 2, nothing left behind that breaks the next
good run (issue 11).

Most cases call an app's `main()` in this process with its argv (the same path as
`python -m dflash.<app>`, without a torch import per case); a few real subprocesses prove
the command line itself.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dflash.drafter import DFlashDrafter, DrafterConfig, load_drafter, save_drafter
from dflash.errors import ConfigError, check_writable_dir
from dflash.layout import DRAFTER_CONFIG_KEY
from dflash.toy.tiny import save_tiny_target, tiny_config
from dflash.training.config import check_block_fits
from helpers import REPO
from helpers.apps import assert_one_error_line, run_main, write_conversations
from helpers.tables import make_depth_sweep

QUICK = ["eval.after_train=false", "logger=none", "trainer.enable_progress_bar=false"]


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A tiny target, conversations, a good drafter and checkpoint, and damaged copies."""
    root = tmp_path_factory.mktemp("bad_inputs")
    target = root / "artifacts" / "targets" / "tiny_qwen3_random"
    save_tiny_target(str(target), arch="qwen3", seed=0)
    write_conversations(root / "chats.jsonl", 16)
    config = DrafterConfig.from_target(tiny_config("qwen3"), num_layers=1, block_size=4, mask_token_id=258, num_target_features=2)
    drafter = DFlashDrafter(config)
    save_drafter(drafter, str(root / "drafter"))

    def damaged_drafter(name: str, file: str, content: bytes) -> None:
        shutil.copytree(root / "drafter", root / name)
        (root / name / file).write_bytes(content)

    weights = (root / "drafter" / "model.safetensors").read_bytes()
    damaged_drafter("drafter_bad_json", "config.json", b'{"hidden_size": 64,')
    damaged_drafter("drafter_json_list", "config.json", b"[1, 2]")
    damaged_drafter("drafter_empty_weights", "model.safetensors", b"")
    damaged_drafter("drafter_truncated_weights", "model.safetensors", weights[: len(weights) // 2])
    wide = json.loads((root / "drafter" / "config.json").read_text())
    wide["hidden_size"] *= 2
    damaged_drafter("drafter_wide", "config.json", json.dumps(wide).encode())

    (root / "empty_target").mkdir()
    shutil.copytree(target, root / "truncated_target")
    (root / "truncated_target" / "model.safetensors").write_bytes(b"\x10\x00")
    (root / "blocker").write_text("a file where a directory is expected\n")

    state = {f"drafter.{name}": tensor for name, tensor in drafter.state_dict().items()}
    torch.save({DRAFTER_CONFIG_KEY: config.to_hf_dict(), "state_dict": state}, root / "good.ckpt")
    good = (root / "good.ckpt").read_bytes()
    (root / "truncated.ckpt").write_bytes(good[: len(good) // 2])
    (root / "empty.ckpt").write_bytes(b"")
    save_file({"a": torch.zeros(100, 100), "b": torch.ones(3)}, str(root / "other.safetensors"))
    (root / "weights_head.ckpt").write_bytes((root / "other.safetensors").read_bytes()[:50])  # torch.load also warns on it
    torch.save({"weights": torch.zeros(3)}, root / "foreign.ckpt")
    make_depth_sweep(str(root / "sweeps"))
    return root


def train_args(ws: Path, *extra: str) -> list[str]:
    return [f"paths.artifacts={ws / 'artifacts'}", f"data.path={ws / 'chats.jsonl'}", *QUICK, *extra]


TRAIN_CASES = {
    "drafter config.json not JSON": (["drafter.path={ws}/drafter_bad_json"], "drafter.path", "JSONDecodeError"),
    "drafter config.json not an object": (["drafter.path={ws}/drafter_json_list"], "drafter.path", "no JSON object"),
    "drafter weights empty": (["drafter.path={ws}/drafter_empty_weights"], "drafter.path", "SafetensorError"),
    "drafter weights truncated": (["drafter.path={ws}/drafter_truncated_weights"], "drafter.path", "SafetensorError"),
    "drafter hidden size vs weights": (
        ["drafter.path={ws}/drafter_wide"],
        "drafter.path",
        "hidden_norm.weight is (64,), not (128,)",
    ),
    "a target dir as drafter": (["drafter.path={ws}/artifacts/targets/tiny_qwen3_random"], "drafter.path", "not a DFlash drafter"),
    "fsdp on an accelerator it cannot use": (["trainer=fsdp", "trainer.accelerator=mps"], "trainer.accelerator", "or on the CPU"),
    "data type": (["data.batch_size=two"], "data.batch_size", "expected int, got 'two'"),
    "source type": (["data.sources=[{{path: a.jsonl, limit: many}}]"], "data.sources[0].limit", "expected int"),
    "block longer than sequence": (
        ["drafter.block_size=1024", "data.max_length=256"],
        "drafter.block_size",
        "set drafter.block_size <= 255",
    ),
    "more anchors than positions": (["training.num_anchors=100000"], "training.num_anchors", "<= 3072"),
    "artifacts under a file": (["paths.artifacts={ws}/blocker/artifacts"], "paths.artifacts", "is a file"),
    "cache dir under a file": (["data.cache_dir={ws}/blocker/cache"], "data.cache_dir", "is a file"),
    "target state cache under a file": (
        ["training.target_cache_dir={ws}/blocker/states"],
        "training.target_cache_dir",
        "is a file",
    ),
    "run dir under a file": (["hydra.run.dir={ws}/blocker/run"], "hydra.run.dir", "is a file"),
    "target dir without a model": (["target.build=null", "target.path={ws}/empty_target"], "target.path", "holds no config.json"),
    "data dir without data files": (
        ["data.path={ws}/empty_target", "target.path={ws}/no_target_yet"],
        "data.path",
        "holds no .jsonl",
    ),
}


@pytest.mark.parametrize("case", sorted(TRAIN_CASES))
def test_train(case, ws, monkeypatch, capsys):
    overrides, key, text = TRAIN_CASES[case]
    argv = train_args(ws, "run_name=bad", *(o.format(ws=ws) for o in overrides))
    assert_one_error_line(*run_main("train", argv, monkeypatch, capsys), key, text)
    assert not (ws / "no_target_yet").exists()  # the bad data is found before the target is built


def test_unknown_experiment_lists_the_experiments_and_writes_nothing(ws, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "dflash.train",
        "experiment=nope",
        f"paths.artifacts={tmp_path}",
        f"data.path={ws / 'chats.jsonl'}",
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    experiments = sorted(p.stem for p in (REPO / "dflash" / "conf" / "experiment").glob("*.yaml"))
    assert_one_error_line(result.returncode, result.stderr.strip().splitlines(), "experiment", f"choose one of {experiments}")
    assert len(result.stderr.strip().splitlines()) == 1 and os.listdir(tmp_path) == []  # it used to train the default recipe


EVALUATE_CASES = {
    "drafter config.json not JSON": (["drafter.path={ws}/drafter_bad_json"], "drafter.path", "JSONDecodeError"),
    "drafter hidden size vs weights": (["drafter.path={ws}/drafter_wide"], "drafter.path", "does not match config.json"),
    "target dir without a model": (["target.build=null", "target.path={ws}/empty_target"], "target.path", "holds no config.json"),
    "target weights truncated": (["target.build=null", "target.path={ws}/truncated_target"], "target.path", "SafetensorError"),
    "run dir under a file": (["hydra.run.dir={ws}/blocker/run"], "hydra.run.dir", "is a file"),
    "unknown decoding preset": (["decoding=nope"], "decoding", "choose one of ['greedy', 'sampling']"),
    "drafter attention": (
        ["drafter.attn_implementation=bogus", "target.path={ws}/no_target_yet"],
        "drafter.attn_implementation",
        "'bogus'",
    ),
}


@pytest.mark.parametrize("case", sorted(EVALUATE_CASES))
def test_evaluate(case, ws, tmp_path, monkeypatch, capsys):
    overrides, key, text = EVALUATE_CASES[case]
    argv = [
        f"paths.artifacts={ws / 'artifacts'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "benchmark.max_samples=1",
        *(o.format(ws=ws) for o in overrides),
    ]
    assert_one_error_line(*run_main("evaluate", argv, monkeypatch, capsys), key, text)
    assert not (tmp_path / "run" / "results.json").exists() and not (ws / "no_target_yet").exists()


EXPORT_CASES = {
    "truncated checkpoint": ("truncated.ckpt", "ckpt", "RuntimeError: PytorchStreamReader failed"),
    "empty checkpoint": ("empty.ckpt", "ckpt", "(EOFError)"),
    "a cut-off weights file": ("weights_head.ckpt", "ckpt", "UnpicklingError"),
    "a drafter's weights file": ("drafter/model.safetensors", "ckpt", "not a dflash training checkpoint"),
    "another program's checkpoint": ("foreign.ckpt", "ckpt", "not a dflash training checkpoint"),
}


@pytest.mark.parametrize("case", sorted(EXPORT_CASES))
def test_export(case, ws, tmp_path, monkeypatch, capsys, recwarn):
    name, key, text = EXPORT_CASES[case]
    code, lines = run_main("export", [f"ckpt={ws / name}", f"out={tmp_path / 'out'}"], monkeypatch, capsys)
    assert_one_error_line(code, lines, key, text)
    assert not (tmp_path / "out").exists()
    assert not [w for w in recwarn if "pickle" in str(w.message)]  # torch warns about a damaged file's protocol


def test_export_after_a_bad_checkpoint_and_into_an_unwritable_out(ws, tmp_path, monkeypatch, capsys):
    code, lines = run_main("export", [f"ckpt={ws / 'good.ckpt'}", f"out={ws / 'blocker' / 'out'}"], monkeypatch, capsys)
    assert_one_error_line(code, lines, "out", "is a file")
    out = tmp_path / "out"
    code, lines = run_main("export", [f"ckpt={ws / 'truncated.ckpt'}", f"out={out}"], monkeypatch, capsys)
    assert_one_error_line(code, lines, "ckpt", "cannot read")
    monkeypatch.setattr(sys, "argv", ["dflash.export", f"ckpt={ws / 'good.ckpt'}", f"out={out}"])
    importlib.import_module("dflash.cli.export").main()
    assert load_drafter(str(out)).config.block_size == 4


OTHER_APPS = {
    "regenerate: output under a file": (
        "regenerate",
        ["regenerate.output_dir={ws}/blocker/out"],
        "regenerate.output_dir",
        "is a file",
    ),
    "regenerate: data type": (
        "regenerate",
        ["regenerate.output_dir={tmp}/out", "data.batch_size=two"],
        "data.batch_size",
        "expected int",
    ),
    "regenerate: setting type": (
        "regenerate",
        ["regenerate.output_dir={tmp}/out", "regenerate.batch_size=two"],
        "regenerate.batch_size",
        "expected int",
    ),
    "tables: out_dir under a file": ("tables", ["root={ws}/sweeps", "out_dir={ws}/blocker/tables"], "out_dir", "is a file"),
    "tables: unknown ablation": ("tables", ["root={ws}/sweeps", "out_dir={tmp}/tables", "ablations=[nope]"], "ablations", "'nope'"),
    "tables: setting type": ("tables", ["root={ws}/sweeps", "out_dir={tmp}/tables", "plots=maybe"], "plots", "expected bool"),
    "demo_tiny: artifacts under a file": ("demo_tiny", ["paths.artifacts={ws}/blocker/artifacts"], "paths.artifacts", "is a file"),
    "demo_tiny: prompt setting type": (
        "demo_tiny",
        ["paths.artifacts={tmp}", "prompts.num_prompts=two"],
        "prompts.num_prompts",
        "expected int",
    ),
    "demo_tiny: target build type": (
        "demo_tiny",
        ["paths.artifacts={tmp}", "target.build.lr=fast"],
        "target.build.lr",
        "expected float",
    ),
    "demo: unknown train override": (
        "demo",
        ["paths.artifacts={tmp}", 'train_overrides=["trainer.maxsteps=3"]'],
        "train_overrides",
        "trainer.maxsteps",
    ),
    "demo: unknown data override": (
        "demo",
        ["paths.artifacts={tmp}", 'data_overrides=["data.bogus=3"]'],
        "data_overrides",
        "data.bogus",
    ),
    "demo: budget": ("demo", ["paths.artifacts={tmp}", "budget_minutes=-5"], "budget_minutes", "must be a number > 0"),
    "demo_tiny: unknown train override": (
        "demo_tiny",
        ["paths.artifacts={tmp}", 'train_overrides=["trainer.maxsteps=3"]'],
        "train_overrides",
        "trainer.maxsteps",
    ),
}


@pytest.mark.parametrize("case", sorted(OTHER_APPS))
def test_other_apps(case, ws, tmp_path, monkeypatch, capsys):
    app, overrides, key, text = OTHER_APPS[case]
    extra = (
        [f"data.path={ws / 'chats.jsonl'}", f"paths.artifacts={ws / 'artifacts'}", f"hydra.run.dir={tmp_path / 'run'}"]
        if app == "regenerate"
        else []
    )
    argv = [*extra, *(o.format(ws=ws, tmp=tmp_path) for o in overrides)]
    assert_one_error_line(*run_main(app, argv, monkeypatch, capsys), key, text)
    assert not (tmp_path / "out").exists() and not (tmp_path / "tables" / "tables.md").exists()


def test_sweep_refuses_bad_gpus_and_seeds(capsys):
    from dflash.sweep.cli import main

    assert main(["depth_cpu", "--seeds", "x", "--dry-run"]) == 2
    assert main(["depth_cpu", "--gpus", "two", "--dry-run"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --seeds: give integer seeds like 0,1,2, not 'x'",
        "error: --gpus: give a count (8), ids (0,2,5) or auto, not 'two'",
    ]


@pytest.mark.slow
def test_good_run_after_a_refused_one_in_the_same_run_directory(ws, monkeypatch, capsys):
    """A refused run leaves at most Hydra's log in its run directory; the next good command trains."""
    refused = train_args(ws, "run_name=again", "drafter.block_size=1024", "data.max_length=256")
    assert_one_error_line(*run_main("train", refused, monkeypatch, capsys), "drafter.block_size", "data.max_length=256")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    good = train_args(
        ws,
        "run_name=again",
        "data.max_length=256",
        "training.num_anchors=8",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "data.num_workers=0",
    )
    result = subprocess.run(
        [sys.executable, "-m", "dflash.train", *good], cwd=ws, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert load_drafter(str(ws / "artifacts" / "runs" / "again" / "drafter")).config.block_size == 16


# --- the checks themselves -------------------------------------------------------------


def test_writable_dir_check_creates_nothing(tmp_path):
    check_writable_dir("out", str(tmp_path / "new" / "nested"))
    assert os.listdir(tmp_path) == []
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(ConfigError, match="is a file") as info:
            check_writable_dir("out", str(path))
        assert info.value.key == "out"


def test_block_and_anchor_bounds():
    check_block_fits(block_size=255, max_length=256, num_anchors=256)
    with pytest.raises(ConfigError) as info:
        check_block_fits(block_size=256, max_length=256, num_anchors=8)
    assert info.value.key == "drafter.block_size"
    with pytest.raises(ConfigError) as info:
        check_block_fits(block_size=16, max_length=256, num_anchors=257)
    assert info.value.key == "training.num_anchors"
