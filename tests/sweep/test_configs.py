"""Every shipped sweep composes at each of its scales, stages find each other's directories, the driver's commands."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from dflash.errors import ConfigError
from dflash.sweep.cli import sweep_commands
from dflash.sweep.dirnames import grid_dirname, register_resolver
from dflash.sweep.stages import available_scales, available_sweeps, scale_override, sweep_plan
from helpers import REPO

CONF = REPO / "dflash" / "conf"
SWEEPS = available_sweeps()
SCALES = available_scales()


def declared_scales(name: str) -> list[str]:
    """The scales sweep `name` runs at (its file's `sweep.scales`; none declared: every scale)."""
    return list(OmegaConf.load(CONF / "sweep" / f"{name}.yaml").sweep.get("scales") or SCALES)


# Sweeps that run at one scale only: block_size_controlled (and its evaluation stage) asks whether the CPU
# recipe's budget reversed the block-size trend, a question the full recipe does not have; the methods
# side by side (and its evaluation stage) is sized for SmolLM2 (DFlash2's selector needs its width).
CPU_ONLY = {"block_size_controlled", "block_size_controlled_infer"}
SWEEP_SCALES = [(name, scale) for name in SWEEPS for scale in declared_scales(name)]

register_resolver()


def _compose(name: str, overrides: list[str] = (), scale: str | None = None):
    """The composed config of one job of sweep `name` at `scale`, with HydraConfig set (for resolving)."""
    plan = sweep_plan(name, scale)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=plan.app):
        cfg = compose(plan.app, overrides=[*plan.overrides, *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def _first_point(name: str, scale: str | None = None) -> list[str]:
    """The overrides of the first grid point of sweep `name`."""
    params = OmegaConf.to_container(_compose(name, scale=scale).hydra.sweeper.params, resolve=True)
    parser = OverridesParser.create()
    points = []
    for key, value in params.items():
        override = parser.parse_override(f"{key}={value}")
        first = next(iter(override.sweep_string_iterator())) if override.is_sweep_override() else str(value)
        points.append(f"{key}={first}")
    return points


@pytest.mark.parametrize("name, scale", SWEEP_SCALES)
def test_every_sweep_composes_at_its_first_grid_point_at_every_scale(name, scale):
    cfg = _compose(name, _first_point(name, scale), scale)
    # The scale names the directory: depth_cpu, as when each scale had its own file.
    dirname = name + ("" if scale == "full" else f"_{scale}")
    assert cfg.sweep.name == dirname and cfg.sweep.ablation and cfg.sweep.scale == scale
    assert cfg.hydra.launcher._target_.endswith("GpuPoolLauncher")
    assert str(cfg.hydra.sweep.dir).endswith(f"sweeps/{dirname}")
    assert "+" not in str(cfg.hydra.sweep.subdir)  # the scale override adds no hash
    if sweep_plan(name, scale).app == "train":
        assert cfg.eval.after_train is True and cfg.logger.group == dirname
    if scale == "cpu":
        assert cfg.target.build.kind == "tiny_code" and cfg.target.device == "cpu" and cfg.cpu_threads == 1
        assert cfg.hydra.launcher.gpus == 0 and cfg.hydra.launcher.cpu_jobs == 2


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_file_starts_with_the_command_that_runs_it(name):
    text = (REPO / "dflash" / "conf" / "sweep" / f"{name}.yaml").read_text()
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert comments[0] == "# @package _global_"
    assert any(f"sweep {name}" in line or f"sweep-{name}" in line or f"+sweep={name}" in line for line in comments)


def test_one_file_per_sweep_and_the_scale_a_separate_choice():
    assert CPU_ONLY == {name for name in SWEEPS if declared_scales(name) == ["cpu"]} and {"full", "cpu"} <= set(SCALES)
    assert {name for name in SWEEPS if declared_scales(name) == ["smollm2"]} == {"methods", "methods_lookup"}
    assert not [name for name in SWEEPS if any(name.endswith(f"_{scale}") for scale in SCALES)]
    # Both apps' scale groups offer the same scales.
    assert sorted(p.stem for p in (CONF / "sweep" / "eval_scale").glob("*.yaml")) == SCALES
    for name in CPU_ONLY:
        assert sweep_plan(name).scale == "cpu"  # their default
        with pytest.raises(ConfigError, match="runs at scale cpu only"):
            sweep_plan(name, "full")
    with pytest.raises(ConfigError, match="unknown scale 'tiny'"):
        sweep_plan("depth", "tiny")


def test_depth_and_feature_taps_are_set_independently():
    for scale, taps in (("full", 5), ("cpu", 2)):
        cfg = _compose("depth", ["drafter.num_layers=8"], scale)
        assert cfg.drafter.num_target_features == taps  # the recipe's, not "as many taps as layers"
        depth = {_compose("target_features", [f"drafter.num_target_features={n}"], scale).drafter.num_layers for n in (1, 3, 5)}
        assert len(depth) == 1


def test_block_size_sweep_lets_gamma_follow_the_training_block():
    assert _compose("block_size", ["drafter.block_size=8"]).training.loss_gamma == "auto"


@pytest.mark.parametrize(
    "scale, train_sweep, eval_sweep, train_point, eval_point, job_dir",
    [
        (
            "cpu",
            "block_size",
            "block_size_infer",
            ["drafter.block_size=10", "seed=1"],
            ["train_block_size=10", "train_seed=1", "decoding.block_size=16"],
            "block_size_cpu/drafter.block_size=10,seed=1",
        ),
        (
            "cpu",
            "block_size_controlled",
            "block_size_controlled_infer",
            ["drafter.block_size=16", "seed=2", "training.num_anchors=64"],
            ["train_block_size=16", "train_seed=2", "decoding.block_size=8"],
            "block_size_controlled_cpu/drafter.block_size=16,seed=2,training.num_anchors=64",
        ),
        (
            "cpu",
            "block_size_controlled",
            "block_size_controlled_infer",
            ["drafter.block_size=8", "seed=1", "training.num_anchors=164"],
            ["train_block_size=8", "train_seed=1", "decoding.block_size=16"],
            "block_size_controlled_cpu/drafter.block_size=8,seed=1,training.num_anchors=164",
        ),
        (
            "full",
            "block_size",
            "block_size_infer",
            ["drafter.block_size=8", "seed=0"],
            ["train_block_size=8", "train_seed=0", "decoding.block_size=10"],
            "block_size/drafter.block_size=8,seed=0",
        ),
        (
            "cpu",
            "main",
            "main_eval",
            ["method=dflash", "seed=2"],
            ["train_seed=2", "decoding=sampling"],
            "main_cpu/method=dflash,seed=2",
        ),
        (
            "smollm2",
            "methods",
            "methods_lookup",
            ["method=dspark", "seed=1"],
            ["sweep.train_method=dspark", "train_seed=1"],
            "methods_smollm2/method=dspark,seed=1",
        ),
        (
            "full",
            "main",
            "main_eval",
            ["experiment=llama31_8b", "seed=0"],
            ["target=llama31_8b", "train_seed=0", "benchmark=gsm8k", "decoding=greedy"],
            "main/experiment=llama31_8b,seed=0",
        ),
    ],
)
def test_the_evaluation_stage_reads_the_drafter_the_training_stage_writes(
    tmp_path, monkeypatch, scale, train_sweep, eval_sweep, train_point, eval_point, job_dir
):
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path))
    trained = _compose(train_sweep, train_point, scale)
    assert str(trained.hydra.sweep.subdir) == ",".join(sorted(train_point))
    # The directories of the former per-scale files (docs/results and existing artifacts name them).
    assert Path(str(trained.hydra.sweep.dir)) / str(trained.hydra.sweep.subdir) == tmp_path / "sweeps" / job_dir
    evaluated = _compose(eval_sweep, eval_point, scale)
    assert Path(evaluated.drafter.path) == tmp_path / "sweeps" / job_dir / "drafter"
    assert sweep_plan(train_sweep, scale).next == eval_sweep


