"""The config schema (dflash/schema.py): every field of every registered schema refuses
a value of the wrong type on the command line with `error: <full key>: ...` and exit 2,
naming a key of the composed config; the Python API and the command line share defaults."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import typing

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from dflash.cli.common import _compose, run_app
from dflash.schema import APP_SCHEMAS, METHOD_SCHEMAS
from dflash.structured import build

# the override that selects the schema of the `method` group (TrainAppConfig.method is Any)
METHOD_OVERRIDES = {"dflash": [], "dflash2": ["method=dflash2"], "dspark": ["method=dspark"], "eagle3": ["method=eagle3"]}


def _bad_value(hint) -> str | None:
    """A command-line value of the wrong type for annotation `hint` (None: any value fits)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union or type(hint).__name__ == "UnionType":
        if len(args) != 1:
            return None
        hint = args[0]
    base = typing.get_origin(hint) or hint
    if base is bool:
        return "maybe"
    if base in (int, float):
        return "abc"
    if base is str:
        return "{a: 1}"
    if base in (list, tuple):
        return "{a: 1}"
    if base is dict:
        return "abc"
    return None  # Any: checked by the dataclass's __post_init__


def _leaves(cls, prefix: str):
    """(full key, annotation) of every leaf field of dataclass `cls`, nested schemas walked."""
    for name, hint in typing.get_type_hints(cls).items():
        key = f"{prefix}.{name}" if prefix else name
        inner = [a for a in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(a)]
        if inner:  # a nested schema, or a list of them (data.sources): its first element
            yield from _leaves(inner[0], key if inner[0] is hint or typing.get_origin(hint) is typing.Union else f"{key}[0]")
        else:
            yield key, hint


def _cases():
    for app, schema in APP_SCHEMAS.items():
        for key, hint in _leaves(schema, ""):
            yield app, [], key, hint
    for name, schema in METHOD_SCHEMAS.items():
        for key, hint in _leaves(schema, "method"):
            yield "train", METHOD_OVERRIDES[name], key, hint


CASES = [case for case in _cases() if _bad_value(case[3]) is not None]


def test_every_schema_field_is_covered():
    assert len(CASES) > 120  # every typed field of every app and of the method group
    untyped = [key for app, _, key, hint in _cases() if _bad_value(hint) is None]
    assert set(untyped) <= {
        "method",
        "sweep",
        "train_minutes",  # the demo's: "auto" or minutes
        "prompts",  # the demo's: "auto" or a number of prompts
        "trainer.devices",
        "trainer.val_check_interval",
        "trainer.limit_val_batches",
        "training.loss_gamma",
        "data.data_files",
        "data.sources[0].data_files",
    }, untyped


@functools.cache
def _composed_once(app: str, overrides: tuple[str, ...]):
    """The app's composed config (its keys only are read: composed once per app and overrides)."""
    return _compose(app, list(overrides))


@pytest.mark.parametrize("app,select,key,hint", CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES])
def test_wrong_type_on_the_command_line_names_the_full_key(app, select, key, hint, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path))
    override = f"{key}={_bad_value(hint)}"
    composed = select
    if "[0]." in key:  # inside a list of schemas: the list, given whole
        base, field = key.split("[0].")
        item = {"path": "a.jsonl", field: "BAD"}
        override = f"{base}=[{{{', '.join(f'{k}: {v}' for k, v in item.items())}}}]".replace("BAD", _bad_value(hint))
        composed = [*select, f"{base}=[{{path: a.jsonl}}]"]
    with pytest.raises(SystemExit) as exit_info:
        run_app(lambda: pytest.fail(f"{override} reached the app"), app, argv=[*select, override])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {key}: "), error
    cfg = _composed_once(app, tuple(composed))
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    assert leaf in node.keys()  # the key exists in the composed config (its value unresolved)


@pytest.mark.parametrize(
    "app,args,line",
    [
        ("train", ["eval.decoding.max_new_tokens=abc"], "error: eval.decoding.max_new_tokens: expected int, got 'abc'"),
        ("evaluate", ["ngram.num_draft_tokens=many"], "error: ngram.num_draft_tokens: expected int, got 'many'"),
        ("regenerate", ["regenerate.top_p=high"], "error: regenerate.top_p: expected float, got 'high'"),
        ("train", ["method=eagle3", "method.ttt_lenght=3"], "error: method.ttt_lenght: unknown key"),
    ],
)
def test_the_apps_print_one_line_and_exit_2(app, args, line, tmp_path):
    env = {**os.environ, "DFLASH_ARTIFACTS": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", f"dflash.{app}", *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(line), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def _composed(app: str, overrides=()):
    cfg = _compose(app, list(overrides))
    HydraConfig.instance().set_config(cfg)  # resolves ${hydra:...}
    return cfg


def test_the_python_api_and_the_command_line_share_defaults(tmp_path, monkeypatch):
    from dflash.data.config import DataSpec
    from dflash.data.regenerate import RegenerateSettings
    from dflash.eval.settings import DecodingSettings
    from dflash.training.config import TrainingSettings
    from dflash.training.settings import CheckpointSettings, TrainerSettings

    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path))
    train = _composed("train", ["data.path=x.jsonl"])
    trainer, data = build(train.trainer, "trainer"), build(train.data, "data")
    # the three defaults that differed between YAML and dataclass before the schema (the YAML value kept)
    assert trainer.log_every_n_steps == TrainerSettings().log_every_n_steps == 10
    assert data.val_fraction == DataSpec(path="x.jsonl").val_fraction == 0.05
    regen = _composed("regenerate", ["data.path=x.jsonl"])
    assert build(regen.regenerate, "regenerate").batch_size == RegenerateSettings().batch_size == 16
    # the base options set nothing but what differs from the schema: their objects are the defaults
    assert trainer == TrainerSettings()
    assert build(train.training, "training") == TrainingSettings()
    assert build(train.checkpoint, "checkpoint") == CheckpointSettings()
    evaluate = _composed("evaluate", ["benchmark=humaneval"])
    assert build(evaluate.decoding, "decoding") == DecodingSettings()
    assert data == dataclasses.replace(DataSpec(path="x.jsonl"), cache_dir=data.cache_dir)
