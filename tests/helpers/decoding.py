"""Decoding doubles: proposers that draft with the target itself (all accepted, one wrong
slot per block, the right token ranked second), a random DFlash drafter and DSpark drafter,
a proposer that records its drafts, verifiers with
known bugs, the target's own greedy output through HF `generate()`, and prompts."""

from __future__ import annotations

from dataclasses import replace

import torch

import dflash.decoding.tree
from dflash.decoding import generate
from dflash.decoding.sampling import probabilities, sample
from dflash.decoding.token_tree import TokenTree
from dflash.decoding.verify import propose_tokens
from dflash.decoding.verify import verify as exact_verify
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter, DrafterConfig, resolve_mask_token_id
from dflash.errors import require
from dflash.target import TargetModel

PROMPTS = ["def add(a, b):\n    return", "import os\n", "x", "class Stack:\n    def push(self, item):\n"]
LONG_PROMPT = PROMPTS[3]  # 35 tokens: several blocks long


def hf_greedy(target: TargetModel, input_ids: torch.Tensor, max_new_tokens: int, eos=None) -> list[int]:
    """The target's own greedy continuation via HF `generate()` (new tokens only)."""
    out = target.model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=target.tokenizer.pad_token_id,
    )
    return out[0, input_ids.shape[1] :].tolist()


class OracleProposer:
    """Test double: drafts with the target itself.

    greedy_oracle=True returns one-hot logits of the target's own greedy continuation
    (so greedy decoding accepts every draft). Otherwise it returns the target's logits
    for each slot (conditioned on the greedy continuation before it) divided by
    `sharpen`, a distribution close to but different from the target's, for sampling
    tests where both acceptances and rejections must happen.
    """

    target_layer_ids = None

    def __init__(self, target: TargetModel, greedy_oracle: bool = True, sharpen: float = 1.0):
        self.target = target
        self.greedy_oracle = greedy_oracle
        self.sharpen = sharpen
        self.calls = 0
        # Next-token logits per prefix: consecutive steps share most of their greedy
        # lookahead, and sampling tests revisit the same few prefixes thousands of times.
        self._next_logits: dict[tuple[int, ...], torch.Tensor] = {}

    def reset(self):
        pass

    @torch.no_grad()
    def next_token_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(vocab,) float target logits after the (1, L) ids, one full forward per new prefix."""
        key = tuple(ids[0].tolist())
        if key not in self._next_logits:
            self._next_logits[key] = self.target.model(ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()
        return self._next_logits[key]

    def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator):
        return propose_tokens(self.propose(committed_ids, new_features, block_size, num_drafts), sampling, generator)

    def propose(self, committed_ids, new_features, block_size, num_drafts):
        self.calls += 1
        ids = committed_ids
        rows = []
        for _ in range(num_drafts):
            logits = self.next_token_logits(ids)
            rows.append(logits)
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
        logits = torch.stack(rows)  # a fresh tensor: callers may edit it without touching the memo
        if self.greedy_oracle:
            one_hot = torch.full_like(logits, -1e4)
            return one_hot.scatter(1, logits.argmax(-1, keepdim=True), 0.0)
        return logits / self.sharpen


class PartialOracleProposer(OracleProposer):
    """Test double: the target's greedy continuation with one wrong token per block.

    At every step it draws the slot to corrupt uniformly from 0..num_drafts (from its
    own seeded generator); slot == num_drafts corrupts nothing. The corrupted slot
    gets a token different from the target's argmax, so greedy verification accepts
    exactly `slot` drafts: over a request every accept length 0..B-1 occurs.
    `planned_accepts` records the accept length each step should produce, for tests to
    compare with what the engine reports.

    `wrong_slots`, when given, replaces the random draws by a schedule cycled through
    step by step (restarting with each request; a slot above num_drafts corrupts
    nothing): a permutation of 0..B-1 makes every accept length occur within B steps,
    where random draws need about B * ln(B) steps, hundreds of tokens at B = 16.
    """

    def __init__(self, target: TargetModel, seed: int = 0, wrong_slots: list[int] | None = None):
        super().__init__(target, greedy_oracle=True)
        self.generator = torch.Generator().manual_seed(seed)
        self.wrong_slots = wrong_slots
        self.planned_accepts: list[int] = []

    def reset(self):
        self.planned_accepts = []

    def _wrong_slot(self, num_drafts: int) -> int:
        if self.wrong_slots is None:
            return int(torch.randint(0, num_drafts + 1, (1,), generator=self.generator))
        return min(self.wrong_slots[len(self.planned_accepts) % len(self.wrong_slots)], num_drafts)

    def propose(self, committed_ids, new_features, block_size, num_drafts):
        logits = super().propose(committed_ids, new_features, block_size, num_drafts)
        wrong_slot = self._wrong_slot(num_drafts)
        self.planned_accepts.append(wrong_slot)
        if wrong_slot < num_drafts:
            right = int(logits[wrong_slot].argmax())
            wrong = (right + 1) % logits.shape[-1]
            logits[wrong_slot] = -1e4
            logits[wrong_slot, wrong] = 0.0
        return logits


class RunnerUpOracle(PartialOracleProposer):
    """The greedy continuation; at the planned wrong slot the target's token is ranked
    second (logit -1) behind a wrong one (logit 0), and every other token is far below.

    With `check_features`, the proposer asks for target features of layers 0 and 2 and
    checks at each step that the features it has received over the request equal the
    target's own features of every position before the anchor, in order.
    """

    def __init__(self, target: TargetModel, seed: int = 0, check_features: bool = False):
        super().__init__(target, seed=seed)
        self.check_features = check_features
        self.target_layer_ids = [0, 2] if check_features else None
        self.received: torch.Tensor | None = None

    def reset(self):
        super().reset()
        self.received = None

    def propose(self, committed_ids, new_features, block_size, num_drafts):
        if self.check_features:
            self.received = new_features if self.received is None else torch.cat([self.received, new_features], dim=1)
            context = committed_ids[:, :-1]
            positions = torch.arange(context.shape[1]).unsqueeze(0)
            expected = self.target.forward(context, positions, None, self.target_layer_ids).features
            torch.testing.assert_close(self.received, expected, atol=1e-4, rtol=1e-4)
        logits = super().propose(committed_ids, new_features, block_size, num_drafts)
        slot = self.planned_accepts[-1]
        if slot < num_drafts:
            wrong = int(logits[slot].argmax())
            right = (wrong - 1) % logits.shape[-1]  # the parent class put wrong = right + 1
            logits[slot, right] = -1.0
        return logits


def record_paths(monkeypatch) -> list[tuple[TokenTree, list[int]]]:
    """Record every verify step's tree and accepted path."""
    steps = []
    walk = dflash.decoding.tree.accepted_path

    def recording_walk(tree, target_logits, sampling, generator):
        path, token = walk(tree, target_logits, sampling, generator)
        steps.append((tree, path))
        return path, token

    monkeypatch.setattr(dflash.decoding.tree, "accepted_path", recording_walk)
    return steps


