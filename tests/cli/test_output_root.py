"""One output root: every app writes under DFLASH_ARTIFACTS (paths.artifacts); a start that
is refused leaves no run directory behind; the tables skip runs that have no result yet,
with one line saying so."""

from __future__ import annotations

import os
import sys

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from dflash.cli.common import check_overrides, remove_hydra_only_dir
from helpers.tables import make_depth_sweep


@pytest.mark.parametrize("app", ["train", "evaluate", "regenerate"])
def test_every_app_runs_under_dflash_artifacts(app, tmp_path, monkeypatch):
    import dflash.cli.train  # noqa: F401 - registers the run-name resolver of train.yaml

    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path / "store"))
    cfg = check_overrides(app, [])
    HydraConfig.instance().set_config(cfg)
    assert OmegaConf.select(cfg, "hydra.run.dir").startswith(f"{tmp_path}/store/")
    assert cfg.hydra.sweep.dir.startswith(f"{tmp_path}/store/")


def _hydra_files(directory, *extra: str) -> None:
    (directory / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (directory / ".hydra" / name).write_text("{}\n")
    for name in ("train.log", *extra):
        (directory / name).write_text("x\n")


def test_a_directory_of_hydra_files_alone_is_removed(tmp_path):
    _hydra_files(tmp_path / "run")
    assert remove_hydra_only_dir(str(tmp_path / "run")) and not (tmp_path / "run").exists()


@pytest.mark.parametrize("extra", [".dflash.lock", "results.json", "checkpoints/last.ckpt"])
def test_a_directory_with_anything_else_stays(tmp_path, extra):
    _hydra_files(tmp_path / "run")
    (tmp_path / "run" / extra).parent.mkdir(exist_ok=True)
    (tmp_path / "run" / extra).write_text("x\n")
    assert not remove_hydra_only_dir(str(tmp_path / "run")) and (tmp_path / "run" / extra).is_file()
    assert (tmp_path / "run" / ".hydra" / "config.yaml").is_file()


def test_the_working_directory_is_never_removed(tmp_path, monkeypatch):
    _hydra_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert not remove_hydra_only_dir(".") and (tmp_path / ".hydra").is_dir()


def test_a_refused_training_start_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    from dflash.cli import train

    (tmp_path / "no_data").mkdir()
    argv = [
        f"paths.artifacts={tmp_path / 'artifacts'}",
        f"data.path={tmp_path / 'no_data'}",  # found empty inside the Hydra task, after the run dir was made
        "logger=none",
        "eval.after_train=false",
        "run_name=refused",
    ]
    monkeypatch.setattr(sys, "argv", ["dflash.train", *argv])
    with pytest.raises(SystemExit) as exit_info:
        train.main()
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip().startswith("error: data.path: ")
    assert not (tmp_path / "artifacts" / "runs" / "refused").exists()


def test_tables_skip_incomplete_runs_with_one_note(tmp_path, monkeypatch, capsys):
    from dflash.cli import tables

    make_depth_sweep(str(tmp_path / "sweeps"))
    for name in ("started_a", "started_b"):
        _hydra_files(tmp_path / "sweeps" / "depth_cpu" / name)  # began, never wrote a result
    monkeypatch.setattr(
        sys, "argv", ["dflash.tables", f"root={tmp_path / 'sweeps'}", f"out_dir={tmp_path / 'tables'}", "plots=false"]
    )
    monkeypatch.chdir(tmp_path)
    tables.main()
    out = capsys.readouterr().out.splitlines()
    notes = [line for line in out if line.startswith("note: skipped")]
    assert notes == [f"note: skipped 2 incomplete run(s) without results.json: {tmp_path}/sweeps/depth_cpu/started_a and 1 more"]
    assert any("9 finished and 1 failed runs from" in line for line in out), out[
        -5:
    ]  # depth: 7 finished + 1 failed, depth_gsm8k: 2 finished
    assert "no result yet" not in (tmp_path / "tables" / "tables.md").read_text()
    assert os.path.isdir(tmp_path / "sweeps" / "depth_cpu" / "started_a")  # skipped, not deleted
