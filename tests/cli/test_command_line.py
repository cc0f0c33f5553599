"""The command line as Hydra reads it, checked before Hydra runs (dflash.cli.common): keys
that no schema reads, Hydra's own flags, and configs from the user's own directory
(`--config-dir`, `hydra.searchpath`) get the same one-line errors as everything else."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dflash.cli.common import check_overrides, parse_command_line, run_app
from dflash.errors import ConfigError
from dflash.structured import build
from dflash.training.config import TrainingSettings

MINE = """# @package _global_
# My own run: another target and learning rate.
defaults:
  - override /target: tiny_llama
training:
  learning_rate: 0.01
"""


@pytest.fixture
def user_conf(tmp_path) -> Path:
    """A config directory of the user's own, outside the package: experiment/mine.yaml and two broken ones."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(MINE)
    (tmp_path / "experiment" / "typo.yaml").write_text("# @package _global_\ntraining:\n  lr: 0.01\n")
    (tmp_path / "experiment" / "wrong_type.yaml").write_text("# @package _global_\ntraining:\n  learning_rate: fast\n")
    return tmp_path


def refused(config_name: str, args: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        check_overrides(config_name, args)
    return err.value


@pytest.mark.parametrize(
    "override, key",
    [
        ("+training.lr=1", "training.lr"),
        ("+trainer.fast_dev_run=true", "trainer.fast_dev_run"),
        ("+eval.decoding.foo=1", "eval.decoding.foo"),
    ],
)
def test_a_key_added_with_plus_that_no_schema_reads_is_refused(override, key):
    err = refused("train", [override])
    assert err.key == key and "no setting reads it" in str(err) and "valid keys here" in str(err)


def test_the_unknown_key_message_no_longer_suggests_plus_under_a_schema():
    err = refused("train", ["training.lr=1"])
    assert err.key == "training.lr" and "+training.lr" not in str(err) and "'learning_rate'" in str(err)


def test_build_refuses_a_key_its_dataclass_has_no_field_for():
    node = OmegaConf.structured(TrainingSettings)
    OmegaConf.update(node, "lr", 1, force_add=True)  # what `+training.lr=1` does
    with pytest.raises(ConfigError, match=r"^training\.lr: unknown key"):
        build(node, "training")


def test_keys_of_untyped_blocks_may_be_added():
    cfg = check_overrides("train", ["+sweep.name=mine"])  # `sweep` is free-form (read by dflash.sweep)
    assert cfg.sweep.name == "mine"


@pytest.mark.parametrize("form", ["--config-dir", "-cd", "--config-dir=", "hydra.searchpath"])
def test_an_experiment_from_the_users_own_directory(user_conf, form):
    if form == "hydra.searchpath":
        args = [f"hydra.searchpath=[file://{user_conf}]", "experiment=mine"]
    elif form.endswith("="):
        args = [f"{form}{user_conf}", "experiment=mine"]
    else:
        args = [form, str(user_conf), "experiment=mine"]
    cfg = check_overrides("train", args)
    assert cfg.training.learning_rate == 0.01
    assert (cfg.hydra.runtime.choices.experiment, cfg.hydra.runtime.choices.target) == ("mine", "tiny_llama")


def test_an_unknown_experiment_lists_the_users_own_too(user_conf):
    err = refused("train", ["--config-dir", str(user_conf), "experiment=nope"])
    assert err.key == "experiment" and "'mine'" in str(err) and "'tiny_cpu'" in str(err)


@pytest.mark.parametrize(
    "name, key, text",
    [
        ("typo", "training.lr", "(in experiment/typo.yaml)"),
        ("wrong_type", "training.learning_rate", "expected float, got 'fast' (in experiment/wrong_type.yaml)"),
    ],
)
def test_a_mistake_inside_the_users_file_names_the_key_and_the_file(user_conf, name, key, text):
    err = refused("train", ["-cd", str(user_conf), f"experiment={name}"])
    assert err.key == key and text in str(err)


@pytest.mark.parametrize(
    "args, key, text",
    [
        (["--config-dir", "/nonexistent/conf"], "--config-dir", "is not a directory"),
        (["--config-dir"], "--config-dir", "needs a value"),
        (["--lr=1"], "--lr=1", "unknown flag"),
    ],
)
def test_bad_flags_are_one_line(args, key, text):
    err = refused("train", args)
    assert err.key == key and text in str(err)


def test_flags_that_print_are_checked_like_a_run():
    assert refused("train", ["--cfg", "job", "+training.lr=1"]).key == "training.lr"
    assert refused("train", ["-m", "+training.lr=1,2"]).key == "training.lr"


def test_flags_only_hydra_acts_on_are_left_to_it():
    assert check_overrides("train", ["--hydra-help"]) is None
    assert parse_command_line("train", ["--info", "searchpath", "seed=1"]).overrides == ["seed=1"]


def test_run_app_stops_before_hydra_on_a_plus_key(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["dflash.train", "+trainer.fast_dev_run=true"])
    with pytest.raises(SystemExit) as exit_info:
        run_app(lambda: pytest.fail("Hydra ran"), "train")
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: trainer.fast_dev_run: ")