@pytest.mark.parametrize(
    "scale, train_point, eval_point",
    [
        ("cpu", ["method=eagle3", "seed=2"], ["train_seed=2", "decoding=greedy"]),
        (
            "full",
            ["experiment=eagle3_llama31_8b", "seed=0"],
            ["target=llama31_8b", "train_seed=0", "benchmark=gsm8k", "decoding=greedy"],
        ),
    ],
)
def test_the_main_table_evaluates_the_eagle3_drafter_its_training_stage_writes(
    tmp_path, monkeypatch, scale, train_point, eval_point
):
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path))
    trained = _compose("main", train_point, scale)
    assert trained.method.name == "eagle3"
    assert trained.hydra.launcher.gpus_per_job == (8 if scale == "full" else 1)  # DDP over 8 GPUs per job at full
    job_dir = Path(str(trained.hydra.sweep.dir)) / str(trained.hydra.sweep.subdir)
    evaluated = _compose("main_eval", eval_point, scale)
    assert list(evaluated.methods) == ["dflash", "eagle3", "ngram"]
    assert Path(evaluated.eagle3.path) == job_dir / "drafter"


def _grid(name: str, scale: str) -> dict:
    """The resolved grid of sweep `name` at `scale`: key -> list of values."""
    params = OmegaConf.to_container(_compose(name, scale=scale).hydra.sweeper.params, resolve=True)
    parser = OverridesParser.create()
    grid = {}
    for key, value in params.items():
        override = parser.parse_override(f"{key}={value}")
        grid[key] = list(override.sweep_string_iterator()) if override.is_sweep_override() else [str(value)]
    return grid


