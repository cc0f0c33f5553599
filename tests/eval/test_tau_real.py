"""The probe of `eval.tau_real` (dflash/eval/tau_real.py): the target's greedy outputs are
computed once and kept, every output is checked against them, tau is the evaluator's."""

from __future__ import annotations

import torch

from dflash.drafter import save_drafter
from dflash.eval import DecodingSettings, EvalSettings, Sample, evaluate
from dflash.eval.tau_real import TauRealProbe
from dflash.methods import METHODS
from dflash.specs import DrafterSpec, build_drafter
from dflash.training.tau_real import TauRealSettings

TEXTS = ["def add(a, b):", "hello there", "x = [1, 2, 3]"]


def test_baseline_once_lossless_check_and_the_evaluators_tau(qwen3_target, tmp_path):
    target = qwen3_target
    save_drafter(build_drafter(DrafterSpec(num_layers=1, block_size=4, seed=0), target), str(tmp_path / "drafter"))
    prompts = [torch.tensor([target.tokenizer(text)["input_ids"]]) for text in TEXTS]
    probe = TauRealProbe(TauRealSettings(every_n_validations=1, max_new_tokens=12), METHODS["dflash"], None)

    first = probe.measure(target, str(tmp_path / "drafter"), prompts)
    assert first["lossless"] and first["first_mismatch"] is None and first["baseline_seconds"] > 0
    again = probe.measure(target, str(tmp_path / "drafter"), prompts)
    assert again["baseline_seconds"] == 0.0 and again["tau"] == first["tau"] and again["num_tokens"] == first["num_tokens"]

    settings = EvalSettings(decoding=DecodingSettings(max_new_tokens=12), hf_generate=False, warmup_tokens=0)
    drafter = build_drafter(DrafterSpec(path=str(tmp_path / "drafter")), target)
    results = evaluate(target, drafter, [Sample(turns=[t], index=i) for i, t in enumerate(TEXTS)], settings, progress=False)
    assert results.tau == first["tau"] and results.lossless

    # A kept greedy output that the loop does not reproduce is reported, with where.
    key = next(k for k in probe._baseline if list(k[0]) == prompts[1][0].tolist())
    kept = probe._baseline[key]
    probe._baseline[key] = [*kept[:3], (kept[3] + 1) % 256, *kept[4:]]
    broken = probe.measure(target, str(tmp_path / "drafter"), prompts)
    assert not broken["lossless"]
    assert {k: broken["first_mismatch"][k] for k in ("prompt_index", "position", "got")} == {
        "prompt_index": 1,
        "position": 3,
        "got": kept[3],
    }
