"""The results of an evaluation: per-generation records, aggregates, results.json.

Aggregation (docs/design.md invariants 11, 16 and 17). Every acceptance length counts
the bonus token (accepted drafts + 1). Two aggregations of each headline number, labelled:
- tau (pooled): sum of acceptance lengths / number of verify steps, over every
  generation. Long generations weigh more.
- tau_per_prompt_mean: the mean over generations (turns) of each generation's tau, as
  the public DFlash benchmark harness computes it. Generations without a verify step
  (the first token ended them) are left out.
- speedup (end to end): the baseline's time per output token / DFlash's, each summed
  over all generations, prefill included (tokens_per_s is the same pooled ratio).
- speedup_decode_only: the harness's "Decoding speedup", which the DFlash paper
  reports: the mean over generations of the baseline's decode time per output token,
  divided by the same mean for DFlash. Decode time excludes the target's prefill and is
  divided by every output token, the prefill's first one included. Ours also counts the
  drafter's first forward, which the harness leaves out (docs/results-file.md, "Which
  tau, which speedup"). HF generate is timed whole, so it has no decode-only speedup.

Losslessness (greedy only; see `dflash.eval.divergence`): `lossless` is strict, every
DFlash output equals the autoregressive one token for token; `lossless_up_to_ties` is
true when every divergence is a near-tie within the target dtype's rounding
(`numerical`), false when any is a `bug` (a divergence that was not diagnosed counts as
a bug).

Several methods (`methods`) run on the same generations; every figure above exists per
method, against the same baselines. The first is the primary: the top-level fields are its.

results.json: `dflash.layout.Results`, one field each, described beside it; every nested
key in docs/results-file.md ("Every key").
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone

import torch

from dflash.eval.divergence import BUG, NUMERICAL, diagnose, first_difference
from dflash.layout import FAMILY_FIELDS, Results

METHOD = "dflash"
BASELINE = "autoregressive"
BASELINES = (BASELINE, "hf_generate")


@dataclass
class GenerationRecord:
    """One generation (one user turn) under every method that ran.

    outputs: method -> new token ids; times_s: method -> seconds (prefill + decode).
    acceptance_lengths: the primary method's tokens emitted per verify step (bonus token
        counted); acceptance: the same for every drafting method that ran (method -> list).
        A method missing from `acceptance` reads `acceptance_lengths` (records of one method).
    prefill_times_s / decode_times_s: method -> seconds, for the methods timed in two
        parts (all but HF generate, which is timed whole).
    divergences: method -> diagnosis of where its output first parts from the
        autoregressive one (`dflash.eval.divergence.diagnose`), for greedy runs.
    family: the prompt's family in a mixed benchmark (`Sample.family`), else None.
    """

    prompt_index: int
    turn: int
    num_prompt_tokens: int
    outputs: dict[str, list[int]] = field(default_factory=dict)
    times_s: dict[str, float] = field(default_factory=dict)
    acceptance_lengths: list[int] = field(default_factory=list)
    prefill_times_s: dict[str, float] = field(default_factory=dict)
    decode_times_s: dict[str, float] = field(default_factory=dict)
    divergences: dict[str, dict] = field(default_factory=dict)
    acceptance: dict[str, list[int]] = field(default_factory=dict)
    family: str | None = None

    def lengths(self, method: str | None = None) -> list[int]:
        """Acceptance lengths of `method` (None: the primary method's)."""
        return self.acceptance.get(method, self.acceptance_lengths)


def acceptance_histogram(records: list[GenerationRecord], block_size: int, method: str | None = None) -> list[int]:
    """Counts of verify steps that emitted 1..block_size tokens (entry k-1 for length k)."""
    counts = [0] * block_size
    for record in records:
        for length in record.lengths(method):
            counts[length - 1] += 1
    return counts


def mean_acceptance_length(records: list[GenerationRecord], method: str | None = None) -> float:
    """tau, pooled: emitted tokens per verify step over all generations, bonus token counted."""
    steps = sum(len(r.lengths(method)) for r in records)
    return sum(sum(r.lengths(method)) for r in records) / steps if steps else 0.0


def tau_per_prompt_mean(records: list[GenerationRecord], method: str | None = None) -> float:
    """tau as the public harness averages it: the mean over generations of their own tau
    (generations without a verify step left out; 0.0 when none has one)."""
    taus = [sum(lengths) / len(lengths) for lengths in (r.lengths(method) for r in records) if lengths]
    return sum(taus) / len(taus) if taus else 0.0


def tokens_per_second(records: list[GenerationRecord], method: str) -> float | None:
    if not all(method in r.outputs for r in records):
        return None
    seconds = sum(r.times_s[method] for r in records)
    return sum(len(r.outputs[method]) for r in records) / seconds if seconds > 0 else None


def speedup(records: list[GenerationRecord], baseline: str, method: str = METHOD) -> float | None:
    """End to end: the baseline's mean time per output token divided by the method's (summed, prefill included)."""
    ours, theirs = tokens_per_second(records, method), tokens_per_second(records, baseline)
    return ours / theirs if ours and theirs else None


def decode_time_per_token(records: list[GenerationRecord], method: str) -> float | None:
    """The harness's time per output token: the mean over generations of decode seconds / output tokens."""
    if not records or not all(method in r.decode_times_s for r in records):
        return None
    return sum(r.decode_times_s[method] / len(r.outputs[method]) for r in records) / len(records)


def speedup_decode_only(records: list[GenerationRecord], baseline: str = BASELINE, method: str = METHOD) -> float | None:
    """The paper's speedup: the baseline's `decode_time_per_token` divided by the method's."""
    ours, theirs = decode_time_per_token(records, method), decode_time_per_token(records, baseline)
    return theirs / ours if ours and theirs else None


def first_mismatch(records: list[GenerationRecord], reference: str, candidate: str) -> dict | None:
    """Where `candidate`'s output first differs from `reference`'s, or None if they agree.

    Returns {prompt_index, turn, position, expected, got}; a token is None where one
    output ended before the other.
    """
    for record in records:
        expected, got = record.outputs[reference], record.outputs[candidate]
        position = first_difference(expected, got)
        if position is None:
            continue
        return {
            "prompt_index": record.prompt_index,
            "turn": record.turn,
            "position": position,
            "expected": token_at(expected, position),
            "got": token_at(got, position),
        }
    return None


def token_at(tokens: list[int], position: int) -> int | None:
    return tokens[position] if position < len(tokens) else None


def divergences(records: list[GenerationRecord], candidate: str) -> dict:
    """{numerical: n, bug: m, details: [...]}: every generation where `candidate` parts from the baseline.

    A divergence without a diagnosis in its record counts as a bug: nothing shows it is a tie.
    """
    details = []
    for record in records:
        expected, got = record.outputs[BASELINE], record.outputs[candidate]
        position = first_difference(expected, got)
        if position is None:
            continue
        found = record.divergences.get(candidate)
        if found is None:
            found = diagnose(position, token_at(expected, position), token_at(got, position), None, None, None)
        details.append({"prompt_index": record.prompt_index, "turn": record.turn, **found})
    counts = {kind: sum(d["kind"] == kind for d in details) for kind in (NUMERICAL, BUG)}
    return {**counts, "details": details}


@dataclass
class MethodInfo:
    """What `build_results` records about a method besides its measurements."""

    label: str
    block_size: int
    drafter_block_size: int | None = None
    settings: dict = field(default_factory=dict)


def method_record(records: list[GenerationRecord], method: str, info: MethodInfo, greedy: bool) -> dict:
    """One method's figures over `records` (keys in the module docstring, under `methods`)."""
    mismatch = first_mismatch(records, BASELINE, method) if greedy else None
    diverged = divergences(records, method) if greedy else None
    return {
        "method": method,
        "label": info.label,
        "block_size": info.block_size,
        "drafter_block_size": info.drafter_block_size,
        "tau": mean_acceptance_length(records, method),
        "tau_per_prompt_mean": tau_per_prompt_mean(records, method),
        "acceptance_histogram": acceptance_histogram(records, info.block_size, method),
        "tokens_per_s": tokens_per_second(records, method),
        "speedup": {f"vs_{baseline}": speedup(records, baseline, method) for baseline in BASELINES},
        "speedup_decode_only": {f"vs_{BASELINE}": speedup_decode_only(records, BASELINE, method)},
        "lossless": (mismatch is None) if greedy else None,
        "first_mismatch": mismatch,
        "lossless_up_to_ties": (diverged["bug"] == 0) if greedy else None,
        "divergences": diverged,
        "settings": dict(info.settings),
    }


def build_results(
    records: list[GenerationRecord],
    *,
    benchmark: str,
    target: str,
    sampling,
    max_new_tokens: int,
    stop_token_ids: list[int],
    device: torch.device | str,
    config: dict | None = None,
    target_dtype: torch.dtype | None = None,
    kernel_path: str | None = None,
    methods: dict[str, MethodInfo] | None = None,
    benchmark_source: dict | None = None,
    drafter: str = "unspecified",
    block_size: int | None = None,
    drafter_block_size: int | None = None,
) -> Results:
    """results.json (schema in the module docstring); its top level is the primary method's.

    methods: every method that ran, primary first (None: DFlash alone, its label and block
        sizes `drafter`, `block_size`, `drafter_block_size`).
    benchmark_source: where the prompts came from (`dflash.eval.benchmarks.benchmark_source`).
    """
    greedy = sampling.temperature == 0
    ran_hf = all("hf_generate" in r.outputs for r in records)
    methods = methods or {METHOD: MethodInfo(drafter, block_size, drafter_block_size)}
    primary = next(iter(methods))
    per_method = {name: method_record(records, name, info, greedy) for name, info in methods.items()}
    hf_mismatch = first_mismatch(records, BASELINE, "hf_generate") if greedy and ran_hf else None
    return Results(
        benchmark=benchmark,
        benchmark_source=benchmark_source,
        target=target,
        target_dtype=str(target_dtype).removeprefix("torch.") if target_dtype is not None else None,
        kernel_path=kernel_path,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        verify_rule=sampling.verify_rule,
        max_new_tokens=max_new_tokens,
        num_prompts=len({r.prompt_index for r in records}),
        num_generations=len(records),
        tokens_per_s={method: tokens_per_second(records, method) for method in (*methods, *BASELINES)},
        hf_generate_matches=(hf_mismatch is None) if greedy and ran_hf else None,
        hf_generate_first_mismatch=hf_mismatch,
        hf_generate_divergences=divergences(records, "hf_generate") if greedy and ran_hf else None,
        methods=per_method,
        families=family_records(records, methods, greedy),
        stop_token_ids=list(stop_token_ids),
        per_prompt=[_per_prompt(r, list(methods)) for r in records],
        device=describe_device(device),
        versions=versions(),
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        config=config,
    ).of_method(primary)


def family_records(records: list[GenerationRecord], methods: dict[str, MethodInfo], greedy: bool) -> dict | None:
    """Per prompt family of a mixed benchmark: {family: {num_prompts, num_generations, the
    primary method's figures (as at the top level), methods: {name: method record}}}, in
    the order the families first appear; None when no record has a family."""
    families = list(dict.fromkeys(r.family for r in records if r.family is not None))
    if not families:
        return None
    primary = next(iter(methods))
    out = {}
    for family in families:
        mine = [r for r in records if r.family == family]
        per_method = {name: method_record(mine, name, info, greedy) for name, info in methods.items()}
        out[family] = {
            "num_prompts": len({r.prompt_index for r in mine}),
            "num_generations": len(mine),
            **{key: per_method[primary][key] for key in FAMILY_FIELDS},
            "methods": per_method,
        }
    return out


def _tau(lengths: list[int]) -> float:
    return sum(lengths) / len(lengths) if lengths else 0.0


def _per_prompt(record: GenerationRecord, methods: list[str]) -> dict:
    return {
        "prompt_index": record.prompt_index,
        "turn": record.turn,
        "family": record.family,
        "num_prompt_tokens": record.num_prompt_tokens,
        "tau": _tau(record.acceptance_lengths),
        "taus": {name: _tau(record.lengths(name)) for name in methods},
        "num_tokens": {method: len(tokens) for method, tokens in record.outputs.items()},
        "time_s": dict(record.times_s),
        "prefill_time_s": dict(record.prefill_times_s),
        "decode_time_s": dict(record.decode_times_s),
    }


def describe_device(device: torch.device | str) -> str:
    """E.g. "cuda:0 (NVIDIA H200)" or "cpu (x86_64, 2 threads)"."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    threads = torch.get_num_threads()
    return f"{device} ({platform.machine()}, {threads} thread{'' if threads == 1 else 's'})"


def versions() -> dict:
    import transformers

    import dflash

    return {
        "dflash": dflash.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }
