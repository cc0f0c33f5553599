"""DSpark's proposer (dflash/dspark/proposer.py): a bridge to DFlash, lossless greedy decoding
with its cut, drafts drawn from the distributions it records (docs/design.md invariant 12,
docs/frontier.md 5.5) with the two seeded bugs that break it, and sampled outputs with the
target's distribution end to end (tests/decoding/test_sampling.py's chi-square), which a cut
decided after the draw breaks."""

from __future__ import annotations

import pytest
import torch

from dflash.decoding import SamplingConfig, generate
from dflash.decoding.sampling import probabilities, sample
from dflash.decoding.verify import Drafts
from dflash.dflash.proposer import DFlashProposer
from dflash.dspark.proposer import DSparkProposer
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from dflash.training.forward import target_features
from helpers.decoding import PROMPTS, RecordingProposer, dspark_drafter, hf_greedy, random_drafter
from helpers.stats import chi_square_p_value, sampled_p_value

# The lossless matrix (tests/target/test_architectures.py DECODING_ARCHS + MORE_ARCHS), beside the
# conftest's qwen3 and llama; gemma2, granite and cohere transform the head's logits before the bias.
MORE_ARCHS = [
    "mistral",
    "gemma2",
    "gemma3",
    "qwen2",
    "qwen3_moe",
    "gpt2",
    "phi3",
    "olmo2",
    "stablelm",
    "gpt_neox",
    "falcon",
    "granite",
    "cohere",
]
THRESHOLD = 0.5


def random_heads(target: TargetModel, block_size: int = 8, seed: int = 0):
    """Random non-zero heads whose confidence sits around THRESHOLD, decided mostly by the previous
    token (the hidden states of a random drafter's slots are much alike): about half the slots are cut."""
    drafter = dspark_drafter(target, rank=8, block_size=block_size, seed=seed, markov_scale=1.0, confidence_scale=8**-0.5)
    with torch.no_grad():
        drafter.confidence_head.proj.weight[:, : target.hidden_size] *= 0.01
    return drafter


def test_zero_heads_draft_what_the_dflash_drafter_drafts(tiny_target):
    """The bridge: a new Markov head adds nothing, so the drafts are the DFlash drafter's, token for token."""
    dflash = RecordingProposer(DFlashProposer(random_drafter(tiny_target, block_size=8), tiny_target.embed, tiny_target.logits))
    drafter = dspark_drafter(tiny_target, block_size=8)
    dspark = RecordingProposer(DSparkProposer(drafter, tiny_target.embed, tiny_target.logits))
    for prompt in PROMPTS[:2]:
        ids = tiny_target.tokenizer(prompt, return_tensors="pt").input_ids
        outputs = [generate(tiny_target, ids, max_new_tokens=20, block_size=8, proposer=p).output_ids for p in (dflash, dspark)]
        assert outputs[0] == outputs[1]
    assert dspark.drafts == dflash.drafts and len(dflash.drafts[0]) == 7


def test_the_markov_head_changes_the_drafts(tiny_target):
    """The bridge's converse: non-zero heads draft something else (the bridge compares something)."""
    ids = tiny_target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    recorded = []
    for drafter in (dspark_drafter(tiny_target, block_size=8), random_heads(tiny_target)):
        proposer = RecordingProposer(DSparkProposer(drafter, tiny_target.embed, tiny_target.logits))
        generate(tiny_target, ids, max_new_tokens=10, block_size=8, proposer=proposer)
        recorded.append(proposer.drafts)
    assert recorded[0] != recorded[1]


def assert_greedy_lossless(target: TargetModel) -> list[list[int]]:
    """Float32 greedy output equals the target's own with random heads and the cut on; returns the drafts."""
    proposer = RecordingProposer(DSparkProposer(random_heads(target), target.embed, target.logits, confidence_threshold=THRESHOLD))
    for prompt, max_new in zip(PROMPTS, [30, 20, 25, 17]):
        ids = target.tokenizer(prompt, return_tensors="pt").input_ids
        result = generate(target, ids, max_new_tokens=max_new, block_size=8, proposer=proposer)
        assert result.output_ids == hf_greedy(target, ids, max_new), prompt
    lengths = {len(tokens) for tokens in proposer.drafts}
    assert 0 in lengths and max(lengths) >= 1, lengths  # the cut made steps of no draft, and others drafted
    return proposer.drafts


def test_greedy_output_equals_the_targets_with_the_cut(tiny_target):
    assert_greedy_lossless(tiny_target)


@pytest.mark.slow
@pytest.mark.parametrize("arch", MORE_ARCHS)
def test_greedy_output_equals_the_targets_on_more_families(arch):
    assert_greedy_lossless(TargetModel(*build_tiny_target(arch, seed=0)))


# --- sampling: every draft is drawn from the distribution recorded for it ----------------------

SAMPLING = SamplingConfig(temperature=1.0, top_k=4)
DRAWS = 600


def flawed_draft(flaw: str):
    """`DSparkProposer.draft` with a seeded bug: "cut_after_draw" decides slot i's cut from the
    confidence of x_i, drawn first; "bias_on_own_token" records slot i's distribution biased
    on x_i instead of x_{i-1}."""

    @torch.inference_mode()
    def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator):
        hidden = self.block_hidden(committed_ids, new_features, block_size, num_drafts)
        base = self.logits(hidden).float()
        markov, confidence = self.drafter.markov_head, self.drafter.confidence_head
        prev, tokens, probs = committed_ids[0, -1], [], []
        for slot in range(base.shape[0]):
            q = probabilities(base[slot] + markov.bias(markov.embed(prev)), sampling)
            token = sample(q, generator)
            keyed = token if flaw == "cut_after_draw" else prev
            if torch.sigmoid(confidence(hidden[slot], markov.embed(keyed))) < self.confidence_threshold:
                break
            if flaw == "bias_on_own_token":
                q = probabilities(base[slot] + markov.bias(markov.embed(token)), sampling)
            tokens.append(token)
            probs.append(q)
            prev = token
        if not tokens:
            return Drafts(tokens=committed_ids.new_zeros(0), probs=base.new_zeros(0, base.shape[-1]))
        return Drafts(tokens=torch.stack(tokens), probs=torch.stack(probs))

    return draft


def draws_p_value(target: TargetModel, slot: int, lean_dtype=None) -> float:
    """Chi-square p-value of DRAWS drafts of `slot` (0 or 1) of one step, against the mean of the
    distributions recorded for them: equal in law when each draw follows its record (the cut
    before the slot and the record depend only on what comes before it). lean_dtype: the
    proposer's (its lean forward and Markov head, as where the engine decodes on a CPU)."""
    drafter = dspark_drafter(target, rank=8, block_size=4, markov_scale=0.5, confidence_scale=0.3)
    proposer = DSparkProposer(drafter, target.embed, target.logits, lean_dtype, confidence_threshold=THRESHOLD)
    ids = target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        features = target_features(target, ids[:, :-1], drafter.config.target_layer_ids)
        # slot 0's confidence (after the anchor) at sigmoid(0.5): never cut there, while the
        # token-dependent part (std about 0.85) decides the cut before slot 1
        head, first = drafter.confidence_head, proposer.block_hidden(ids, features, 4, 3)[0]
        head.proj.bias -= head(first, drafter.markov_head.embed(ids[0, -1])) - 0.5
    tokens, recorded = [], []
    for seed in range(DRAWS):
        proposer.reset()
        drafts = proposer.draft(ids, features, 4, 3, SAMPLING, torch.Generator().manual_seed(seed))
        if drafts.tokens.numel() > slot:
            tokens.append(int(drafts.tokens[slot]))
            recorded.append(drafts.probs[slot].double())
    assert len(tokens) >= DRAWS // 10, "the cut leaves too few draws of the slot to test"
    mean = torch.stack(recorded).mean(0)
    return chi_square_p_value(tokens, {i: float(p) for i, p in enumerate(mean) if p > 0})


@pytest.mark.parametrize("lean_dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("slot", [0, 1])
def test_drafts_follow_their_recorded_distributions(qwen3_target, slot, lean_dtype):
    assert draws_p_value(qwen3_target, slot, lean_dtype) > 1e-3


@pytest.mark.parametrize("flaw, slot", [("cut_after_draw", 0), ("bias_on_own_token", 1)])
def test_the_check_catches_a_seeded_bug(qwen3_target, monkeypatch, flaw, slot):
    monkeypatch.setattr(DSparkProposer, "draft", flawed_draft(flaw))
    assert draws_p_value(qwen3_target, slot) < 1e-3


# --- sampling end to end: the output keeps the target's distribution --------------------------

E2E_SAMPLES = 800
E2E_SAMPLING = SamplingConfig(temperature=0.8, top_k=3, verify_rule="rejection")


def bigram_drafter(target: TargetModel, ids: torch.Tensor):
    """A DSpark drafter whose Markov head (rank V, w1 the identity) holds, for every token a, the
    target's logits after [prompt, a]: a first draft after the anchor close to the target's, later
    ones in a context one token short, so verification accepts some drafts and rejects others.
    Its confidence reads the previous token only, a standard normal logit per token: about half
    the slots are cut at THRESHOLD. Returns (drafter, zero base logits): the heads alone draft, as
    a test double of the layers."""
    vocab = target.config.vocab_size
    drafter = dspark_drafter(target, rank=vocab, block_size=4)
    with torch.no_grad():
        drafter.markov_head.markov_w1.weight.copy_(torch.eye(vocab))
        proj = drafter.confidence_head.proj.weight
        proj.zero_()[:, target.hidden_size :] = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
        following = torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)
        drafter.markov_head.markov_w2.weight.copy_(target.model(following).logits[:, -1, :vocab].T)
    return drafter, lambda hidden: hidden.new_zeros(*hidden.shape[:-1], vocab)


def sampled_outputs(target: TargetModel) -> tuple[float, list[int], list[int]]:
    """E2E_SAMPLES outputs of `generate()` with the bigram drafter and the cut: their chi-square
    p-value against the target's exact joint, every step's acceptance length and draft length."""
    ids = target.tokenizer("def f(x):", return_tensors="pt").input_ids
    drafter, zero_logits = bigram_drafter(target, ids)
    proposer = RecordingProposer(DSparkProposer(drafter, target.embed, zero_logits, confidence_threshold=THRESHOLD))
    p_value, lengths = sampled_p_value(target, ids, proposer, E2E_SAMPLING, E2E_SAMPLES)
    return p_value, lengths, [len(tokens) for tokens in proposer.drafts]


@pytest.mark.slow
def test_sampled_outputs_follow_the_targets_distribution_with_the_cut(qwen3_target):
    p_value, lengths, drafted = sampled_outputs(qwen3_target)
    assert p_value > 1e-3, f"outputs do not follow the target's distribution (p={p_value:.2g})"
    assert drafted.count(0) >= len(drafted) // 10 and max(drafted) >= 2  # the cut varied the draft length
    assert all(lengths.count(n) >= 50 for n in (1, 2, 3)), lengths  # drafts were rejected and accepted


@pytest.mark.slow
def test_the_end_to_end_check_catches_a_cut_decided_after_the_draw(qwen3_target, monkeypatch):
    monkeypatch.setattr(DSparkProposer, "draft", flawed_draft("cut_after_draw"))
    assert sampled_outputs(qwen3_target)[0] < 1e-3