def test_the_smollm2_scale_narrows_the_grids_and_sweeps_three_seeds():
    assert _grid("depth", "smollm2")["drafter.num_layers"] == ["5", "3", "1"]
    assert _grid("depth", "full")["drafter.num_layers"] == ["8", "5", "3", "1"]  # the sweep file's own grid
    assert _grid("block_size", "smollm2")["drafter.block_size"] == ["16", "8", "3"]
    assert _grid("block_size_infer", "smollm2")["decoding.block_size"] == ["16", "8"]
    assert _grid("loss", "smollm2")["training.loss"] == ["ce"]
    assert _grid("loss", "cpu")["training.loss"] == ["ce", "kl", "ce_target_argmax"]
    for name in ("block_size", "block_size_infer", "depth", "target_features", "loss", "anchors", "target_context", "main",
                 "main_eval"):  # fmt: skip
        seeds = _grid(name, "smollm2")["train_seed" if name.endswith(("_infer", "_eval")) else "seed"]
        assert seeds == ["0", "1", "2"], name
        assert _grid(name, "cpu")["train_seed" if name.endswith(("_infer", "_eval")) else "seed"] == ["0"], name
    cfg = _compose("depth", ["drafter.num_layers=1", "seed=2"], "smollm2")
    assert cfg.target.gguf_file.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and cfg.drafter.block_size == 8
    assert cfg.drafter.init_from_target and cfg.training.target_cache_dir and cfg.sweep.reuse is True
    assert cfg.eval.benchmark.name == "smollm2_mix" and cfg.cpu_threads == 1 and cfg.hydra.launcher.cpu_jobs == 2


def test_a_scale_grid_no_sweep_file_reads_is_one_config_error():
    from dflash.sweep.stages import _plan, grid_names

    assert grid_names() == {"num_layers", "block_sizes", "infer_train_block_sizes", "infer_block_sizes", "losses"}
    assert _plan("depth", "train", {"scale": "s", "grids": {"num_layers": "5,1"}}, []).scale == "s"
    with pytest.raises(ConfigError, match=r"no sweep file reads this grid.*'num_layers'") as err:
        _plan("depth", "train", {"scale": "s", "grids": {"num_layer": "5,1"}}, [])  # misspelt in a scale file
    assert err.value.key == "sweep.grids.num_layer"


