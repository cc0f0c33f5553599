"""A readable summary of results.json, for the terminal."""

from __future__ import annotations

from dflash.eval.results import BASELINES, METHOD
from dflash.layout import Results
from dflash.methods import label


def format_results(results: Results) -> str:
    """A table of speed per method, the primary method's acceptance and losslessness lines,
    then one line per method when several ran."""
    mode = "greedy"
    if results.temperature > 0:
        mode = f"sampling T={results.temperature} top_p={results.top_p} top_k={results.top_k}"
        mode += f" ({results.verify_rule} verification)"
    primary = results.method or METHOD
    name = label(primary)
    trained = f" (drafter trained with {results.drafter_block_size})" if results.drafter_block_size is not None else ""
    lines = [
        f"{name} evaluation: {results.benchmark}, {results.num_prompts} prompts "
        f"({results.num_generations} generations), block size {results.block_size}{trained}, {mode}, "
        f"max_new_tokens {results.max_new_tokens}",
        f"target: {results.target}   drafter: {results.drafter}   device: {results.device}",
        "",
        f"{'method':<16}{'tokens':>10}{'seconds':>11}{'tokens/s':>11}{f'{name} speedup over it':>24}",
    ]
    speedups = {key.removeprefix("vs_"): value for key, value in results.speedup.items()}
    for method in results.tokens_per_s:
        if results.tokens_per_s[method] is None:
            lines.append(f"{method:<16}{'(skipped)':>10}")
            continue
        tokens = sum(p["num_tokens"][method] for p in results.per_prompt)
        seconds = sum(p["time_s"][method] for p in results.per_prompt)
        speedup = speedups.get(method)
        speedup_text = f"{speedup:.2f}x" if speedup is not None else ("n/a" if method in BASELINES else "-")
        tokens_per_s = results.tokens_per_s[method]
        lines.append(f"{method:<16}{tokens:>10}{seconds:>11.3f}{tokens_per_s:>11.1f}{speedup_text:>24}")
    histogram = "  ".join(f"{k}:{count}" for k, count in enumerate(results.acceptance_histogram, start=1))
    decode_only = results.speedup_decode_only_vs_autoregressive
    lines += [
        "",
        "tau (acceptance length per verify step, bonus token counted):",
        f"  pooled over all verify steps: {results.tau:.3f}",
        f"  mean of per-generation means (the DFlash paper's harness): {results.tau_per_prompt_mean:.3f}",
        "speedup over autoregressive:",
        f"  end to end (summed time per output token, prefill included): {_times(results.speedup_vs_autoregressive)}",
        f"  decode only (mean per-generation time per output token, prefill excluded; the paper's): {_times(decode_only)}",
        f"acceptance histogram (tokens emitted per step: steps): {histogram}",
        f"lossless ({name} == autoregressive, token for token; target dtype {results.target_dtype}): "
        + _agreement(results.lossless, results.first_mismatch),
    ]
    lines += _divergence_lines(results.divergences)
    lines.append(
        "HF generate matches autoregressive: " + _agreement(results.hf_generate_matches, results.hf_generate_first_mismatch)
    )
    lines += _divergence_lines(results.hf_generate_divergences)
    methods = results.methods or {}
    if len(methods) > 1:
        width = max(10, *(len(name) + 2 for name in methods))
        lines += [
            "",
            "every method on the same prompts, seeds and stops (tau counts the bonus token; speedup over autoregressive):",
            f"{'method':<{width}}{'B':>4}{'tau pooled':>12}{'tau per-gen':>13}{'end to end':>12}{'decode only':>13}  lossless",
        ]
        for method in methods:
            view = results.of_method(method)
            lossless = "n/a (sampling)" if view.lossless is None else str(view.lossless).lower()
            if view.lossless is False and view.lossless_up_to_ties:
                lossless += " (near-ties only)"
            lines.append(
                f"{method:<{width}}{view.block_size:>4}{view.tau:>12.3f}{view.tau_per_prompt_mean:>13.3f}"
                f"{_times(view.speedup_vs_autoregressive):>12}{_times(view.speedup_decode_only_vs_autoregressive):>13}  {lossless}"
            )
    return "\n".join(lines)


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _divergence_lines(divergences: dict | None) -> list[str]:
    """A count of near-ties and bugs, and one line per bug, when outputs diverged."""
    if not divergences or not divergences["details"]:
        return []
    verdict = "identical up to near-ties" if divergences["bug"] == 0 else "NOT explained by rounding"
    lines = [
        f"  divergences: {divergences['numerical']} numerical (near-ties within the dtype's rounding), "
        f"{divergences['bug']} bug{'' if divergences['bug'] == 1 else 's'}: {verdict}"
    ]
    for detail in divergences["details"]:
        if detail["kind"] != "numerical":
            gaps = ""
            if detail["baseline"] is not None:
                gaps = (f", logit gap {detail['baseline']['gap']:.4g} (baseline) / {detail['candidate']['gap']:.4g} "
                        f"(candidate) > tolerance {detail['tolerance']:.4g}")  # fmt: skip
            lines.append(
                f"  bug at prompt {detail['prompt_index']} turn {detail['turn']} position {detail['position']}: "
                f"expected {detail['expected']}, got {detail['got']}{gaps}"
            )
    return lines


def _agreement(flag: bool | None, mismatch: dict | None) -> str:
    if flag is None:
        return "not checked (sampling or skipped)"
    if flag:
        return "true"
    return (
        f"FALSE: first mismatch at prompt {mismatch['prompt_index']} turn {mismatch['turn']} "
        f"position {mismatch['position']}: expected {mismatch['expected']}, got {mismatch['got']}"
    )
