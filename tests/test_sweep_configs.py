"""Every shipped sweep composes, stages find each other's directories, the driver's commands."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

import dflash.cli  # noqa: F401 - registers the config schemas the apps start from
from dflash.errors import ConfigError
from dflash.sweep.cli import sweep_commands
from dflash.sweep.dirnames import grid_dirname, register_resolver
from dflash.sweep.stages import available_sweeps, sweep_plan

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "dflash" / "conf"
SWEEPS = available_sweeps()
# The target-context ablation needs a drafter switch that dflash/conf/drafter does not have yet.
HAS_TARGET_FEATURE_SWITCH = "use_target_features" in (CONF / "drafter" / "dflash.yaml").read_text()

register_resolver()


def _compose(name: str, overrides: list[str] = ()):
    """The composed config of one job of sweep `name`, with HydraConfig set (for resolving)."""
    app = sweep_plan(name).app
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=app):
        cfg = compose(app, overrides=[f"+sweep={name}", *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def _first_point(name: str) -> list[str]:
    """The overrides of the first grid point of sweep `name`."""
    params = OmegaConf.to_container(_compose(name).hydra.sweeper.params)
    parser = OverridesParser.create()
    points = []
    for key, value in params.items():
        override = parser.parse_override(f"{key}={value}")
        first = next(iter(override.sweep_string_iterator())) if override.is_sweep_override() else str(value)
        points.append(f"{key}={first}")
    return points


def _needs_switch(name: str):
    if name.startswith("target_context") and not HAS_TARGET_FEATURE_SWITCH:
        pytest.skip("drafter.use_target_features does not exist yet (see docs/sweeps.md)")


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_composes_at_its_first_grid_point(name):
    _needs_switch(name)
    cfg = _compose(name, _first_point(name))
    assert cfg.sweep.name == name and cfg.sweep.ablation
    assert cfg.hydra.launcher._target_.endswith("GpuPoolLauncher")
    assert str(cfg.hydra.sweep.dir).endswith(f"sweeps/{name}")
    if sweep_plan(name).app == "train":
        assert cfg.eval.after_train is True and cfg.logger.group == name
    if name.endswith("_cpu"):
        assert cfg.target.build.kind == "tiny_code" and cfg.target.device == "cpu" and cfg.cpu_threads == 1
        assert cfg.hydra.launcher.gpus == 0 and cfg.hydra.launcher.cpu_jobs == 2


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_file_starts_with_the_command_that_runs_it(name):
    text = (REPO / "dflash" / "conf" / "sweep" / f"{name}.yaml").read_text()
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert comments[0] == "# @package _global_"
    assert any(f"sweep {name}" in line or f"sweep-{name}" in line or f"+sweep={name}" in line for line in comments)


# CPU sweeps with no full version: block_size_controlled_cpu (and its evaluation stage) asks whether the CPU recipe's
# budget reversed the block-size trend, a question the full recipe does not have.
CPU_ONLY = {"block_size_controlled_cpu", "block_size_controlled_infer_cpu"}


def test_cpu_and_full_versions_sweep_the_same_keys_into_the_same_table():
    # The main table's CPU version has one target and one benchmark: only ablations compare.
    assert CPU_ONLY <= set(SWEEPS)
    for name in SWEEPS:
        if not name.endswith("_cpu") or name.startswith("main") or name in CPU_ONLY:
            continue
        full, cpu = (yaml.safe_load((REPO / "dflash" / "conf" / "sweep" / f"{n}.yaml").read_text()) for n in (name[: -len("_cpu")], name))
        assert cpu["sweep"]["ablation"] == full["sweep"]["ablation"]
        assert cpu["sweep"].get("axes") == full["sweep"].get("axes")
        assert set(cpu["hydra"]["sweeper"]["params"]) == set(full["hydra"]["sweeper"]["params"])


def test_depth_and_feature_taps_are_set_independently():
    for name in ("depth", "depth_cpu"):
        cfg = _compose(name, ["drafter.num_layers=8"])
        assert cfg.drafter.num_target_features is not None  # not "as many taps as layers"
    for name in ("target_features", "target_features_cpu"):
        depth = {_compose(name, [f"drafter.num_target_features={n}"]).drafter.num_layers for n in (1, 3, 5)}
        assert len(depth) == 1


def test_block_size_sweep_lets_gamma_follow_the_training_block():
    assert _compose("block_size", ["drafter.block_size=8"]).training.loss_gamma == "auto"


@pytest.mark.parametrize("train_sweep, eval_sweep, train_point, eval_point", [
    ("block_size_cpu", "block_size_infer_cpu", ["drafter.block_size=10", "seed=1"],
     ["train_block_size=10", "train_seed=1", "decoding.block_size=16"]),
    ("block_size_controlled_cpu", "block_size_controlled_infer_cpu",
     ["drafter.block_size=16", "seed=2", "training.num_anchors=64"],
     ["train_block_size=16", "train_seed=2", "decoding.block_size=8"]),
    ("block_size_controlled_cpu", "block_size_controlled_infer_cpu",
     ["drafter.block_size=8", "seed=1", "training.num_anchors=164"],
     ["train_block_size=8", "train_seed=1", "decoding.block_size=16"]),
    ("block_size", "block_size_infer", ["drafter.block_size=8", "seed=0"],
     ["train_block_size=8", "train_seed=0", "decoding.block_size=10"]),
    ("main_cpu", "main_eval_cpu", ["method=dflash", "seed=2"], ["train_seed=2", "decoding=sampling"]),
    ("main", "main_eval", ["experiment=llama31_8b", "seed=0"],
     ["target=llama31_8b", "train_seed=0", "benchmark=gsm8k", "decoding=greedy"]),
])
def test_the_evaluation_stage_reads_the_drafter_the_training_stage_writes(
    tmp_path, monkeypatch, train_sweep, eval_sweep, train_point, eval_point
):
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path))
    trained = _compose(train_sweep, train_point)
    assert str(trained.hydra.sweep.subdir) == ",".join(sorted(train_point))
    job_dir = Path(str(trained.hydra.sweep.dir)) / str(trained.hydra.sweep.subdir)
    evaluated = _compose(eval_sweep, eval_point)
    assert Path(evaluated.drafter.path) == job_dir / "drafter"
    assert sweep_plan(train_sweep).next == eval_sweep


@pytest.mark.parametrize("train_sweep, eval_sweep, train_point, eval_point", [
    ("main_cpu", "main_eval_cpu", ["method=eagle3", "seed=2"], ["train_seed=2", "decoding=greedy"]),
    ("main", "main_eval", ["experiment=eagle3_llama31_8b", "seed=0"],
     ["target=llama31_8b", "train_seed=0", "benchmark=gsm8k", "decoding=greedy"]),
])
def test_the_main_table_evaluates_the_eagle3_drafter_its_training_stage_writes(
    tmp_path, monkeypatch, train_sweep, eval_sweep, train_point, eval_point
):
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path))
    trained = _compose(train_sweep, train_point)
    assert trained.method.name == "eagle3"
    job_dir = Path(str(trained.hydra.sweep.dir)) / str(trained.hydra.sweep.subdir)
    evaluated = _compose(eval_sweep, eval_point)
    assert list(evaluated.methods) == ["dflash", "eagle3", "ngram"]
    assert Path(evaluated.eagle3.path) == job_dir / "drafter"


def test_job_directories_name_the_grid_and_hash_other_overrides():
    grid = ["drafter.num_layers", "seed"]
    assert grid_dirname(["+sweep=depth", "drafter.num_layers=3", "seed=0"], grid, ["sweep"]) == "drafter.num_layers=3,seed=0"
    with_extra = grid_dirname(["+sweep=depth", "drafter.num_layers=3", "seed=0", "data.path=/a/b.jsonl"], grid, ["sweep"])
    assert with_extra.startswith("drafter.num_layers=3,seed=0+") and "/" not in with_extra
    other = grid_dirname(["drafter.num_layers=3", "seed=0", "data.path=/a/c.jsonl"], grid, ["sweep"])
    assert other != with_extra  # other settings, other directory
    assert grid_dirname(["experiment=a/b"], ["experiment"]) == "experiment=a_b"
    assert grid_dirname([], grid) == "default"


def test_driver_runs_prepare_then_each_stage():
    (train_stage, eval_stage) = sweep_commands("block_size_cpu", ["hydra.launcher.cpu_jobs=1"], seeds="0,1")
    prepare, multirun = train_stage[:-1], train_stage[-1]
    assert [cmd[2] for cmd in prepare] == ["dflash.sweep.prompts", "dflash.regenerate"]
    assert multirun[2:] == ["dflash.train", "-m", "+sweep=block_size_cpu", "seed=0,1", "hydra.launcher.cpu_jobs=1"]
    assert eval_stage[-1][2:] == ["dflash.evaluate", "-m", "+sweep=block_size_infer_cpu", "train_seed=0,1", "hydra.launcher.cpu_jobs=1"]
    (only,) = sweep_commands("depth", ["trainer.max_steps=10"], gpus="0,3")
    assert only[-1][-2:] == ["trainer.max_steps=10", "hydra.launcher.gpus=[0,3]"]
    with pytest.raises(ConfigError, match="block_size -> block_size_infer"):
        sweep_commands("block_size", ["trainer.max_steps=10"])
    with pytest.raises(ConfigError, match="unknown sweep 'nope'"):
        sweep_commands("nope", [])


def test_cpu_sweeps_prepare_their_prompts_once(tmp_path):
    import json

    from dflash.sweep.prompts import write_tiny_code_prompts

    path = str(tmp_path / "prompts.jsonl")
    assert write_tiny_code_prompts(path, 6) is True
    rows = [json.loads(line) for line in open(path)]
    assert len(rows) == 6 and all(row["prompt"].startswith(("def ", "async def ")) for row in rows)
    assert write_tiny_code_prompts(path, 6) is False  # same request: the file is kept
    assert write_tiny_code_prompts(path, 4) is True and len(open(path).readlines()) == 4


@pytest.mark.parametrize("argv", [
    ["depth_cpu", "--seeds", "0,1", "hydra.launcher.cpu_jobs=4", "--dry-run"],
    ["depth_cpu", "hydra.launcher.cpu_jobs=4", "--dry-run", "--seeds", "0,1"],
])
def test_sweep_cli_takes_overrides_before_or_after_its_options(argv, capsys):
    from dflash.sweep.cli import main

    assert main(argv) == 0
    multirun = capsys.readouterr().out.strip().splitlines()[-1]
    assert "+sweep=depth_cpu" in multirun and "seed=0,1" in multirun and "hydra.launcher.cpu_jobs=4" in multirun