def test_the_smollm2_main_table_reads_the_b16_and_eagle3_drafters_of_main_and_the_b3_one_of_block_size(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path))
    assert _grid("main", "smollm2")["experiment"] == ["smollm2", "eagle3_smollm2"]
    dirs = {}
    for point in (["experiment=smollm2", "seed=1"], ["experiment=eagle3_smollm2", "seed=1"]):
        cfg = _compose("main", point, "smollm2")
        dirs[point[0]] = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        assert cfg.method.name == point[0].removeprefix("experiment=").removesuffix("_smollm2").replace("smollm2", "dflash")
    assert _compose("main", ["experiment=eagle3_smollm2", "seed=1"], "smollm2").method.draft_vocab_size == 8192
    b3 = _compose("block_size", ["drafter.block_size=3", "seed=1"], "smollm2")
    b3_dir = Path(str(b3.hydra.sweep.dir)) / str(b3.hydra.sweep.subdir)
    for block, drafter_dir, budget in ((16, dirs["experiment=smollm2"], 15), (3, b3_dir, 2)):
        evaluated = _compose("main_eval", [f"sweep.main_block={block}", "train_seed=1", "decoding=sampling"], "smollm2")
        assert Path(evaluated.drafter.path) == drafter_dir / "drafter"
        assert Path(evaluated.eagle3.path) == dirs["experiment=eagle3_smollm2"] / "drafter"
        assert evaluated.dflash_tree.budget == budget
        # T = 1 (sampling, the rejection rule): no tree, which samples with the match rule only
        assert list(evaluated.methods) == ["dflash"] + (["eagle3", "ngram"] if block == 3 else [])
        greedy = _compose("main_eval", [f"sweep.main_block={block}", "train_seed=1", "decoding=greedy"], "smollm2")
        assert list(greedy.methods) == ["dflash", "dflash_tree"] + (["eagle3", "ngram"] if block == 3 else [])
    assert "dflash.sweep" in [cmd[0] for cmd in sweep_plan("main", "smollm2").prepare]  # it trains block_size first


def test_job_directories_name_the_grid_and_hash_other_overrides():
    grid = ["drafter.num_layers", "seed"]
    assert grid_dirname(["+sweep=depth", "drafter.num_layers=3", "seed=0"], grid, ["sweep"]) == "drafter.num_layers=3,seed=0"
    with_extra = grid_dirname(["+sweep=depth", "drafter.num_layers=3", "seed=0", "data.path=/a/b.jsonl"], grid, ["sweep"])
    assert with_extra.startswith("drafter.num_layers=3,seed=0+") and "/" not in with_extra
    other = grid_dirname(["drafter.num_layers=3", "seed=0", "data.path=/a/c.jsonl"], grid, ["sweep"])
    assert other != with_extra  # other settings, other directory
    assert grid_dirname(["experiment=a/b"], ["experiment"]) == "experiment=a_b"
    assert grid_dirname([], grid) == "default"


def test_driver_runs_prepare_then_each_stage_at_one_scale():
    (train_stage, eval_stage) = sweep_commands("block_size", ["hydra.launcher.cpu_jobs=1"], seeds="0,1", scale="cpu")
    prepare, multirun = train_stage[:-1], train_stage[-1]
    assert [cmd[2] for cmd in prepare] == ["dflash.sweep.prompts", "dflash.regenerate"]
    assert "data.path=${paths.artifacts}/data/tiny_code_prompts.jsonl" in prepare[1]  # resolved by that command
    assert multirun[2:] == ["dflash.train", "-m", "+sweep=block_size", "sweep/scale=cpu", "seed=0,1", "hydra.launcher.cpu_jobs=1"]
    assert eval_stage[-1][2:] == [
        "dflash.evaluate",
        "-m",
        "+sweep=block_size_infer",
        "sweep/eval_scale=cpu",
        "train_seed=0,1",
        "hydra.launcher.cpu_jobs=1",
    ]
    assert scale_override("evaluate", "cpu") == "sweep/eval_scale=cpu"
    assert sweep_commands("block_size_cpu", []) == sweep_commands("block_size", [], scale="cpu")  # the former file name
    (only,) = sweep_commands("depth", ["trainer.max_steps=10"], gpus="0,3")
    assert only[-1][2:] == ["dflash.train", "-m", "+sweep=depth", "trainer.max_steps=10", "hydra.launcher.gpus=[0,3]"]
    with pytest.raises(ConfigError, match="block_size -> block_size_infer"):
        sweep_commands("block_size", ["trainer.max_steps=10"])
    # --no-next: the training stage alone (main at scale smollm2 prepares the B = 3 drafter so)
    (alone,) = sweep_commands("block_size", ["trainer.max_steps=10"], scale="cpu", follow_next=False)
    assert alone[-1][2:] == ["dflash.train", "-m", "+sweep=block_size", "sweep/scale=cpu", "trainer.max_steps=10"]
    with pytest.raises(ConfigError, match="unknown sweep 'nope'"):
        sweep_commands("nope", [])
    with pytest.raises(ConfigError, match="'depth_cpu' is sweep 'depth' at scale 'cpu'"):
        sweep_commands("depth_cpu", [], scale="full")


