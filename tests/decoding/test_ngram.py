"""Prompt lookup (n-gram) drafting: the lookup rule, and lossless decoding through the engine's
`draft` path (greedy equals HF `generate()`; sampling keeps the target's distribution)."""

import pytest
import torch

from dflash.decoding import Drafts, SamplingConfig, generate
from dflash.decoding.ngram import LookupFirst, NgramProposer, lookup_continuation
from dflash.decoding.verify import verify
from dflash.dflash.proposer import DFlashProposer
from dflash.drafter import DFlashDrafter, DrafterConfig, resolve_mask_token_id
from dflash.errors import ConfigError
from dflash.methods.ngram import NgramSettings
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import hf_greedy
from helpers.stats import chi_square_p_value, exact_joint

ALPHA = 1e-3


def test_lookup_prefers_the_longest_ngram_then_the_most_recent_occurrence():
    #        0  1  2  3  4  5  6  7  8  9
    ids = [1, 2, 3, 9, 2, 3, 7, 1, 2, 3]
    # bigram (2, 3) occurs at 1 and 4: the most recent (4) is followed by 7, 1, 2, 3
    assert lookup_continuation(ids, max_ngram=2, min_ngram=1, num_tokens=3) == [7, 1, 2]
    # trigram (1, 2, 3) only at 0: followed by 9, 2, ...
    assert lookup_continuation(ids, max_ngram=3, min_ngram=1, num_tokens=2) == [9, 2]
    # the continuation stops at the end of the context: fewer tokens than asked
    assert lookup_continuation([5, 6, 5, 6], max_ngram=2, min_ngram=1, num_tokens=10) == [5, 6]
    # no n-gram of the allowed lengths occurs earlier: no drafts
    assert lookup_continuation([1, 2, 3, 4], max_ngram=2, min_ngram=1, num_tokens=5) == []
    assert lookup_continuation([4, 1, 2, 3, 4], max_ngram=3, min_ngram=2, num_tokens=5) == []
    assert lookup_continuation([4, 1, 2, 3, 4], max_ngram=3, min_ngram=1, num_tokens=5) == [1, 2, 3, 4]
    assert lookup_continuation([7], max_ngram=2, min_ngram=1, num_tokens=5) == []


def test_bad_settings_are_config_errors():
    for kwargs, key in [
        ({"min_ngram": 0}, "min_ngram"),
        ({"max_ngram": 1, "min_ngram": 2}, "max_ngram"),
        ({"num_draft_tokens": 0}, "num_draft_tokens"),
    ]:
        with pytest.raises(ConfigError) as info:
            NgramSettings(**kwargs)
        assert info.value.key == key


PROMPTS = ["def f(x):", "x = 1\nx = 1\nx = 1\n", "aaaa"]


@pytest.mark.parametrize("max_ngram,min_ngram,num_draft_tokens", [(2, 1, 4), (3, 2, 7), (1, 1, 1)])
def test_greedy_prompt_lookup_equals_hf_greedy_and_accepts_drafts(tiny_target, max_ngram, min_ngram, num_draft_tokens):
    proposer = NgramProposer(NgramSettings(max_ngram, min_ngram, num_draft_tokens))
    accepted = 0
    for prompt in PROMPTS:
        ids = tiny_target.tokenizer(prompt, return_tensors="pt").input_ids
        expected = hf_greedy(tiny_target, ids, 40)
        result = generate(tiny_target, ids, max_new_tokens=40, block_size=num_draft_tokens + 1, proposer=proposer)
        assert result.output_ids == expected, (prompt, max_ngram, min_ngram, num_draft_tokens)
        assert 1 + sum(result.acceptance_lengths) == len(result.output_ids)
        assert all(1 <= n <= d + 1 for n, d in zip(result.acceptance_lengths, result.draft_counts))
        # the lookup drafts fewer than the verify width allows, including none
        assert max(result.draft_counts) <= num_draft_tokens and 0 in result.draft_counts
        accepted += sum(n - 1 for n in result.acceptance_lengths)
    assert accepted >= 5, "no draft was ever accepted: the test would prove nothing"


