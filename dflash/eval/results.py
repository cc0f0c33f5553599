"""The results of an evaluation: per-generation records, aggregates, results.json.

Aggregation sums first and divides last (DESIGN.md, "Getting it right" 6):
- tau = sum of acceptance lengths / number of verify steps, over every generation;
  an acceptance length counts the bonus token (accepted drafts + 1).
- tokens/s of a method = its output tokens / its seconds (prefill included), summed.
- speedup vs a baseline = baseline's time per output token / DFlash's, both summed.

results.json schema (`build_results`):
  benchmark, method ("dflash"), target, drafter (path or "random"), block_size,
  drafter_block_size (trained), temperature, top_p, top_k, verify_rule, max_new_tokens,
  num_prompts, num_generations (one per turn), tau, acceptance_histogram (list: entry k-1
  counts verify steps that emitted k tokens, k = 1..block_size), tokens_per_s {dflash,
  autoregressive, hf_generate}, speedup {vs_autoregressive, vs_hf_generate}, lossless
  (greedy: every DFlash output equals the autoregressive one; null when sampling),
  first_mismatch, hf_generate_matches (greedy: HF generate equals the autoregressive
  baseline; null when sampling or skipped), hf_generate_first_mismatch, stop_token_ids,
  per_prompt (one entry per generation: prompt_index, turn, num_prompt_tokens, tau,
  num_tokens {method: n}, time_s {method: seconds}), device, versions {dflash, torch,
  transformers, python}, timestamp (UTC ISO 8601), config (the resolved config or null).
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone

import torch

from dflash.fileio import write_json

METHOD = "dflash"
BASELINES = ("autoregressive", "hf_generate")
METHODS = (METHOD, *BASELINES)


@dataclass
class GenerationRecord:
    """One generation (one user turn) under every method that ran.

    outputs: method -> new token ids; times_s: method -> seconds (prefill + decode).
    acceptance_lengths: DFlash tokens emitted per verify step (bonus token counted).
    """

    prompt_index: int
    turn: int
    num_prompt_tokens: int
    outputs: dict[str, list[int]] = field(default_factory=dict)
    times_s: dict[str, float] = field(default_factory=dict)
    acceptance_lengths: list[int] = field(default_factory=list)


def acceptance_histogram(records: list[GenerationRecord], block_size: int) -> list[int]:
    """Counts of verify steps that emitted 1..block_size tokens (entry k-1 for length k)."""
    counts = [0] * block_size
    for record in records:
        for length in record.acceptance_lengths:
            counts[length - 1] += 1
    return counts


def mean_acceptance_length(records: list[GenerationRecord]) -> float:
    """tau: emitted tokens per verify step over all generations, bonus token counted."""
    steps = sum(len(r.acceptance_lengths) for r in records)
    return sum(sum(r.acceptance_lengths) for r in records) / steps if steps else 0.0


def tokens_per_second(records: list[GenerationRecord], method: str) -> float | None:
    if not all(method in r.outputs for r in records):
        return None
    seconds = sum(r.times_s[method] for r in records)
    return sum(len(r.outputs[method]) for r in records) / seconds if seconds > 0 else None


def speedup(records: list[GenerationRecord], baseline: str) -> float | None:
    """Baseline's mean time per output token divided by DFlash's."""
    ours, theirs = tokens_per_second(records, METHOD), tokens_per_second(records, baseline)
    return ours / theirs if ours and theirs else None


def first_mismatch(records: list[GenerationRecord], reference: str, candidate: str) -> dict | None:
    """Where `candidate`'s output first differs from `reference`'s, or None if they agree.

    Returns {prompt_index, turn, position, expected, got}; a token is None where one
    output ended before the other.
    """
    for record in records:
        expected, got = record.outputs[reference], record.outputs[candidate]
        if expected == got:
            continue
        position = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
        return {
            "prompt_index": record.prompt_index,
            "turn": record.turn,
            "position": position,
            "expected": expected[position] if position < len(expected) else None,
            "got": got[position] if position < len(got) else None,
        }
    return None


def build_results(
    records: list[GenerationRecord],
    *,
    benchmark: str,
    target: str,
    drafter: str,
    block_size: int,
    drafter_block_size: int,
    sampling,
    max_new_tokens: int,
    stop_token_ids: list[int],
    device: torch.device | str,
    config: dict | None = None,
) -> dict:
    """The results.json dictionary (schema in the module docstring)."""
    greedy = sampling.temperature == 0
    ran_hf = all("hf_generate" in r.outputs for r in records)
    mismatch = first_mismatch(records, "autoregressive", METHOD) if greedy else None
    hf_mismatch = first_mismatch(records, "autoregressive", "hf_generate") if greedy and ran_hf else None
    return {
        "benchmark": benchmark,
        "method": METHOD,
        "target": target,
        "drafter": drafter,
        "block_size": block_size,
        "drafter_block_size": drafter_block_size,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "verify_rule": sampling.verify_rule,
        "max_new_tokens": max_new_tokens,
        "num_prompts": len({r.prompt_index for r in records}),
        "num_generations": len(records),
        "tau": mean_acceptance_length(records),
        "acceptance_histogram": acceptance_histogram(records, block_size),
        "tokens_per_s": {method: tokens_per_second(records, method) for method in METHODS},
        "speedup": {f"vs_{baseline}": speedup(records, baseline) for baseline in BASELINES},
        "lossless": (mismatch is None) if greedy else None,
        "first_mismatch": mismatch,
        "hf_generate_matches": (hf_mismatch is None) if greedy and ran_hf else None,
        "hf_generate_first_mismatch": hf_mismatch,
        "stop_token_ids": list(stop_token_ids),
        "per_prompt": [_per_prompt(r) for r in records],
        "device": describe_device(device),
        "versions": versions(),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config,
    }


def _per_prompt(record: GenerationRecord) -> dict:
    steps = len(record.acceptance_lengths)
    return {
        "prompt_index": record.prompt_index,
        "turn": record.turn,
        "num_prompt_tokens": record.num_prompt_tokens,
        "tau": sum(record.acceptance_lengths) / steps if steps else 0.0,
        "num_tokens": {method: len(tokens) for method, tokens in record.outputs.items()},
        "time_s": dict(record.times_s),
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


def write_results(results: dict, path: str) -> str:
    """Write `results` as JSON to `path` atomically (temp file + rename); returns `path`."""
    return write_json(path, results, indent=2)