def test_a_sweep_that_does_not_compose_is_one_line_naming_the_key(tmp_path, monkeypatch):
    import dflash.sweep.stages as stages

    (tmp_path / "broken.yaml").write_text("# @package _global_\ndefaults:\n  - _nope\n")
    monkeypatch.setattr(stages, "SWEEPS_DIR", tmp_path)
    with pytest.raises(ConfigError) as err:
        sweep_plan("broken")
    assert err.value.key == "sweep" and "\n" not in str(err.value) and "does not compose" in str(err.value)


def test_cpu_sweeps_prepare_their_prompts_once(tmp_path):
    import json

    from dflash.sweep.prompts import write_tiny_code_prompts

    path = str(tmp_path / "prompts.jsonl")
    assert write_tiny_code_prompts(path, 6) is True
    rows = [json.loads(line) for line in open(path)]
    assert len(rows) == 6 and all(row["prompt"].startswith(("def ", "async def ")) for row in rows)
    assert write_tiny_code_prompts(path, 6) is False  # same request: the file is kept
    assert write_tiny_code_prompts(path, 4) is True and len(open(path).readlines()) == 4


def test_smollm2_sweeps_prepare_three_families_of_held_out_prompts_once(tmp_path, monkeypatch, capsys):
    import json

    from dflash.data.builtin_prompts import FAMILIES
    from dflash.eval.benchmarks import BenchmarkSpec, load_benchmark
    from dflash.sweep.prompts import main

    data = tmp_path / "data"
    data.mkdir()
    training = [FAMILIES["math"](3, 0)[0], FAMILIES["chat"](3, 0)[0]]
    rows = [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": "a"}]} for p in training]
    (data / "rows-00000000-00000002.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path))
    argv = ["smollm2_eval", "--count", "2", "--data", "${paths.artifacts}/data", "--out", "${paths.artifacts}/mix.jsonl"]
    assert main(argv) == 0 and capsys.readouterr().out.startswith("wrote")
    samples = load_benchmark(BenchmarkSpec("smollm2_mix", path=str(tmp_path / "mix.jsonl"), prompt_format="raw"))
    assert [s.family for s in samples] == ["humaneval"] * 2 + ["math"] * 2 + ["chat"] * 2
    assert all(s.turns[0].startswith("Write a solution to the following problem") for s in samples[:2])  # harness wording
    assert not {s.turns[0] for s in samples} & set(training)  # never a training prompt
    assert main(argv) == 0 and capsys.readouterr().out.startswith("kept")
    (data / "rows-00000002-00000003.jsonl").write_text(json.dumps(rows[0] | {"messages": [{"role": "user", "content": "x"}]}))
    assert main(argv) == 0 and capsys.readouterr().out.startswith("wrote")  # other training prompts: written again
    assert main(["smollm2_eval", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "m.jsonl")]) == 2
    assert "regenerate first" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["depth", "--scale", "cpu", "--seeds", "0,1", "hydra.launcher.cpu_jobs=4", "--dry-run"],
        ["depth", "hydra.launcher.cpu_jobs=4", "--dry-run", "--seeds", "0,1", "--scale", "cpu"],
        ["depth_cpu", "hydra.launcher.cpu_jobs=4", "--dry-run", "--seeds", "0,1"],
    ],
)
def test_sweep_cli_takes_overrides_before_or_after_its_options(argv, capsys):
    from dflash.sweep.cli import main

    assert main(argv) == 0
    multirun = capsys.readouterr().out.strip().splitlines()[-1]
    assert "+sweep=depth sweep/scale=cpu seed=0,1 hydra.launcher.cpu_jobs=4" in multirun


def test_sweep_cli_answers_a_bad_scale_with_one_line(capsys):
    from dflash.sweep.cli import main

    assert main(["depth", "--scale", "tiny", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == "error: scale: unknown scale 'tiny'; choose one of ['cpu', 'full', 'smollm2']"
    assert main(["block_size_controlled", "--scale", "full", "--dry-run"]) == 2
    assert "runs at scale cpu only" in capsys.readouterr().err


def test_the_sweep_driver_composes_in_a_fresh_process():
    """`python -m dflash.sweep` imports no entry point: the plan must register the config
    schemas itself (the group options start from them), not rely on an earlier import."""
    import subprocess
    import sys

    code = "from dflash.sweep.stages import sweep_plan; print(sweep_plan('depth', 'cpu').app)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "train", proc.stderr[-2000:]
