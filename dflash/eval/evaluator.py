"""Evaluate drafting methods on a set of prompts: acceptance, speed, losslessness.

Per generation (every user turn of every conversation), with the same prompt, seed, stop
ids and sampling settings, interleaved so that machine noise hits all methods alike:
  1. autoregressive: `generate(block_size=1)`, the in-run baseline (same loop, no drafts);
  2. every method of `EvalSettings.methods` in order (registry: `dflash.methods`),
     e.g. dflash: `generate(block_size=B, proposer=DFlashProposer(...))`, ngram: prompt
     lookup; the first listed is the primary method;
  3. hf_generate: the target's own `model.generate()`, the baseline a user would
     otherwise run (skippable), under the loop's attention kernels
     (`dflash.target.cache.decode_attention`), so both sides run the same kernels.
A short warm-up on the first prompt runs every method once, untimed. Multi-turn
conversations continue from the primary method's answer, as the public harness does
(from DFlash's). In greedy runs, every output that parts from the autoregressive one is
diagnosed after the timed runs (a near-tie within the dtype's rounding, or a bug:
`dflash.eval.divergence`), replayed from each run's record of its target forwards
(chain and tree alike).

No Hydra here: entry points build `EvalSettings` and call `evaluate`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from dflash.decoding import GenerationResult, SamplingConfig, generate
from dflash.decoding.loop import synchronize
from dflash.drafter import DFlashDrafter
from dflash.eval.benchmarks import Sample
from dflash.eval.divergence import diagnose, first_difference, hf_generate_logits, replay_logits
from dflash.eval.prompts import PromptBuilder, stop_token_ids
from dflash.eval.results import BASELINE, GenerationRecord, MethodInfo, build_results, token_at
from dflash.eval.settings import EvalSettings
from dflash.layout import Results
from dflash.methods import METHODS, EvalContext, MethodSetup, build_method
from dflash.progress import bar_interval
from dflash.target import TargetModel
from dflash.target.cache import decode_attention


def evaluate(
    target: TargetModel,
    drafter: DFlashDrafter | None,
    samples: list[Sample],
    settings: EvalSettings,
    *,
    benchmark: str = "custom",
    target_label: str | None = None,
    drafter_label: str = "unspecified",
    config: dict | None = None,
    progress: bool = True,
    benchmark_source: dict | None = None,
) -> Results:
    """Run the baselines and every method on every turn of `samples`; return results.json.

    Args:
        target: the frozen target, with its tokenizer.
        drafter: the DFlash drafter, fitting `target` (see `dflash.specs.check_drafter_fits`);
            None when `settings.methods` has no dflash.
        samples: conversations (one or more user turns each), e.g. from `load_benchmark`.
        target_label / drafter_label: recorded as `target` / the dflash method's label (e.g.
            paths; "random" for an untrained drafter); target_label defaults to the model's name.
        config: the resolved run config, stored verbatim under `config`.
        benchmark_source: where the prompts came from (`dflash.eval.benchmarks.benchmark_source`),
            stored under `benchmark_source`.
    Returns:
        results.json (schema: `dflash.eval.results`); `Results.write` writes it.
    """
    if not samples:
        raise ValueError("no prompts to evaluate")  # load_benchmark never returns none
    decoding = settings.decoding
    context = EvalContext(drafter, drafter_label, decoding.block_size, decoding.draft_threshold, decoding.temperature)
    setups = {name: build_method(name, target, _own_settings(name, settings), context) for name in settings.methods}
    stops = stop_token_ids(target.tokenizer, getattr(target.model, "generation_config", None), decoding.stop_tokens)
    methods = _Methods(target, setups, decoding.sampling, stops, settings.hf_generate)
    prompts = PromptBuilder(target.tokenizer, settings.chat_template, settings.enable_thinking)
    primary = settings.methods[0]

    if settings.warmup_tokens > 0:
        warmup_ids = prompts.encode(samples[0].turns[:1])
        warmup = GenerationRecord(prompt_index=samples[0].index, turn=0, num_prompt_tokens=warmup_ids.shape[1])
        methods.run(warmup_ids, min(settings.warmup_tokens, decoding.max_new_tokens), decoding.seed, warmup)

    records = []
    for sample in tqdm(samples, desc=f"evaluate {benchmark}", unit="prompt", disable=not progress, mininterval=bar_interval()):
        conversation: list[str] = []
        for turn, user_text in enumerate(sample.turns):
            conversation.append(user_text)
            input_ids = prompts.encode(conversation)
            record = GenerationRecord(
                prompt_index=sample.index, turn=turn, num_prompt_tokens=input_ids.shape[1], family=sample.family
            )
            methods.run(input_ids, decoding.max_new_tokens, decoding.seed + 1009 * sample.index + turn, record)
            records.append(record)
            conversation.append(target.tokenizer.decode(record.outputs[primary], skip_special_tokens=True))

    infos = {
        name: MethodInfo(
            setup.label, setup.block_size, setup.trained_block_size, METHODS[name].recorded(_own_settings(name, settings), context)
        )
        for name, setup in setups.items()
    }
    return build_results(
        records,
        benchmark=benchmark,
        target=target_label or getattr(target.model, "name_or_path", "") or type(target.model).__name__,
        sampling=decoding.sampling,
        max_new_tokens=decoding.max_new_tokens,
        stop_token_ids=stops,
        device=target.device,
        config=config,
        target_dtype=target.dtype,
        kernel_path=target.kernel_path,
        methods=infos,
        benchmark_source=benchmark_source,
    )


def run_method(
    target: TargetModel,
    input_ids: torch.Tensor,
    setup: MethodSetup | None,
    max_new_tokens: int,
    stop_ids: list[int],
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """One generation from `input_ids` (1, P) by `setup`'s method (its proposer and verifier at
    its verify width), or by the autoregressive baseline when `setup` is None."""
    common = dict(max_new_tokens=max_new_tokens, stop_token_ids=stop_ids, sampling=sampling, generator=generator)
    if setup is None:
        return generate(target, input_ids, **common)
    return generate(target, input_ids, block_size=setup.block_size, proposer=setup.proposer, verifier=setup.verifier, **common)


def _own_settings(name: str, settings: EvalSettings):
    found = settings.method_settings.get(name)
    return found if found is not None else METHODS[name].default_settings()


@dataclass
class _Methods:
    """The methods compared, run on one prompt with identical settings."""

    target: TargetModel
    setups: dict[str, MethodSetup]
    sampling: SamplingConfig
    stop_ids: list[int]
    hf_generate: bool

    def run(self, input_ids: torch.Tensor, max_new_tokens: int, seed: int, record: GenerationRecord) -> None:
        """Generate from `input_ids` (1, P) with every method; fill `record`'s outputs, times and acceptance."""
        results = {BASELINE: self._generate(input_ids, max_new_tokens, seed, None)}
        for name, setup in self.setups.items():
            results[name] = self._generate(input_ids, max_new_tokens, seed, setup)
        for method, result in results.items():
            record.outputs[method] = result.output_ids
            record.times_s[method] = result.total_time_s
            record.prefill_times_s[method] = result.prefill_time_s
            record.decode_times_s[method] = result.decode_time_s
            if method != BASELINE:
                record.acceptance[method] = result.acceptance_lengths
        record.acceptance_lengths = results[next(iter(self.setups))].acceptance_lengths
        if self.hf_generate:
            tokens, seconds = self._hf_generate(input_ids, max_new_tokens, seed)
            record.outputs["hf_generate"], record.times_s["hf_generate"] = tokens, seconds
        if self.sampling.greedy:
            self._diagnose(input_ids, results, record)

    def _diagnose(self, input_ids, results: dict[str, GenerationResult], record: GenerationRecord) -> None:
        """Diagnose where each method's and HF generate's outputs part from the baseline's (greedy, untimed)."""

        def replay(run: GenerationResult):
            return lambda position: replay_logits(self.target, input_ids, run.steps, position)

        baseline = results[BASELINE]
        baseline_logits = replay(baseline)
        candidates = {name: replay(results[name]) for name in self.setups}
        if "hf_generate" in record.outputs:
            candidates["hf_generate"] = lambda position: hf_generate_logits(self.target, input_ids, position, self._hf_options())
        for method, candidate_logits in candidates.items():
            output = record.outputs[method]
            position = first_difference(baseline.output_ids, output)
            if position is None:
                continue
            expected, got = token_at(baseline.output_ids, position), token_at(output, position)
            replayed = expected is not None and got is not None  # else one output ended: nothing to compare
            record.divergences[method] = diagnose(
                position, expected, got,
                baseline_logits(position) if replayed else None,
                candidate_logits(position) if replayed else None,
                self.target.dtype,
            )  # fmt: skip

    def _generate(self, input_ids, max_new_tokens, seed, setup: MethodSetup | None) -> GenerationResult:
        """One generation by `setup`'s method (None: the autoregressive baseline), with this run's settings."""
        generator = None if self.sampling.greedy else torch.Generator(self.target.device).manual_seed(seed)
        return run_method(self.target, input_ids, setup, max_new_tokens, self.stop_ids, self.sampling, generator)

    def _hf_options(self) -> dict:
        """Stop, pad and sampling arguments of HF `generate()`, matching our methods' settings."""
        pad_id = self.target.tokenizer.pad_token_id
        sampling = self.sampling
        options = dict(
            eos_token_id=self.stop_ids or None,
            pad_token_id=pad_id if pad_id is not None or not self.stop_ids else self.stop_ids[0],
        )
        if sampling.greedy:
            return options | dict(do_sample=False)
        return options | dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)

    @torch.inference_mode()
    def _hf_generate(self, input_ids: torch.Tensor, max_new_tokens: int, seed: int) -> tuple[list[int], float]:
        """HF `generate` with the same length, stop ids and sampling; (new ids, seconds)."""
        model, device = self.target.model, self.target.device
        input_ids = input_ids.to(device)
        if not self.sampling.greedy:
            torch.manual_seed(seed)  # HF generate takes no generator: seed the global RNG instead
        synchronize(device)
        start = time.perf_counter()
        with decode_attention():  # the loop's kernels: a fair baseline (dflash.target.cache)
            output = model.generate(
                input_ids,
                # explicit: HF would otherwise mask prompt positions that hold the pad id
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                **self._hf_options(),
            )
        synchronize(device)
        return output[0, input_ids.shape[1] :].tolist(), time.perf_counter() - start