class Recording:
    """An inner proposer that drafts [7] and records what it was given."""

    target_layer_ids = [0]

    def __init__(self):
        self.seen, self.resets = [], 0

    def reset(self):
        self.resets += 1

    def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator):
        self.seen.append((committed_ids.shape[1], new_features[0, :, 0].tolist()))
        return Drafts(tokens=torch.tensor([7]))


def test_lookup_first_drafts_repeats_by_lookup_and_hands_the_drafter_every_position_once():
    inner = Recording()
    proposer = LookupFirst(inner, ngram=2)

    def step(ids, first, count):  # features of positions [first, first + count), value = position
        features = torch.arange(first, first + count, dtype=torch.float).view(1, count, 1)
        return proposer.draft(torch.tensor([ids]), features, 3, 2, SamplingConfig(), None).tokens.tolist()

    assert step([1, 2, 3], 0, 2) == [7]  # (2, 3) never occurred before: the drafter
    assert step([1, 2, 3, 4, 2, 3], 2, 3) == [4, 2]  # (2, 3) occurred, two tokens after it: lookup
    assert step([1, 2, 3, 4, 2, 3, 4, 2], 5, 2) == [3, 4]  # (4, 2) too
    assert step([1, 2, 3, 4, 2, 3, 4, 2, 9], 7, 1) == [7]  # (2, 9) is new: the drafter, with everything it missed
    assert inner.seen == [(3, [0.0, 1.0]), (9, [2.0, 3.0, 4.0, 5.0, 6.0, 7.0])]
    # a match with fewer tokens after it than the step drafts goes to the drafter
    assert step([1, 2, 3, 4, 2, 3, 4, 2, 9, 5, 5, 5], 8, 3) == [7] and inner.seen[-1] == (12, [8.0, 9.0, 10.0])
    step([5, 6, 5, 6, 5, 6], 0, 5)
    proposer.reset()
    assert inner.resets == 1 and proposer.pending == []


def test_lookup_steps_draft_wider_than_the_drafters_block():
    """With a loop block of 6 over a drafter of block 3, a lookup step drafts up to 5 tokens
    and needs only the drafter's 2 after its match; the drafter still gets blocks of 3."""
    inner = Recording()
    proposer = LookupFirst(inner, ngram=2, inner_block=3)

    def step(ids, first, count, num_drafts=5):
        features = torch.arange(first, first + count, dtype=torch.float).view(1, count, 1)
        return proposer.draft(torch.tensor([ids]), features, 6, num_drafts, SamplingConfig(), None).tokens.tolist()

    inner.draft = lambda ids, features, block, num, *rest: inner.seen.append((block, num)) or Drafts(torch.tensor([7]))
    assert step([1, 2, 3, 4, 5, 6, 7, 2, 3], 0, 9) == [4, 5, 6, 7, 2]  # (2, 3) occurred: five of what followed
    assert step([1, 2, 3, 4, 2, 3], 0, 6) == [4, 2, 3]  # three followed it, to the context's end
    assert step([1, 2, 3, 2, 3], 0, 5) == [2, 3]  # two: as many as the drafter would draft
    assert step([5, 5, 5], 0, 3) == [7] and inner.seen == [(3, 2)]  # one: the drafter, at its block
    assert step([5, 5, 5], 0, 3, num_drafts=1) == [5]  # the loop's last token: one is a whole draft


