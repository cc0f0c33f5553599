"""The demo's plan, made at stage 1 from what each stage costs on this machine.

`measure` times the real target here, in seconds: the cache fill's forward over a batch of training
rows in float32 and under bf16 autocast, and greedy steps of the regeneration's path at its batch
size in float32 and bfloat16 (bfloat16 left out where its forward ran at under half float32's speed).
`plan` turns those measurements and the settings into a `Plan`, reading no clock, file or model:
the dtype of the answers (stage 2), the training precision (stage 3), how many prompts stage 2
answers, the minutes of training and the evaluation's size (stage 4).

Invariants:
- Explicit settings win: `data_dtype`, `train_precision`, `prompts` and `train_minutes` other than
  `auto` are taken as given; the `evaluation` counts are the most the plan uses.
- bfloat16 answers and bf16-mixed training only where they measured faster than float32 / 32-true.
- min(min_prompts, available) <= prompts <= available, where available is what the data option
  has; every source is cut by the same fraction, so the prompt families stay balanced.
- Each answer is charged max_new_tokens and each prompt token a step's time, timed after the
  median prompt (real answers see longer contexts, and many stop before max_new_tokens) as the
  median of three pairs of calls timed back to back, one dtype's model at a time (the first calls
  after another model's can run slow); the cache fill over rows of a training row's width (the
  prompts' mean length plus max_new_tokens), the precisions in turns, the fastest of each kept.
- Stage 2's estimate moves training minutes, not the finish: stage 3 takes what the clock leaves
  when it starts (`dflash.cli.demo.train_minutes`), less the planned cache fill and evaluation,
  whose errors move the finish. The margin is slack for those errors, not planned work: the
  expected finish leaves it out.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from dflash.errors import require
from dflash.schema import DEMO_ANSWER_DTYPES, DEMO_PRECISIONS

FAMILIES = ("humaneval", "math", "chat")  # stage 4's prompt families
PROBE_NEW_TOKENS = 6  # tokens per timed greedy call: the first comes from the prefill, the rest are steps
FILL_ROWS = 8  # the cache fill's batch (training.target_cache_batch_size)


@dataclass
class Measured:
    """What stage 1 measured (demo_summary.json keeps it with the plan)."""

    answer_tokens_per_s: dict[str, float]
    """Data dtype -> tokens/s of greedy steps at regenerate.batch_size (bfloat16 left out where
    the bf16 forward was under half float32's speed: `measure`)."""
    fill_tokens_per_s: dict[str, float]
    """Trainer precision -> tokens/s of the target's forward over training rows (the cache fill)."""
    forward_s: float
    """A float32 autoregressive step of the decode loop (stage 4's baseline; it decodes in float32)."""
    prompt_tokens: float
    """Mean prompt length of the data option's prompts, chat template included."""
    sources: dict[str, int]
    """Override prefix of each prompt source ("data.sources.0") -> the prompts it has."""
    probe_s: float = 0.0
    """Seconds the measurements took."""


@dataclass
class Plan:
    data_dtype: str
    precision: str
    prompts: int
    data_overrides: list[str]
    """The sources' `limit`s that cut them to `prompts`, after the user's data_overrides."""
    train_minutes: float
    evaluation: dict[str, int]
    """Family -> prompts."""
    seconds: dict[str, float]
    """Planned seconds of each part: data, cache_fill, train, evaluate, and the margin kept free."""
    started: float
    made: float
    finish: float
    """Epoch seconds: the budget's start, when the plan was made, the expected end."""
    measured: Measured

    @classmethod
    def from_dict(cls, saved: dict) -> Plan:
        return cls(**{**saved, "measured": Measured(**saved["measured"])})


def plan(measured: Measured, cfg, started: float, now: float) -> Plan:
    """The demo's choices for the settings `cfg` (dflash/conf/demo.yaml) on the machine `measured`
    describes, the budget counted from `started`, `now` the plan's time (epoch seconds)."""
    from dflash.data.regenerate import RegenerateSettings

    data_dtype = chosen(cfg.data_dtype, measured.answer_tokens_per_s, *DEMO_ANSWER_DTYPES)
    precision = chosen(cfg.train_precision, measured.fill_tokens_per_s, *DEMO_PRECISIONS)
    # a prompt costs its answer (stage 2) and its training row's forward (the cache fill, stage 3)
    row_tokens = measured.prompt_tokens + RegenerateSettings(**cfg.regenerate).max_new_tokens
    per_row = {
        "data": row_tokens / measured.answer_tokens_per_s[data_dtype],
        "cache_fill": row_tokens / measured.fill_tokens_per_s[precision],
    }
    row_s = sum(per_row.values())
    available = sum(measured.sources.values())
    floor = min(cfg.min_prompts, available)
    free_s = cfg.budget_minutes * 60 - (now - started) - cfg.margin_s
    least_train_s = 60 * (cfg.min_train_minutes if cfg.train_minutes == "auto" else cfg.train_minutes)
    evaluation = evaluation_counts(cfg, measured.forward_s, free_s - floor * row_s - least_train_s)
    reserve_s = evaluation_reserve_s(cfg, evaluation, measured.forward_s)
    room_s = free_s - reserve_s  # for the data and training
    if cfg.prompts == "auto":
        prompts = min(max(int(cfg.data_share * room_s / row_s), floor), available)
    else:
        require(cfg.prompts <= available, "prompts", f"data={cfg.data} has {available} prompts; ask for at most that, or auto")
        prompts = cfg.prompts
    limits = balanced(list(measured.sources.values()), prompts)
    seconds = {part: sum(limits) * cost for part, cost in per_row.items()}
    if cfg.train_minutes == "auto":
        minutes = max(cfg.min_train_minutes, math.floor((room_s - sum(seconds.values())) / 6) / 10)
    else:
        minutes = float(cfg.train_minutes)
    seconds.update(train=60 * minutes, evaluate=reserve_s, margin=cfg.margin_s)
    return Plan(
        data_dtype=data_dtype,
        precision=precision,
        prompts=sum(limits),
        data_overrides=[f"{key}.limit={n}" for (key, has), n in zip(measured.sources.items(), limits) if n < has],
        train_minutes=minutes,
        evaluation=evaluation,
        seconds={part: round(value, 1) for part, value in seconds.items()},
        started=started,
        made=now,
        finish=now + sum(value for part, value in seconds.items() if part != "margin"),
        measured=measured,
    )


def chosen(setting: str, rates: dict[str, float], plain: str, reduced: str) -> str:
    """`setting` unless it is auto; then `reduced` (bfloat16) where it measured faster than `plain`."""
    if setting != "auto":
        return setting
    return reduced if rates.get(reduced, 0) > rates[plain] else plain


def evaluation_counts(cfg, forward_s: float, room_s: float) -> dict[str, int]:
    """Prompts per family: the configured counts, each cut by the same fraction where their reserve
    does not fit `room_s`, never below `evaluation.min_prompts` (or the count, when smaller)."""
    asked = {family: cfg.evaluation[family] for family in FAMILIES}
    per_prompt_s = cfg.evaluation.max_new_tokens * forward_s * cfg.reserve_factor
    fits = max(0.0, room_s - len(FAMILIES) * cfg.evaluation.start_s) / per_prompt_s
    if sum(asked.values()) <= fits:
        return asked
    fraction = fits / sum(asked.values())
    return {family: max(min(n, cfg.evaluation.min_prompts), math.floor(n * fraction)) for family, n in asked.items()}


def evaluation_reserve_s(cfg, counts: dict[str, int], forward_s: float) -> float:
    """Seconds stage 4 may take: every prompt's tokens `reserve_factor` times the autoregressive step
    (the autoregressive loop once, then each method at up to one forward per token), plus each
    evaluate app's start."""
    tokens = sum(counts.values()) * cfg.evaluation.max_new_tokens
    return tokens * forward_s * cfg.reserve_factor + len(FAMILIES) * cfg.evaluation.start_s


def balanced(available: list[int], total: int) -> list[int]:
    """`total` rows drawn from sources of `available` rows by one fraction (largest remainders
    round up), at least one from each."""
    shares = [n * total / sum(available) for n in available]
    limits = [math.floor(share) for share in shares]
    for i in sorted(range(len(shares)), key=lambda i: limits[i] - shares[i])[: total - sum(limits)]:
        limits[i] += 1
    return [max(1, n) for n in limits]


def describe(plan: Plan, cfg) -> list[str]:
    """The plan, each choice with the measurement behind it, and the expected finish."""
    from dflash.data.regenerate import RegenerateSettings

    measured, seconds, regenerate = plan.measured, plan.seconds, RegenerateSettings(**cfg.regenerate)

    def given(key: str) -> str:
        return "" if cfg[key] == "auto" else f"; {key} as given"

    def rates(values: dict[str, float]) -> str:
        return ", ".join(f"{name} {rate:,.0f}" for name, rate in values.items())

    untimed = "" if "bfloat16" in measured.answer_tokens_per_s else "; bfloat16 untimed: its forward ran at under half the speed"
    asked = {family: cfg.evaluation[family] for family in FAMILIES}
    cut = "" if plan.evaluation == asked else f", cut from {'/'.join(map(str, asked.values()))} to fit"
    total, margin = (plan.finish - plan.started) / 60, seconds["margin"] / 60
    over = " (over the budget: min_prompts, min_train_minutes and evaluation.min_prompts do not fit)"
    return [
        f"answers in {plan.data_dtype} (tokens/s at batch {regenerate.batch_size}: {rates(measured.answer_tokens_per_s)}"
        f"{given('data_dtype') or untimed})",
        f"training in {plan.precision} (cache fill tokens/s: {rates(measured.fill_tokens_per_s)}{given('train_precision')})",
        f"{plan.prompts:,} of the {sum(measured.sources.values()):,} prompts of data={cfg.data}{given('prompts')}: "
        f"{seconds['data'] / 60:.1f} min to answer, {seconds['cache_fill'] / 60:.1f} min to fill the cache "
        f"(prompts of {measured.prompt_tokens:.0f} tokens, answers of up to {regenerate.max_new_tokens})",
        f"evaluation: {', '.join(f'{family} {n}' for family, n in plan.evaluation.items())} prompts{cut}: "
        f"{seconds['evaluate'] / 60:.1f} min reserved (autoregressive step {1000 * measured.forward_s:.1f} ms)",
        f"{plan.train_minutes:.1f} min of training{given('train_minutes')}; {margin:.1f} min margin kept free, "
        f"{(plan.made - plan.started) / 60:.1f} min spent, {measured.probe_s:.0f} s of it measuring",
        f"expected to finish at {time.strftime('%H:%M UTC', time.gmtime(plan.finish))}, "
        f"{total:.1f} of {cfg.budget_minutes:g} min{over if total + margin > cfg.budget_minutes + 0.05 else ''}",
    ]


def measure(target, target_cfg: dict, cfg, prompts: list[list[dict]], sources: dict[str, int], forward_s: float) -> Measured:
    """Time the cache fill and the answers here (`target`: the float32 target; `prompts`: the data
    option's prompts as chat messages, `sources` their count per source). bfloat16 answers are
    not timed where the bf16 forward ran at under half float32's speed: they cannot win there,
    and their probe (the kernels tuned, the steps at the batch size) would cost minutes."""
    import torch

    from dflash.data.chat import prompt_token_ids
    from dflash.data.regenerate import RegenerateSettings
    from dflash.specs import TargetSpec, load_target

    began = time.perf_counter()
    settings = RegenerateSettings(**cfg.regenerate)
    lengths = [len(prompt_token_ids(target.tokenizer, prompt, settings.enable_thinking)) for prompt in prompts]
    prompt_tokens = sum(lengths) / len(lengths)
    width = round(prompt_tokens + settings.max_new_tokens)  # a training row: a prompt and its longest answer
    ids = torch.randint(target.embedding_rows, (FILL_ROWS, width), generator=torch.Generator().manual_seed(0))
    fill_s = fastest_in_turns({precision: fill_forward(target, ids, precision == "bf16-mixed") for precision in DEMO_PRECISIONS})
    fills = {precision: ids.numel() / seconds for precision, seconds in fill_s.items()}
    median = prompts[sorted(range(len(prompts)), key=lengths.__getitem__)[len(prompts) // 2]]
    dtypes = DEMO_ANSWER_DTYPES if cfg.data_dtype == "auto" else (cfg.data_dtype,)
    if cfg.data_dtype == "auto" and fills["bf16-mixed"] < fills["32-true"] / 2:
        dtypes = ("float32",)
    answers = {}
    for dtype in dtypes:  # one model at a time: the first calls after another model's run slow
        same = dtype == str(target.dtype).removeprefix("torch.")
        model = target if same else load_target(TargetSpec(**{**target_cfg, "dtype": dtype}))
        answers[dtype] = settings.batch_size * (PROBE_NEW_TOKENS - 1) / step_seconds(*answer_calls(model, median, settings))
    return Measured(answers, fills, forward_s, prompt_tokens, sources, round(time.perf_counter() - began, 1))


def answer_calls(target, prompt: list[dict], settings) -> tuple[Callable, Callable]:
    """The regeneration's greedy answers (`HFGenerator`) at its batch size, to 1 and to
    `PROBE_NEW_TOKENS` tokens, warmed up: every row answers `prompt`, whose shared start runs
    once, so the second call's extra time is the steps'."""
    from dflash.data.generators import HFGenerator

    rows = [prompt] * settings.batch_size
    first, whole, warm_up = (HFGenerator(target, n, enable_thinking=settings.enable_thinking) for n in (1, PROBE_NEW_TOKENS, 2))
    warm_up(rows)  # at the batch size, a step included: tunes the kernels, pages the weights in
    return lambda: first(rows), lambda: whole(rows)


def step_seconds(first: Callable, whole: Callable, pairs: int = 3) -> float:
    """Seconds a `whole` call takes beyond a `first` one: the median over `pairs` pairs timed back
    to back, so a slow spell or a one-time cost falls on one pair; where noise swamps the steps,
    the whole call's median."""
    from dflash.timing import timed

    timings = [(timed(first)[1], timed(whole)[1]) for _ in range(pairs)]
    extra = statistics.median(whole_s - first_s for first_s, whole_s in timings)
    return extra if extra > 0 else statistics.median(whole_s for _, whole_s in timings)


def fill_forward(target, ids, autocast: bool) -> Callable:
    """The cache fill's forward over `ids` (`dflash.training.forward.target_features`), under
    bf16 autocast as bf16-mixed training runs it, or in the target's dtype; warmed up."""
    import torch

    from dflash.training.forward import target_features

    def forward(rows=ids):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            target_features(target, rows, [target.num_layers - 1])

    forward(ids[:1, :8])
    return forward


def fastest_in_turns(runs: dict, rounds: int = 3, within_s: float = 4.0) -> dict:
    """The fastest time of each of `runs`, timed in turns, for up to `rounds` rounds while they
    took under `within_s` together: a slow spell of a shared machine falls on every run alike
    and only adds time, and slow runs are timed once."""
    from dflash.timing import timed

    times: dict = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(timed(run)[1])
        if sum(map(sum, times.values())) >= within_s:
            break
    return {name: min(seconds) for name, seconds in times.items()}
