"""EAGLE-3: the training path equals the decoding chain, decoding is lossless (greedy ==
HF generate, sampling keeps the target's distribution), and the reduced vocabulary maps."""

import pytest
import torch

from dflash.decoding import SamplingConfig, generate
from dflash.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Proposer, build_eagle3_proposer
from dflash.eagle3.training import draft_vocab_from_counts, ttt_loss, ttt_steps
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from dflash.training.forward import target_features
from helpers.decoding import hf_greedy
from helpers.stats import chi_square_p_value, reference_probabilities

NUM_SAMPLES = 500
OUTPUT_LENGTH = 4  # the prefill token, then a verify step of two drafts, then one more
PROMPTS = ["def add(a, b):\n    return", "import os\n", "x", "class Stack:\n    def push(self, item):\n"]


def random_drafter(target, seed=0, **kwargs) -> Eagle3Drafter:
    torch.manual_seed(seed)
    return Eagle3Drafter(Eagle3Config.from_target(target.config, **kwargs))


def test_training_steps_equal_the_decoding_chain(qwen3_target):
    """Step j of the training-time test at position t gives the logits the decoding chain
    gives for its (j+1)-th draft after context t, when the chain drafts the data's tokens."""
    target, k = qwen3_target, 5
    drafter = random_drafter(target)
    proposer = Eagle3Proposer(drafter, target.embed)
    prompt = target.tokenizer(PROMPTS[3], return_tensors="pt").input_ids
    features = target.forward(
        prompt[:, :-1], torch.arange(prompt.shape[1] - 1).unsqueeze(0), None, proposer.target_layer_ids
    ).features
    sampling = SamplingConfig(temperature=1.0)
    drafts = proposer.draft(prompt, features, k + 1, k, sampling, torch.Generator().manual_seed(0))
    sequence = torch.cat([prompt, drafts.tokens.unsqueeze(0)], dim=1)
    with torch.no_grad():
        all_features = target_features(target, sequence, proposer.target_layer_ids)
        steps = list(ttt_steps(drafter, target.embed, all_features, sequence, k))
    t = prompt.shape[1] - 2  # the last context pair: (features of t, the anchor)
    for j, hidden in enumerate(steps):
        expected = drafter.target_logits(hidden[0, t : t + 1]).softmax(-1)[0]
        torch.testing.assert_close(drafts.probs[j], expected, atol=1e-5, rtol=1e-4)


_EXPECTED: dict[tuple, list[int]] = {}


def expected_greedy(target, prompt: str, max_new: int, stop=None) -> list[int]:
    """HF generate's greedy output, computed once per target, prompt and stop token."""
    key = (target.config.model_type, target.num_layers, prompt, max_new, stop)
    if key not in _EXPECTED:
        ids = target.tokenizer(prompt, return_tensors="pt").input_ids
        _EXPECTED[key] = hf_greedy(target, ids, max_new, eos=stop)
    return _EXPECTED[key]


@pytest.mark.parametrize("num_drafts", [1, 3, 7])
def test_random_drafter_output_equals_hf_greedy(tiny_target, num_drafts):
    proposer = build_eagle3_proposer(None, tiny_target, num_drafts)
    stop = tiny_target.tokenizer.encode("\n")[-1]
    for prompt, max_new, stops in [(PROMPTS[0], 40, []), (PROMPTS[3], 30, [stop]), (PROMPTS[2], 9, [])]:
        ids = tiny_target.tokenizer(prompt, return_tensors="pt").input_ids
        result = generate(
            tiny_target, ids, max_new_tokens=max_new, block_size=num_drafts + 1, proposer=proposer, stop_token_ids=stops
        )
        assert result.output_ids == expected_greedy(tiny_target, prompt, max_new, *stops), (prompt, num_drafts, stops)


def greedy_continuations(target, length=48):
    """The target's own greedy continuations of PROMPTS: (ids (1, S), loss_mask (1, S))."""
    rows = []
    for prompt in PROMPTS:
        ids = target.tokenizer(prompt, return_tensors="pt").input_ids
        out = torch.tensor([ids[0].tolist() + expected_greedy(target, prompt, length)])
        mask = torch.zeros_like(out, dtype=torch.bool)
        mask[0, ids.shape[1] :] = True
        rows.append((out, mask))
    return rows


@pytest.fixture(scope="module")
def two_layer_target() -> TargetModel:
    """A two-layer tiny Qwen3 target: the sampling test runs it thousands of times."""
    return TargetModel(*build_tiny_target("qwen3", seed=0, num_layers=2))


_TRAINED: dict[tuple[str, int], Eagle3Drafter] = {}


def trained_drafter(target: TargetModel) -> Eagle3Drafter:
    """A drafter trained briefly (40 steps) on the target's own greedy continuations of PROMPTS."""
    arch = (target.config.model_type, target.num_layers)
    if arch not in _TRAINED:
        drafter = random_drafter(target, seed=1)
        drafter.lm_head.weight.data.copy_(target.lm_head.weight)
        rows = greedy_continuations(target)
        features = [target_features(target, ids, drafter.config.target_layer_ids) for ids, _ in rows]
        optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-2)
        for step in range(40):
            (ids, mask), feats = rows[step % len(rows)], features[step % len(rows)]
            loss = ttt_loss(drafter, target.embed, feats, ids, mask, ttt_length=4).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        _TRAINED[arch] = drafter.eval()
    return _TRAINED[arch]