@pytest.mark.parametrize("ngram,loop_block", [(1, 4), (2, 4), (2, 9)])
def test_dflash_with_lookup_first_equals_hf_greedy(tiny_target, ngram, loop_block):
    """Through the real drafter, which refuses a gap in its context: lossless, and both
    proposers drafted; with a loop block of 9 over the drafter's 4, lookup steps draft more than 3."""
    torch.manual_seed(0)
    mask_id = resolve_mask_token_id(tiny_target.tokenizer, tiny_target.embedding_rows)
    config = DrafterConfig.from_target(tiny_target.config, num_layers=1, block_size=4, mask_token_id=mask_id)
    drafter = DFlashDrafter(config).eval()
    inner = DFlashProposer(drafter, tiny_target.embed, tiny_target.draft_logits, tiny_target.draft_dtype)
    drafts, drafted = inner.draft, []
    inner.draft = lambda *args: drafted.append(1) or drafts(*args)  # counts the drafter's steps
    proposer = LookupFirst(inner, ngram, inner_block=4)
    steps, widest = 0, 0
    for prompt in PROMPTS:
        ids = tiny_target.tokenizer(prompt, return_tensors="pt").input_ids
        result = generate(tiny_target, ids, max_new_tokens=40, block_size=loop_block, proposer=proposer)
        assert result.output_ids == hf_greedy(tiny_target, ids, 40), prompt
        steps += result.num_steps
        widest = max(widest, *result.draft_counts)
    assert 0 < len(drafted) < steps, (len(drafted), steps)  # both the drafter and the lookup drafted
    assert (widest > 3) == (loop_block > 4)  # lookup steps drafted past the drafter's 3 only in the wider loop


def test_one_hot_rejection_sampling_emits_the_targets_distribution():
    """A deterministic draft (probs None) is accepted with probability p(x) and otherwise
    replaced by a sample of p without x: the emitted first token follows p exactly."""
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, 2.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    sampling = SamplingConfig(temperature=1.0)
    p = torch.softmax(logits[0], -1)
    generator = torch.Generator().manual_seed(0)
    firsts, accepts = [], 0
    for _ in range(4000):
        accepted, next_token = verify(logits, Drafts(tokens=torch.tensor([0])), sampling, generator)
        firsts.append(0 if accepted else next_token)
        accepts += accepted
    assert 0.8 * 4000 * p[0] < accepts < 1.2 * 4000 * p[0]
    p_value = chi_square_p_value(firsts, {token: float(p[token]) for token in range(5)})
    assert p_value > ALPHA, f"first tokens do not follow the target's distribution (p={p_value:.2g})"


NUM_SAMPLES = 600
OUTPUT_LENGTH = 4
# (architecture, prompt, sampling): each rule once; the prompt is extended by the target's
# own greedy continuation, whose loops give the lookup drafts the target often samples.
CASES = {
    "rejection": ("llama", "def f(x):", SamplingConfig(temperature=0.7, top_k=3, top_p=0.9, verify_rule="rejection")),
    "match": ("qwen3", "x = 1\nx = 1\nx = 1\n", SamplingConfig(temperature=1.3, top_k=3, top_p=0.9, verify_rule="match")),
}


@pytest.mark.slow
@pytest.mark.parametrize("rule", CASES)
def test_sampled_prompt_lookup_follows_the_targets_distribution(rule):
    arch, prompt, sampling = CASES[rule]
    target = TargetModel(*build_tiny_target(arch, seed=0, num_layers=2))
    ids = target.tokenizer(prompt, return_tensors="pt").input_ids
    ids = torch.cat([ids, torch.tensor([generate(target, ids, max_new_tokens=40).output_ids])], dim=1)
    proposer = NgramProposer(NgramSettings(max_ngram=2, min_ngram=1, num_draft_tokens=2))
    outputs, lengths = [], []
    for seed in range(NUM_SAMPLES):
        result = generate(
            target, ids, max_new_tokens=OUTPUT_LENGTH, block_size=3, proposer=proposer, sampling=sampling,
            generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        outputs.append(tuple(result.output_ids))
        lengths.extend(result.acceptance_lengths)
    p_value = chi_square_p_value(outputs, exact_joint(target, ids, sampling, OUTPUT_LENGTH))
    assert p_value > ALPHA, f"outputs do not follow the target's distribution (p={p_value:.2g})"
    assert lengths.count(2) + lengths.count(3) >= NUM_SAMPLES // 20, "drafts were hardly ever accepted"
