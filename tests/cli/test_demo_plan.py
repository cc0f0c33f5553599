"""The demo's plan on made-up machines: a fast one with native bfloat16, an AVX2-only one where
bfloat16 is slower (rates of the order users measured), and one too slow for the budget; the
dtypes follow the faster measurement, the plan fits the budget where the floors allow, the
prompts stay between the floor and what the data option has, and explicit settings win. Then
the measurements themselves, on a tiny target: what they time, and what they leave out."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types

import pytest

from dflash.cli import demo_plan
from dflash.cli.demo_plan import FAMILIES, Measured, Plan, balanced, describe, plan
from dflash.errors import ConfigError
from helpers.apps import demo_config

SOURCES = {"data.sources.0": 1024, "data.sources.1": 256, "data.sources.2": 256}
FAST = Measured({"float32": 500, "bfloat16": 1070}, {"32-true": 900, "bf16-mixed": 1300}, 0.015, 110, SOURCES)
AVX2 = Measured({"float32": 120, "bfloat16": 28}, {"32-true": 250, "bf16-mixed": 61}, 0.03, 110, SOURCES)
CRAWL = Measured({"float32": 15, "bfloat16": 4}, {"32-true": 30, "bf16-mixed": 8}, 0.12, 110, SOURCES)
NOW = 1_800_000_000.0
SPENT_S = 180  # install and stage 1


def planned(measured: Measured = AVX2, **overrides) -> Plan:
    return plan(measured, demo_config(**overrides), NOW - SPENT_S, NOW)


def end_minutes(result: Plan) -> float:
    """When the plan expects to finish, in minutes of the budget, the margin kept free added."""
    return (result.finish - result.started + result.seconds["margin"]) / 60


def limits(result: Plan) -> dict[str, int]:
    """Source -> the prompts the plan answers from it."""
    cut = dict(override.split(".limit=") for override in result.data_overrides)
    return {source: int(cut.get(source, has)) for source, has in SOURCES.items()}


def test_a_fast_machine_answers_every_prompt_in_bfloat16_and_trains_until_the_budget_ends():
    result = planned(FAST)
    assert (result.data_dtype, result.precision) == ("bfloat16", "bf16-mixed")
    assert result.prompts == sum(SOURCES.values()) and result.data_overrides == []
    assert result.evaluation == {family: demo_config().evaluation[family] for family in FAMILIES}
    assert 30 - 0.1 <= end_minutes(result) <= 30  # training takes the slack, in tenths of a minute
    assert result.train_minutes > 10


def test_an_avx2_machine_answers_fewer_prompts_in_float32_and_fits_the_budget():
    result = planned(AVX2)
    assert (result.data_dtype, result.precision) == ("float32", "32-true")
    cfg = demo_config()
    assert cfg.min_prompts <= result.prompts < sum(SOURCES.values())
    assert end_minutes(result) <= 30 and result.train_minutes >= cfg.min_train_minutes
    # every source is cut by the same fraction: the families stay balanced
    answered = limits(result)
    assert sum(answered.values()) == result.prompts
    for source, has in SOURCES.items():
        assert abs(answered[source] - has * result.prompts / sum(SOURCES.values())) < 1
    # what the fixed settings chose (bfloat16 answers, bf16-mixed training, every prompt) runs far over
    fixed = planned(AVX2, data_dtype="bfloat16", train_precision="bf16-mixed", prompts=sum(SOURCES.values()))
    assert end_minutes(fixed) > 2 * 30


def test_a_machine_too_slow_for_the_budget_keeps_the_floors_and_says_it_runs_over():
    cfg = demo_config()
    result = planned(CRAWL)
    assert result.prompts == cfg.min_prompts
    assert all(cfg.evaluation.min_prompts <= n < cfg.evaluation[family] for family, n in result.evaluation.items())
    assert result.train_minutes == cfg.min_train_minutes and end_minutes(result) > 30
    assert "over the budget" in describe(result, cfg)[-1]
    assert "over the budget" not in describe(planned(FAST), cfg)[-1]
    # an evaluation count under the floor stays as asked
    assert planned(CRAWL, **{"evaluation.chat": 2}).evaluation["chat"] == 2


def test_the_prompts_never_go_below_the_floor_nor_above_what_the_data_option_has():
    for budget in (5, 30, 60, 600):
        result = planned(AVX2, budget_minutes=budget)
        assert demo_config().min_prompts <= result.prompts <= sum(SOURCES.values()), budget
    assert planned(AVX2, budget_minutes=600).prompts == sum(SOURCES.values())
    assert planned(CRAWL, min_prompts=5000).prompts == sum(SOURCES.values())  # the floor is capped at what there is


def test_a_longer_budget_plans_more_prompts_and_more_training():
    short, longer = planned(AVX2), planned(AVX2, budget_minutes=60)
    assert longer.prompts > short.prompts and longer.train_minutes > short.train_minutes
    assert end_minutes(longer) <= 60
    # above the floor the data (answers and cache fill) take data_share of what the evaluation and margin leave
    cfg, seconds = demo_config(), longer.seconds
    room = 60 * 60 - SPENT_S - seconds["evaluate"] - seconds["margin"]
    data = seconds["data"] + seconds["cache_fill"]
    assert cfg.data_share * room - 2 * data / longer.prompts <= data <= cfg.data_share * room


def test_untimed_bfloat16_answers_are_never_chosen():
    result = planned(dataclasses.replace(AVX2, answer_tokens_per_s={"float32": 120}))
    assert result.data_dtype == "float32" and "bfloat16 untimed" in describe(result, demo_config())[0]


@pytest.mark.parametrize("faster", ["float32", "bfloat16"])
def test_each_dtype_follows_the_faster_measurement(faster):
    slower = {"float32": "bfloat16", "bfloat16": "float32"}[faster]
    answers = {faster: 400.0, slower: 300.0}
    precision = {"float32": "32-true", "bfloat16": "bf16-mixed"}
    fills = {precision[faster]: 300.0, precision[slower]: 400.0}  # the fill the other way round
    result = planned(dataclasses.replace(FAST, answer_tokens_per_s=answers, fill_tokens_per_s=fills))
    assert (result.data_dtype, result.precision) == (faster, precision[slower])


def test_explicit_settings_win_over_the_plan():
    result = planned(AVX2, data_dtype="bfloat16", train_precision="bf16-mixed", prompts=300, train_minutes=7)
    assert (result.data_dtype, result.precision, result.prompts, result.train_minutes) == ("bfloat16", "bf16-mixed", 300, 7)
    assert "data_dtype as given" in describe(result, demo_config(data_dtype="bfloat16"))[0]
    with pytest.raises(ConfigError, match="^prompts: data=smollm2_demo has 1536 prompts"):
        planned(AVX2, prompts=2000)


def test_a_plan_reads_back_from_its_json():
    result = planned(AVX2)
    assert Plan.from_dict(json.loads(json.dumps(dataclasses.asdict(result)))) == result
    finish = re.search(r"expected to finish at (\d\d:\d\d) UTC, ([\d.]+) of 30 min", describe(result, demo_config())[-1])
    assert finish and float(finish[2]) == pytest.approx((result.finish - result.started) / 60, abs=0.05)


@pytest.mark.parametrize("available,total", [([1024, 256, 256], 256), ([1024, 256, 256], 1000), ([7, 3, 3], 5)])
def test_balanced_limits_take_one_fraction_of_every_source(available, total):
    cut = balanced(available, total)
    assert sum(cut) == total and all(1 <= n <= has for n, has in zip(cut, available))
    assert all(abs(n - has * total / sum(available)) < 1 for n, has in zip(cut, available))


PROMPTS = [[{"role": "user", "content": "Write a function that " + "sums a list " * n}] for n in range(1, 6)]


@pytest.mark.parametrize("bf16_fill_s,timed", [(3.0, ["float32"]), (1.5, ["float32", "bfloat16"])])
def test_bfloat16_answers_are_timed_unless_the_bf16_forward_ran_at_under_half_the_speed(
    qwen3_target, monkeypatch, bf16_fill_s, timed
):
    prepared = []

    def answer_calls(target, prompt, settings):
        prepared.append(str(target.dtype).removeprefix("torch."))
        return print, print

    def fastest_in_turns(runs):  # made-up times: the fill's by precision
        return {name: {"32-true": 1.0, "bf16-mixed": bf16_fill_s}[name] for name in runs}

    monkeypatch.setattr(demo_plan, "answer_calls", answer_calls)
    monkeypatch.setattr(demo_plan, "fastest_in_turns", fastest_in_turns)
    monkeypatch.setattr(demo_plan, "step_seconds", lambda first, whole: 0.5 * (demo_plan.PROBE_NEW_TOKENS - 1))  # 0.5 s a step
    monkeypatch.setattr("dflash.specs.load_target", lambda spec: types.SimpleNamespace(dtype=spec.dtype))
    measured = demo_plan.measure(qwen3_target, {"path": "unused"}, demo_config(), PROMPTS, {"data": 5}, 0.01)
    assert prepared == timed == list(measured.answer_tokens_per_s)
    batch = demo_config().regenerate.batch_size
    assert all(rate == pytest.approx(batch / 0.5) for rate in measured.answer_tokens_per_s.values())  # the steps' rate
    assert measured.fill_tokens_per_s["32-true"] == pytest.approx(bf16_fill_s * measured.fill_tokens_per_s["bf16-mixed"])
    # a dtype given is the one timed
    prepared.clear()
    demo_plan.measure(qwen3_target, {"path": "unused"}, demo_config(data_dtype="bfloat16"), PROMPTS, {"data": 5}, 0.01)
    assert prepared == ["bfloat16"]


def test_the_cache_fill_is_timed_over_rows_of_a_training_rows_width(qwen3_target, monkeypatch):
    fills = []
    monkeypatch.setattr(demo_plan, "answer_calls", lambda target, prompt, settings: (print, print))
    monkeypatch.setattr(demo_plan, "fill_forward", lambda target, ids, autocast: fills.append(tuple(ids.shape)) or print)
    cfg = demo_config(data_dtype="float32")
    measured = demo_plan.measure(qwen3_target, {"path": "unused"}, cfg, PROMPTS, {"data": 5}, 0.01)
    width = round(measured.prompt_tokens + cfg.regenerate.max_new_tokens)
    assert fills == [(demo_plan.FILL_ROWS, width)] * len(demo_plan.DEMO_PRECISIONS)


def test_the_steps_are_the_median_difference_of_pairs_timed_back_to_back(monkeypatch):
    """A one-time cost on the first pair's first call (or a slow spell on one pair) moves nothing;
    where the difference is noise (not positive), the whole call's median stands for the steps."""
    clock = iter([2.0, 1.5, 0.5, 1.0, 0.5, 1.1] + [1.0, 0.9, 1.0, 0.8, 1.0, 0.7])  # (first, whole) x 3, twice
    monkeypatch.setattr("dflash.timing.timed", lambda run: (None, next(clock)))
    assert demo_plan.step_seconds(print, print) == pytest.approx(0.5)  # differences -0.5, 0.5, 0.6
    assert demo_plan.step_seconds(print, print) == pytest.approx(0.8)  # differences all negative: whole's median