@pytest.fixture
def trained(tiny_target):
    return tiny_target, trained_drafter(tiny_target)


@pytest.mark.parametrize("lean_dtype", [None, torch.bfloat16])  # as the module, and on the engine's kernels
@pytest.mark.parametrize("num_drafts", [2, 5])
def test_trained_drafter_is_accepted_and_lossless(trained, num_drafts, lean_dtype):
    target, drafter = trained
    proposer = Eagle3Proposer(drafter, target.embed, lean_dtype)
    accepted = 0
    for prompt in PROMPTS:
        ids = target.tokenizer(prompt, return_tensors="pt").input_ids
        result = generate(target, ids, max_new_tokens=48, block_size=num_drafts + 1, proposer=proposer)
        assert result.output_ids == expected_greedy(target, prompt, 48), prompt
        accepted += sum(result.acceptance_lengths) - result.num_steps
    assert accepted > 20, accepted  # drafts were accepted, so the cache crop after partial acceptance ran


@pytest.mark.parametrize("rule", ["rejection", "match"])
@pytest.mark.slow
def test_sampling_keeps_the_target_distribution(two_layer_target, rule):
    """The engine drafts through `Eagle3Proposer.draft` (sampled chains and their distributions)."""
    target, drafter = two_layer_target, trained_drafter(two_layer_target)
    sampling = SamplingConfig(temperature=1.0, top_k=3, verify_rule=rule)
    proposer = Eagle3Proposer(drafter, target.embed)
    ids = target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    outputs, lengths = [], []
    for seed in range(NUM_SAMPLES):
        generator = torch.Generator().manual_seed(seed)
        result = generate(
            target, ids, max_new_tokens=OUTPUT_LENGTH, block_size=3, proposer=proposer, sampling=sampling, generator=generator
        )
        outputs.append(tuple(result.output_ids))
        lengths += result.acceptance_lengths
    assert max(lengths) > 1, "no draft was ever accepted: the test would not exercise verification"
    joint = {(): 1.0}
    with torch.no_grad():
        for _ in range(OUTPUT_LENGTH):
            extended = {}
            for prefix, p in joint.items():
                logits = target.model(torch.cat([ids, torch.tensor([prefix], dtype=torch.long)], dim=1)).logits[0, -1]
                probs = reference_probabilities(logits, temperature=1.0, top_k=3)
                extended.update({prefix + (tok,): p * float(probs[tok]) for tok in probs.nonzero().flatten().tolist()})
            joint = extended
    assert chi_square_p_value(outputs, joint) > 1e-3


def test_reduced_vocabulary_maps_draft_ids_to_target_ids(qwen3_target):
    vocab = qwen3_target.config.vocab_size
    counts = torch.zeros(vocab, dtype=torch.long)
    counts[[7, 3, 200, 50]] = torch.tensor([5, 9, 9, 1])
    ids = draft_vocab_from_counts(counts, 3)
    assert ids.tolist() == [3, 7, 200]  # the three most frequent, ascending
    drafter = random_drafter(qwen3_target, draft_vocab_size=3)
    drafter.set_draft_vocab(ids)
    assert drafter.d2t.tolist() == [3, 6, 198] and drafter.t2d.nonzero().flatten().tolist() == [3, 7, 200]
    logits = drafter.target_logits(torch.randn(2, drafter.config.hidden_size))
    assert torch.isfinite(logits).nonzero()[:, 1].unique().tolist() == [3, 7, 200]
    # a label outside the draft vocabulary is a miss with no loss
    sequence = torch.tensor([[3, 7, 200, 9, 3]])
    mask = torch.tensor([[False, False, True, True, True]])
    feats = target_features(qwen3_target, sequence, drafter.config.target_layer_ids)
    result = ttt_loss(drafter, qwen3_target.embed, feats, sequence, mask, ttt_length=2)
    outside = result.weights == 0
    assert outside.sum() == 2 and not result.correct[outside].any()  # token 9 at steps 0 and 1


def test_step_j_at_t_is_scored_against_token_t_plus_2_plus_j(qwen3_target):
    drafter = random_drafter(qwen3_target)
    torch.manual_seed(3)
    ids = torch.randint(0, qwen3_target.config.vocab_size, (1, 12))
    mask = torch.arange(12).unsqueeze(0) >= 4
    feats = target_features(qwen3_target, ids, drafter.config.target_layer_ids)
    with torch.no_grad():
        result = ttt_loss(drafter, qwen3_target.embed, feats, ids, mask, ttt_length=3)
        steps = list(ttt_steps(drafter, qwen3_target.embed, feats, ids, 3))
    for j, hidden in enumerate(steps):
        rows = [t for t in range(12) if t + 2 + j < 12 and mask[0, t + 2 + j]]
        expected = torch.nn.functional.cross_entropy(
            drafter.draft_logits(hidden[0, rows]), ids[0, [t + 2 + j for t in rows]], reduction="none"
        )
        torch.testing.assert_close(result.cross_entropy[result.slots == j + 1], expected)
        assert result.weights[result.slots == j + 1].unique().tolist() == [pytest.approx(0.8**j)]
