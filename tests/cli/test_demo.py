"""`make demo`'s own logic, in process: the budget's arithmetic, its settings, held-out
evaluation prompts, and resuming (the plan is kept per settings; a stage whose output is
current is skipped: the data by its marker, training by its drafter, each family's evaluation
by its results and arguments; other settings make new data or evaluate again). The plan's
choices on made-up machines: tests/cli/test_demo_plan.py. The demo end to end on
SmolLM2: tests/e2e/test_demo.py; a whole second run that skips every stage, through the
pipeline both demos share: tests/e2e/test_demo_tiny.py."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest

from dflash.cli import demo, demo_plan, pipeline
from dflash.cli.common import run_app
from dflash.data.builtin_prompts import FAMILIES, heldout_prompts
from dflash.errors import ConfigError
from dflash.fileio import read_json, write_json, write_jsonl
from dflash.layout import DEMO_TRAIN_MINUTES, DRAFTER_DIR, EVAL_DIR, RESULTS_FILE
from helpers.apps import assert_one_error_line, demo_config

# a made-up machine where bfloat16 answers faster and bf16-mixed fills slower
MEASURED = demo_plan.Measured(
    {"float32": 300, "bfloat16": 600},
    {"32-true": 900, "bf16-mixed": 400},
    0.05,
    100,
    {"data.sources.0": 1024, "data.sources.1": 256},
)


def planned(cfg, started: float | None = None, now: float | None = None) -> demo_plan.Plan:
    now = time.time() if now is None else now
    return demo_plan.plan(MEASURED, cfg, now - 60 if started is None else started, now)


def test_auto_training_minutes_are_what_the_budget_leaves_and_kept_on_resume(tmp_path, monkeypatch):
    cfg = demo_config(budget_minutes=30, margin_s=60, reserve_factor=2.0, **{"evaluation.start_s": 10})
    # this process "started" now: the module's import time is the earlier of the two clocks
    # the budget counts from, and a slow suite imports it long before this test runs
    monkeypatch.setattr(demo, "_STARTED", time.time())
    monkeypatch.setenv(demo.STARTED_ENV, str(time.time() - 600))  # 10 minutes spent (install, data)
    plan = planned(cfg)
    fill, reserve = plan.seconds["cache_fill"], (16 + 8 + 8) * 128 * 0.05 * 2.0 + 3 * 10
    assert plan.seconds["evaluate"] == pytest.approx(reserve, abs=0.1)
    minutes = demo.train_minutes(cfg, plan, str(tmp_path))
    assert minutes == pytest.approx((1800 - 600 - fill - reserve - 60) / 60, abs=0.15)
    # a resumed demo trains to the same total, whatever the clock says now
    monkeypatch.setenv(demo.STARTED_ENV, str(time.time() - 1500))
    assert demo.train_minutes(cfg, plan, str(tmp_path)) == minutes
    # a spent budget still trains the minimum (and says the budget will be exceeded)
    assert demo.train_minutes(cfg, plan, str(tmp_path / "late")) == cfg.min_train_minutes
    assert demo.train_minutes(demo_config(train_minutes=7), plan, str(tmp_path / "fixed")) == 7


def test_a_bad_start_time_is_one_config_error(monkeypatch):
    monkeypatch.setenv(demo.STARTED_ENV, "yesterday")
    with pytest.raises(ConfigError, match=f"^{demo.STARTED_ENV}: must be epoch seconds"):
        demo.demo_started()


# the demo's settings are checked by its schema (dflash.schema.DemoAppConfig), before Hydra runs
REFUSED = {
    "train_minutes=soon": ("train_minutes", "must be 'auto' (what the budget leaves) or minutes > 0"),
    "budget_minutes=0": ("budget_minutes", "must be a number > 0"),
    "evaluation.math=0": ("evaluation.math", "must be an integer >= 1"),
    "evaluation.min_prompts=0": ("evaluation.min_prompts", "must be an integer >= 1"),
    "evaluation.methods=[dflash,lookup]": ("evaluation.methods", "unknown method 'lookup'"),
    "data_dtype=bf16": ("data_dtype", "must be one of auto, float32, bfloat16, float16"),
    "train_precision=bf16": ("train_precision", "must be one of auto, 32-true, bf16-mixed"),
    "prompts=many": ("prompts", "must be 'auto'"),
    "min_prompts=0": ("min_prompts", "must be an integer >= 1"),
    "data_share=1.5": ("data_share", "must be a fraction in (0, 1]"),
}


@pytest.mark.parametrize("override", sorted(REFUSED))
def test_a_bad_setting_is_one_line_before_hydra_runs(override, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        run_app(lambda: pytest.fail("Hydra ran"), "demo", argv=[override])
    assert_one_error_line(exit_info.value.code, capsys.readouterr().err.strip().splitlines(), *REFUSED[override])


def test_the_plan_is_kept_for_a_resumed_demo_and_made_anew_for_other_settings(tmp_path, monkeypatch, capsys):
    measured = []

    def measure(target, target_cfg, cfg, prompts, sources, forward_s):
        measured.append(cfg.budget_minutes)
        return dataclasses.replace(MEASURED, sources=sources)

    monkeypatch.setattr(demo_plan, "measure", measure)
    monkeypatch.setattr(demo, "data_prompts", lambda cfg, artifacts: ([], {"data.sources.0": 1024, "data.sources.1": 256}))
    monkeypatch.setattr(demo, "target_option", lambda: "smollm2_135m")  # outside a Hydra app
    first = demo.make_plan(demo_config(), None, {}, 0.05, str(tmp_path))
    assert measured == [30] and "expected to finish at" in capsys.readouterr().out
    monkeypatch.setenv(demo.STARTED_ENV, str(time.time() + 60))  # a later `make demo`: its own clock
    assert demo.make_plan(demo_config(), None, {}, 0.05, str(tmp_path)) == first and measured == [30]
    assert "kept in" in capsys.readouterr().out
    assert demo.make_plan(demo_config(budget_minutes=60), None, {}, 0.05, str(tmp_path)) != first and measured == [30, 60]


@pytest.mark.parametrize("family", ["math", "chat"])
def test_heldout_prompts_are_never_training_prompts(family):
    training = FAMILIES[family](200, 0)
    heldout = heldout_prompts(family, 50, training)
    assert len(heldout) == len(set(heldout)) == 50
    assert not set(heldout) & set(training)
    assert heldout == heldout_prompts(family, 50, training)  # seeded


def test_too_many_heldout_prompts_is_one_config_error():
    with pytest.raises(ConfigError, match="^chat: cannot draw"):  # the held-out chat templates give 150 requests
        heldout_prompts("chat", 5_000, FAMILIES["chat"](200, 0))


class StageApps:
    """Stands in for the apps the stages run: records each command; the train app "exports"
    the drafter and the evaluate app "writes" results.json, as the real ones do."""

    def __init__(self, monkeypatch):
        self.commands: list[list[str]] = []
        monkeypatch.setattr(demo, "run_stage", self.run)  # stage 2, called from demo.py
        monkeypatch.setattr(pipeline, "run_stage", self.run)  # stages 3 and 4, the shared pipeline
        monkeypatch.setattr(demo, "target_option", lambda: "smollm2_135m")  # outside a Hydra app

    def run(self, number, name, command):
        self.commands.append(command)
        options = dict(argument.split("=", 1) for argument in command[3:] if "=" in argument)
        if name == "train":
            drafter = os.path.join(options["paths.artifacts"], "runs", options["run_name"], DRAFTER_DIR)
            os.makedirs(drafter)
            for file in ("config.json", "model.safetensors"):
                open(os.path.join(drafter, file), "w").close()
        elif name == "evaluate":
            write_json(os.path.join(options["hydra.run.dir"], RESULTS_FILE), {"benchmark": options["benchmark"]})

    def apps(self) -> list[str]:
        return [command[2] for command in self.commands]


def resumable_config(**overrides):
    return demo_config(train_minutes=0.15, **overrides)


def resumable_plan(cfg):
    return planned(cfg, started=time.time() - 60)


def test_a_resumed_demo_skips_the_data_training_and_each_familys_evaluation(tmp_path, monkeypatch, capsys):
    apps = StageApps(monkeypatch)
    cfg, artifacts = resumable_config(), str(tmp_path)
    plan = resumable_plan(cfg)

    def stages():
        data_dir = demo.regenerate_data(cfg, plan, artifacts)
        rows = [{"messages": [{"role": "user", "content": "What is 2 + 2?"}]}]  # the rows held-out prompts avoid
        write_jsonl(os.path.join(data_dir, "rows-00000.jsonl"), rows)
        run_dir = demo.train(cfg, plan, data_dir, artifacts)
        return data_dir, run_dir, demo.evaluate(cfg, plan, run_dir, data_dir, artifacts)

    first = stages()
    assert apps.apps() == ["dflash.regenerate", "dflash.train", "dflash.evaluate", "dflash.evaluate", "dflash.evaluate"]
    # the target answers in the planned dtype, the faster measured; training and evaluation keep the target's own
    assert [c for c in apps.commands if "target.dtype=bfloat16" in c] == apps.commands[:1]
    # training runs in the planned precision, on the planned prompts (stages 2 and 3 alike)
    assert "trainer.precision=32-true" in apps.commands[1]
    assert plan.data_overrides and all(set(plan.data_overrides) <= set(command) for command in apps.commands[:2])
    assert "done already" not in capsys.readouterr().out
    data_dir, run_dir, results = first
    assert results == {family: os.path.join(run_dir, EVAL_DIR, family, RESULTS_FILE) for family in demo.FAMILIES}
    assert read_json(os.path.join(run_dir, DEMO_TRAIN_MINUTES)) == {"minutes": 0.15}

    apps.commands.clear()
    assert stages() == first and apps.commands == []  # nothing runs again
    out = capsys.readouterr().out
    for text in ("[2/5] data: done already", "[3/5] train: done already"):
        assert text in out, text
    assert all(f"[4/5] evaluate: {family}: done already" in out for family in demo.FAMILIES), out

    # another setting of one family evaluates that family again, and only it
    cfg = resumable_config(**{"evaluation.humaneval": 2})
    assert demo.evaluate(cfg, resumable_plan(cfg), run_dir, data_dir, artifacts) == results
    (command,) = apps.commands
    assert "benchmark.max_samples=2" in command and f"hydra.run.dir={os.path.join(run_dir, EVAL_DIR, 'humaneval')}" in command
    # other data settings regenerate into another directory
    apps.commands.clear()
    other = demo.regenerate_data(cfg, dataclasses.replace(plan, data_overrides=["data.sources.0.limit=7"]), artifacts)
    assert other != data_dir and apps.apps() == ["dflash.regenerate"]
    apps.commands.clear()
    in_float32 = demo.regenerate_data(cfg, resumable_plan(resumable_config(data_dtype="float32")), artifacts)
    assert in_float32 not in (data_dir, other) and "target.dtype=float32" in apps.commands[0]
