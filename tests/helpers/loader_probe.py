"""Load drafter directories the way other programs do, and record what they compute.

Imports only torch and transformers (never dflash), so it runs under another
environment as well as in-process:

    python tests/helpers/loader_probe.py REQUEST.json OUT.pt     # e.g. with transformers 4.57

REQUEST.json: {"drafters": {name: {"dir": DIR, "inputs": INPUTS.pt}}, and optionally
"target": DIR, "spec_generate": [names], "prompt": [ids], "new_tokens": N}. INPUTS.pt holds `position_ids` (1, c + q),
`noise_embedding` (1, q, D), `target_hidden` (1, c, taps * D) and `rope_positions`, a
list of (1, n) position tensors; a drafter without "inputs" is only loaded (and decodes
if named in "spec_generate").
"""

from __future__ import annotations

import json
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding


def probe(request: dict) -> dict:
    """Per drafter: the class AutoModel built, its block hidden states, and cos/sin of the
    rotary embedding the installed transformers builds from config.json. With a target:
    the `spec_generate` output of the drafters named, the acceptance length (accepted
    drafts + 1) of each of its verify steps, and the target's greedy continuation."""
    results = {"transformers": transformers.__version__}
    for name, item in request["drafters"].items():
        model = AutoModel.from_pretrained(item["dir"], trust_remote_code=True, dtype=torch.float32).eval()
        results[name] = {"class": type(model).__name__, "block_size": model.block_size}
        if "inputs" in item:
            inputs = torch.load(item["inputs"])
            rotary = LlamaRotaryEmbedding(AutoConfig.from_pretrained(item["dir"]))
            x = torch.zeros(1, dtype=torch.float32)
            with torch.no_grad():
                hidden = model(
                    position_ids=inputs["position_ids"],
                    noise_embedding=inputs["noise_embedding"],
                    target_hidden=inputs["target_hidden"],
                )
            results[name].update(rope=[rotary(x, positions) for positions in inputs["rope_positions"]], hidden=hidden)
        if name in request.get("spec_generate", []):
            output, acceptance = _spec_generate(model, request)
            results[name].update(spec_generate=output, acceptance_lengths=acceptance)
    if "target" in request:
        results["greedy"] = _greedy(request)
    return results


def _spec_generate(model, request: dict) -> tuple[list[int], list[int]]:
    """(prompt + output ids, acceptance length of each verify step). A verify step is a
    target call with `position_ids` (the prefill has none): its block is the anchor and
    the drafts, which count as accepted while they equal the output at their positions."""
    target = AutoModelForCausalLM.from_pretrained(request["target"], dtype=torch.float32).eval()
    prompt = torch.tensor([request["prompt"]])
    blocks = []

    def record(module, args, kwargs):
        if kwargs.get("position_ids") is not None:
            blocks.append((int(kwargs["position_ids"][0, 0]), args[0][0].tolist()))

    hook = target.register_forward_pre_hook(record, with_kwargs=True)
    output = model.spec_generate(target, prompt, max_new_tokens=request["new_tokens"], temperature=0.0)[0].tolist()
    hook.remove()
    acceptance = []
    for anchor, block in blocks:
        accepted = 0
        while accepted + 1 < len(block) and anchor + accepted + 1 < len(output):
            if block[accepted + 1] != output[anchor + accepted + 1]:
                break
            accepted += 1
        acceptance.append(accepted + 1)
    return output, acceptance


@torch.no_grad()
def _greedy(request: dict) -> list[int]:
    """The target's greedy continuation, one full forward per token (no cache)."""
    target = AutoModelForCausalLM.from_pretrained(request["target"], dtype=torch.float32).eval()
    ids = torch.tensor([request["prompt"]])
    for _ in range(request["new_tokens"]):
        ids = torch.cat([ids, target(ids).logits[:, -1:].argmax(-1)], dim=1)
    return ids[0].tolist()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        torch.save(probe(json.load(f)), sys.argv[2])