def test_the_fastest_of_runs_timed_in_turns_within_a_time_limit():
    calls = []
    quick = demo_plan.fastest_in_turns({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")})
    assert calls == ["a", "b"] * 3 and set(quick) == {"a", "b"}  # three rounds where they are quick
    calls.clear()
    demo_plan.fastest_in_turns({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, within_s=0)
    assert calls == ["a", "b"]  # slow ones once


def test_measure_times_the_regeneration_and_the_cache_fill_on_a_real_target(qwen3_target):
    from dflash.data.chat import prompt_token_ids

    cfg = demo_config(data_dtype="float32", **{"regenerate.batch_size": 8})
    measured = demo_plan.measure(qwen3_target, {"path": "unused"}, cfg, PROMPTS, {"data": 5}, 0.01)
    rates = [*measured.answer_tokens_per_s.values(), *measured.fill_tokens_per_s.values()]
    assert list(measured.answer_tokens_per_s) == ["float32"] and list(measured.fill_tokens_per_s) == list(demo_plan.DEMO_PRECISIONS)
    assert all(0 < rate < math.inf for rate in rates) and measured.probe_s > 0
    lengths = [len(prompt_token_ids(qwen3_target.tokenizer, prompt, False)) for prompt in PROMPTS]
    assert measured.prompt_tokens == pytest.approx(sum(lengths) / len(lengths)) and lengths[0] < measured.prompt_tokens
