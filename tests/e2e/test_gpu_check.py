"""scripts/gpu_check.py (`make gpu-check`): its CPU smoke run writes every section with
PASS verdicts, and its verdicts turn to FAIL when a comparison is broken."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO

ROOT = str(REPO)
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.py")


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


gpu_check = _load_script()


@pytest.mark.slow
def test_cpu_run_writes_every_section_with_pass_verdicts(tmp_path):
    out = tmp_path / "report.md"
    env = dict(os.environ, PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, SCRIPT, "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = out.read_text()
    for family in ("qwen3-8b", "llama-3.1-8b"):
        assert f"### a. training step, {family}" in report
        assert f"### b. decode-loop efficiency, {family}" in report
    assert "### c. greedy losslessness vs HF generate()" in report and "### d. kernels" in report
    assert "### e. CUDA graphs: step time against kernel time" in report
    assert report.count("factored vs dense: PASS") == 2 and report.count("flex vs dense: PASS") == 2
    for arch in ("qwen3", "llama"):
        for dtype in ("float32", "bfloat16"):
            assert f"- {arch} {dtype}: PASS" in report
    assert "flash-attn: not installed" in report or "flash-attn: installed" in report
    assert "FAIL" not in report  # neither a FAIL verdict nor a FAILED section
    # Section b: one row per block size, with a measured speedup and a bound.
    decoding, graphs = report.split("### e. CUDA graphs")
    rows = [line for line in decoding.splitlines() if line.startswith(("| 4 |", "| 8 |", "| 16 |"))]
    assert len(rows) == 6 and all(line.count("x |") == 2 for line in rows)
    # Section e: each target's forwards at every width on three paths, and the graph step's
    # greedy output (run uncaptured without CUDA) equal to the fast forward's
    for family in ("qwen3-8b", "smollm2-135m"):
        assert f"**{family}**" in graphs
    widths = [line.split("|")[1].strip() for line in graphs.splitlines() if line.startswith("| ") and "---" not in line]
    assert widths == ["B", "1", "2", "3", "4", "8", "16"] * 2
    assert graphs.count("Same output: B = 1: identical, B = 16: identical.") == 2
    assert "[gpu-check" in done.stdout  # progress lines


def test_training_comparison_fails_outside_tolerance():
    tolerance = gpu_check.TOLERANCE[torch.bfloat16]
    hidden = torch.randn(1, 32, 8, generator=torch.Generator().manual_seed(0))

    def step(loss=10.0, fc=1.0, hidden_scale=1.0):
        return {"loss": loss, "grads": {"fc": fc, "all": 2.0}, "hidden": hidden * hidden_scale}

    reference = step()
    assert gpu_check.compare_training(reference, step(loss=10.1, fc=1.02, hidden_scale=1.01), tolerance)[0]
    assert not gpu_check.compare_training(reference, step(loss=10.5), tolerance)[0]
    assert not gpu_check.compare_training(reference, step(fc=1.2), tolerance)[0]
    assert not gpu_check.compare_training(reference, step(hidden_scale=1.05), tolerance)[0]
    assert not gpu_check.compare_training(reference, step(loss=float("nan")), tolerance)[0]
    forward_only = step() | {"grads": {}}
    ok, text = gpu_check.compare_training(reference, forward_only, tolerance)
    assert ok and "forward only" in text


def test_lossless_verdict_allows_near_ties_only_below_float32():
    assert gpu_check.lossless_verdict(torch.float32, [])
    assert not gpu_check.lossless_verdict(torch.float32, ["numerical"])
    assert gpu_check.lossless_verdict(torch.bfloat16, ["numerical", "numerical"])
    assert not gpu_check.lossless_verdict(torch.bfloat16, ["numerical", "bug"])


@pytest.mark.slow
def test_lossless_section_says_fail_when_verification_keeps_wrong_drafts(monkeypatch):
    import dflash.decoding.chain as chain

    def accept_everything(target_logits, drafts, sampling, generator):
        accepted = drafts.tokens.numel()
        return accepted, int(target_logits[accepted].argmax())

    sizes = gpu_check.sizes_for(torch.device("cpu"), quick=True, layers=None)
    monkeypatch.setattr(chain, "verify", accept_everything)
    monkeypatch.setattr(gpu_check, "BLOCK_SIZES", (4,))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes: extra threads only contend on shared CI cores
    try:
        lines = gpu_check.section_lossless(sizes, torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    verdicts = [line for line in lines if line.startswith("- ")]
    assert len(verdicts) == 4 and all(": FAIL:" in line and "bug" in line for line in verdicts), verdicts


@pytest.mark.parametrize("p, expected_tau", [(1.0, 4.0), (0.0, 1.0)])
def test_controlled_double_sets_acceptance(p, expected_tau):
    from dflash.decoding import generate
    from dflash.target import TargetModel
    from dflash.toy.tiny import build_tiny_target

    model, tokenizer = build_tiny_target("qwen3")
    target = TargetModel(model, tokenizer)
    prompt = torch.tensor([[5, 6, 7, 8]])
    reference = generate(target, prompt, max_new_tokens=13).output_ids
    double = gpu_check.ControlledAcceptanceProposer(target, reference, 4, 13, p)
    result = generate(target, prompt, max_new_tokens=13, block_size=4, proposer=double)
    assert result.output_ids == reference
    assert result.tau == expected_tau and double.resyncs == 0