def random_drafter(target, num_layers=2, block_size=16, seed=0, use_target_features=True, uneven_norms=False):
    """A random (seeded) DFlash drafter for `target`; with `uneven_norms` its norms' weights are
    drawn from [0.5, 1.5], so that a norm read from the wrong place shows."""
    torch.manual_seed(seed)
    mask_id = resolve_mask_token_id(target.tokenizer, target.embedding_rows)
    config = DrafterConfig.from_target(target.config, num_layers=num_layers, block_size=block_size, mask_token_id=mask_id)
    config.use_target_features = use_target_features
    drafter = DFlashDrafter(config).eval()
    if uneven_norms:
        with torch.no_grad():
            for name, parameter in drafter.named_parameters():
                if name.endswith("norm.weight"):
                    parameter.uniform_(0.5, 1.5)
    return drafter


def dspark_drafter(target, rank=8, confidence=True, block_size=16, seed=0, markov_scale=0.0, confidence_scale=0.0):
    """`random_drafter`'s layers with DSpark heads of `rank`: the Markov head's w2 drawn with std
    `markov_scale` (0: a new head's zeros) and the confidence head's weights with std
    `confidence_scale` (0: a new head's)."""
    backbone = random_drafter(target, block_size=block_size, seed=seed)
    drafter = DFlashDrafter(replace(backbone.config, markov_rank=rank, confidence_head=confidence)).eval()
    missing, unexpected = drafter.load_state_dict(backbone.state_dict(), strict=False)
    assert not unexpected and all(name.split(".")[0] in ("markov_head", "confidence_head") for name in missing)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        if markov_scale:
            drafter.markov_head.markov_w2.weight.normal_(0, markov_scale, generator=generator)
        if confidence and confidence_scale:
            drafter.confidence_head.proj.weight.normal_(0, confidence_scale, generator=generator)
    return drafter


def dflash2_drafter(target, block_size=8, seed=0, scale=0.0, top_k=4):
    """`random_drafter`'s layers as a DFlash2 drafter (kernel 2, group 16, rank 8, `top_k`): the
    convolutions and the successor codebook perturbed with std `scale` and the predecessor codebook
    and hidden projection redrawn at std 1 (0: a new drafter's identity convolutions and zero
    successor codebook, which score each candidate by its unary logit)."""
    backbone = random_drafter(target, block_size=block_size, seed=seed)
    config = replace(backbone.config, conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=top_k)
    drafter = DFlashDrafter(config).eval()
    missing, unexpected = drafter.load_state_dict(backbone.state_dict(), strict=False)
    assert not unexpected and all("conv" in name or "candidate_selector" in name for name in missing)
    if scale:
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, parameter in drafter.named_parameters():
                if "conv" in name or "successor" in name:
                    parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
                if "predecessor" in name or "hidden_projection" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return drafter


class RecordingProposer:
    """A proposer that keeps the tokens of every draft it returns (`drafts`)."""

    def __init__(self, proposer):
        self.proposer = proposer
        self.target_layer_ids = proposer.target_layer_ids
        self.drafts: list[list[int]] = []

    def reset(self):
        self.proposer.reset()

    def draft(self, *args):
        drafts = self.proposer.draft(*args)
        self.drafts.append(drafts.tokens.tolist())
        return drafts


def random_proposer(target, num_layers=2, block_size=16, seed=0):
    """A DFlash proposer for `target` with a random (seeded) drafter: almost never accepted."""
    return DFlashProposer(random_drafter(target, num_layers, block_size, seed), target.embed, target.logits)


def assert_same_greedy_output(first, second, prompts, block_size, max_new_tokens=30):
    """Both targets decode every prompt to the same tokens (a random drafter proposes; the
    verify decides)."""
    for prompt in prompts:
        ids = first.tokenizer(prompt, return_tensors="pt").input_ids
        outputs = [
            generate(t, ids, max_new_tokens=max_new_tokens, block_size=block_size, proposer=random_proposer(t)).output_ids
            for t in (first, second)
        ]
        assert outputs[0] == outputs[1], prompt


def lossy_verify(target_logits, drafts, sampling, generator):
    """Greedy verification that keeps the first rejected draft, then the target's next token."""
    accepted, next_token = exact_verify(target_logits, drafts, sampling, generator)
    if accepted < drafts.tokens.numel():
        accepted += 1
        next_token = int(target_logits[accepted].argmax())
    return accepted, next_token


VERIFY_FLAWS = (
    "first_rejection_is_last",
    "residual_from_next_row",
    "residual_is_target_row",
    "one_uniform_for_all_drafts",
    "temperature_multiplied",
    "match_counts_all_matches",
)


def flawed_verify(flaw: str):
    """Test double: the library's `verify` for sampling with one known bug, as a negative
    control that the statistical lossless checks must reject. Flaws:
      first_rejection_is_last: stops at the last rejected draft (`i = rejected[-1]`);
      residual_from_next_row: the residual uses target row i + 1 instead of row i;
      residual_is_target_row: resamples from p_i instead of norm(max(0, p_i - q_i));
      one_uniform_for_all_drafts: one uniform shared by every draft of the block;
      temperature_multiplied: target logits multiplied by T instead of divided;
      match_counts_all_matches: the "match" rule keeps every matching draft, not the
        leading run.
    """
    require(flaw in VERIFY_FLAWS, "flaw", f"unknown flaw {flaw!r}")

    def verify_with_flaw(target_logits, drafts, sampling, generator):
        temperature = 1 / sampling.temperature if flaw == "temperature_multiplied" else sampling.temperature
        target_probs = probabilities(target_logits, replace(sampling, temperature=temperature))
        k = drafts.tokens.numel()
        if k == 0:
            return 0, int(sample(target_probs[0], generator))
        if sampling.verify_rule == "match":
            agree = (drafts.tokens == sample(target_probs, generator)[:k]).int()
            accepted = int(agree.sum() if flaw == "match_counts_all_matches" else agree.cumprod(0).sum())
            return accepted, int(sample(target_probs[accepted], generator))
        rows = torch.arange(k)
        # a deterministic draft (probs None) is one-hot at its token
        draft_probs = (
            drafts.probs
            if drafts.probs is not None
            else torch.nn.functional.one_hot(drafts.tokens, target_probs.shape[-1]).to(target_probs.dtype)
        )
        p, q = target_probs[rows, drafts.tokens], draft_probs[rows, drafts.tokens]
        u = torch.rand(1 if flaw == "one_uniform_for_all_drafts" else k, generator=generator).expand(k)
        rejected = (u * q > p).nonzero().flatten()
        if rejected.numel() == 0:
            return k, int(sample(target_probs[k], generator))
        i = int(rejected[-1] if flaw == "first_rejection_is_last" else rejected[0])
        if flaw == "residual_is_target_row":
            return i, int(sample(target_probs[i], generator))
        target_row = target_probs[i + 1] if flaw == "residual_from_next_row" else target_probs[i]
        residual = (target_row - draft_probs[i]).clamp_min(0)
        residual = residual / residual.sum() if residual.sum() > 0 else target_row
        return i, int(sample(residual, generator))

    return verify_with_flaw


def record_cudnn_flag(monkeypatch, owner, name: str) -> list[bool]:
    """Wrap `owner.name` (a method) so that each call records whether cuDNN's SDPA kernel was
    allowed at that moment (`dflash.target.cache.decode_attention` turns it off); the records."""
    seen: list[bool] = []
    method = getattr(owner, name)

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return method(*args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return seen
