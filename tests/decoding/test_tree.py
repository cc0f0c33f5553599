"""Tree verification is lossless: greedy output equals HF `generate()`, token for token.

Drafters: a random DFlash drafter (reads target features, almost never accepted) and
`RunnerUpOracle`, the target's greedy continuation with one slot per block whose first
choice is wrong and whose second choice is right, so trees wide enough to hold that
sibling accept a path that leaves the first-choice chain, and the cache compaction
moves entries that are not contiguous. Tests assert such a branch was accepted, else
they would prove nothing about the tree.
"""

import itertools

import pytest
import torch

import dflash.decoding.tree
import dflash.engine.forward
from dflash.decoding import SamplingConfig, TreeVerifier, generate
from dflash.decoding.ngram import LookupFirst
from dflash.decoding.token_tree import ROOT, TokenTree, build_tree, tree_attention_mask
from dflash.errors import ConfigError
from dflash.target import TargetModel, crop_cache
from dflash.toy.tiny import build_tiny_target
from helpers.decoding import (
    LONG_PROMPT,
    PROMPTS,
    OracleProposer,
    RunnerUpOracle,
    hf_greedy,
    random_proposer,
    record_paths,
)
from helpers.stats import chi_square_p_value, exact_joint

BLOCK_SIZE = 8
# the sampling check's sample size, output length and significance level, as in test_sampling.py
NUM_SAMPLES = 800
OUTPUT_LENGTH = 4
ALPHA = 1e-3


def leaves_first_choices(tree: TokenTree, path: list[int]) -> bool:
    """True when a node of the path is not its parent's first (top-ranked) child."""
    return any(node != tree.parents.index(tree.parents[node]) for node in path)


def check_equals_hf(target, prompt, max_new, proposer, budget, stop=None):
    ids = target.tokenizer(prompt, return_tensors="pt").input_ids
    expected = hf_greedy(target, ids, max_new, eos=stop)
    result = generate(
        target,
        ids,
        max_new_tokens=max_new,
        proposer=proposer,
        block_size=BLOCK_SIZE,
        verifier=TreeVerifier(budget),
        stop_token_ids=[stop] if stop is not None else [],
    )
    assert result.output_ids == expected, f"tree output differs from HF greedy (budget {budget})"
    assert 1 + sum(result.acceptance_lengths) == len(result.output_ids)
    assert all(1 <= n <= BLOCK_SIZE for n in result.acceptance_lengths)
    return result


@pytest.mark.parametrize("budget", [1, 16])
def test_random_drafter_output_equals_hf_greedy(tiny_target, budget):
    check_equals_hf(tiny_target, LONG_PROMPT, 20, random_proposer(tiny_target, block_size=BLOCK_SIZE), budget)


@pytest.mark.parametrize("budget", [4, 8, 16])
def test_runner_up_branches_are_accepted_and_output_equals_hf_greedy(tiny_target, budget, monkeypatch):
    """Features reach the drafter in order and the cache keeps only the accepted path,
    also when that path leaves the first-choice chain (budgets 8 and 16 hold siblings)."""
    steps = record_paths(monkeypatch)
    oracle = RunnerUpOracle(tiny_target, seed=1, check_features=budget == 16)
    result = check_equals_hf(tiny_target, LONG_PROMPT, 40, oracle, budget)
    assert max(result.acceptance_lengths) == min(budget, BLOCK_SIZE - 1) + 1
    branched = sum(leaves_first_choices(tree, path) for tree, path in steps)
    if budget >= 8:
        assert branched > 0


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_transformers_attention_reads_the_tree_mask(attention, monkeypatch):
    """On transformers' forward (engine=eager), eager and SDPA attention both read the tree's
    mask (made additive from the tree's boolean one)."""
    model, tokenizer = build_tiny_target("qwen3", seed=0)
    model.set_attn_implementation(attention)
    steps = record_paths(monkeypatch)
    target = TargetModel(model, tokenizer, engine="eager")
    check_equals_hf(target, LONG_PROMPT, 30, RunnerUpOracle(target, seed=1), 16)
    assert any(leaves_first_choices(tree, path) for tree, path in steps)


def test_engine_attention_kernel_reads_the_tree_mask(kernel_isa, monkeypatch):
    """With a head size our attention kernel takes (64), the fast engine verifies a tree of 16
    nodes (17 query rows) with that kernel and the tree's boolean mask, and the output stays
    HF's greedy one."""
    target = TargetModel(*build_tiny_target("llama", seed=0, hidden_size=128, num_heads=2, num_kv_heads=1), engine="fast")
    ids = target.tokenizer(LONG_PROMPT, return_tensors="pt").input_ids
    expected = hf_greedy(target, ids, 40)
    steps = record_paths(monkeypatch)
    widths, run = [], dflash.engine.forward.run_attention

    def recording_run(query, keys, values, mask):
        out = run(query, keys, values, mask)
        widths.append(query.shape[2] if out is not None else None)
        return out

    monkeypatch.setattr(dflash.engine.forward, "run_attention", recording_run)
    oracle = RunnerUpOracle(target, seed=1)
    result = generate(target, ids, max_new_tokens=40, proposer=oracle, block_size=BLOCK_SIZE, verifier=TreeVerifier(16))
    assert result.output_ids == expected
    assert any(leaves_first_choices(tree, path) for tree, path in steps)
    assert None not in widths and 17 in widths


@pytest.mark.parametrize("width", [3, 6])
def test_lookup_first_verifies_found_chains_and_drafts_trees_elsewhere(tiny_target, width, monkeypatch):
    """`dflash_tree.lookup_ngram`: where the context repeats, a step verifies the looked-up
    chain (a tree of one branch), elsewhere the drafter's tree; the drafter still receives
    every position's features once, in order, and the output is HF's greedy one. With a verify
    wider than the drafter's block (`lookup_tokens`), chains run past the drafter's B - 1 = 2
    tokens and its trees stay 2 deep."""
    steps = record_paths(monkeypatch)
    proposer = LookupFirst(RunnerUpOracle(tiny_target, seed=1, check_features=True), ngram=1, inner_block=3)
    found, lookup = [], proposer.lookup
    monkeypatch.setattr(proposer, "lookup", lambda *args: found.append(lookup(*args)) or found[-1])
    ids = tiny_target.tokenizer(PROMPTS[2] + " " + PROMPTS[1], return_tensors="pt").input_ids  # repeats in both targets
    result = generate(tiny_target, ids, max_new_tokens=60, proposer=proposer, block_size=width, verifier=TreeVerifier(4))
    assert result.output_ids == hf_greedy(tiny_target, ids, 60)
    chains = [tokens for tokens in found if tokens is not None]
    assert chains and len(chains) < len(found)
    assert max(len(chain) for chain in chains) == width - 1
    assert any(leaves_first_choices(tree, path) for tree, path in steps)
    assert max(max(tree.depths) for tree, _ in steps if tree.parents.count(ROOT) > 1) <= 2


def test_stop_token_inside_an_accepted_path_ends_output_there(tiny_target, monkeypatch):
    steps = record_paths(monkeypatch)
    ids = tiny_target.tokenizer(PROMPTS[1], return_tensors="pt").input_ids
    reference = hf_greedy(tiny_target, ids, 40)
    stop_index = next(i for i in range(8, 40) if reference[i] not in reference[:i])
    oracle = RunnerUpOracle(tiny_target, seed=2)
    result = check_equals_hf(tiny_target, PROMPTS[1], 40, oracle, 16, stop=reference[stop_index])
    assert len(result.output_ids) == stop_index + 1
    # the stop token was a draft inside the last accepted path, not the target's bonus token
    tree, path = steps[-1]
    assert reference[stop_index] in tree.tokens[path].tolist()


@pytest.mark.parametrize("max_new", [1, 2, 5, 12])
def test_max_new_tokens_inside_the_tree_is_never_exceeded(tiny_target, max_new):
    check_equals_hf(tiny_target, PROMPTS[0], max_new, RunnerUpOracle(tiny_target, seed=3), 16)


def test_greedy_check_catches_a_cache_that_keeps_the_first_nodes(qwen3_target, monkeypatch):
    """Negative control: keeping the first len(path) nodes' cache entries (a chain's crop)
    instead of the path's is lossy once a branch is accepted."""
    monkeypatch.setattr(
        dflash.decoding.tree,
        "keep_cache_positions",
        lambda cache, start, sources: crop_cache(cache, start + len(sources)),
    )
    with pytest.raises(AssertionError, match="differs from HF greedy"):
        check_equals_hf(qwen3_target, LONG_PROMPT, 40, RunnerUpOracle(qwen3_target, seed=1), 16)


def test_tree_holds_the_top_scoring_paths():
    """Best-first equals brute force: the N paths with the highest product of slot
    probabilities, every prefix of a chosen path chosen too."""
    logits = 2 * torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    logp = logits.log_softmax(-1)
    paths = [p for depth in (1, 2, 3) for p in itertools.product(range(5), repeat=depth)]
    score = {p: float(sum(logp[d, t] for d, t in enumerate(p))) for p in paths}
    for budget in (1, 4, 9, 30):
        tree = build_tree(logits, budget)
        node_paths = []
        for node in range(tree.size):
            parent = tree.parents[node]
            node_paths.append((node_paths[parent] if parent != ROOT else ()) + (int(tree.tokens[node]),))
            assert len(node_paths[-1]) == tree.depths[node]
        assert set(node_paths) == set(sorted(paths, key=score.get, reverse=True)[:budget])
        scores = [score[p] for p in node_paths]
        assert scores == sorted(scores, reverse=True)


def test_attention_mask_shows_each_node_its_ancestors_only():
    # anchor -> a(0) -> c(2); anchor -> b(1)
    tree = TokenTree(torch.tensor([5, 6, 7]), parents=[ROOT, ROOT, 0], depths=[1, 1, 2])
    visible = tree_attention_mask(tree, context_length=2, device="cpu")[0, 0]
    assert visible.tolist() == [
        [True, True, True, False, False, False],
        [True, True, True, True, False, False],
        [True, True, True, False, True, False],
        [True, True, True, True, False, True],
    ]


@pytest.mark.parametrize(
    "sampling,overrides,key",
    [
        (SamplingConfig(temperature=0.7, verify_rule="rejection"), {}, "decoding.verify_rule"),
        (SamplingConfig(), {"sliding_window": 8}, "methods"),
        (SamplingConfig(), {"attn": "flash_attention_2"}, "target.attn_implementation"),
    ],
)
def test_unsupported_settings_are_one_line_errors(sampling, overrides, key):
    attn = overrides.pop("attn", None)
    target = TargetModel(*build_tiny_target("qwen3", seed=0, num_layers=2, **overrides))
    if attn:
        target.config._attn_implementation = attn
    ids = target.tokenizer("x", return_tensors="pt").input_ids
    with pytest.raises(ConfigError, match=key):
        generate(
            target,
            ids,
            max_new_tokens=4,
            proposer=RunnerUpOracle(target),
            block_size=4,
            verifier=TreeVerifier(4),
            sampling=sampling,
        )


MATCH = SamplingConfig(temperature=1.3, top_k=3, top_p=0.9, verify_rule="match")


def sample_tree_outputs(target: TargetModel, num_samples: int) -> list[tuple[int, ...]]:
    ids = target.tokenizer("def f(x):", return_tensors="pt").input_ids
    proposer = OracleProposer(target, greedy_oracle=False, sharpen=0.6)
    return [
        tuple(
            generate(
                target,
                ids,
                max_new_tokens=OUTPUT_LENGTH,
                proposer=proposer,
                block_size=4,
                verifier=TreeVerifier(4),
                sampling=MATCH,
                generator=torch.Generator().manual_seed(seed),
            ).output_ids
        )
        for seed in range(num_samples)
    ]


def check_tree_sampling_is_lossless(target: TargetModel) -> None:
    ids = target.tokenizer("def f(x):", return_tensors="pt").input_ids
    exact = exact_joint(target, ids, MATCH, OUTPUT_LENGTH)
    p_value = chi_square_p_value(sample_tree_outputs(target, NUM_SAMPLES), exact)
    assert p_value > ALPHA, f"outputs do not follow the target's distribution (p={p_value:.2g})"


@pytest.fixture(scope="module")
def two_layer_llama() -> TargetModel:
    return TargetModel(*build_tiny_target("llama", seed=0, num_layers=2))


@pytest.mark.slow
def test_match_rule_sampling_follows_the_targets_distribution(two_layer_llama, monkeypatch):
    """Sampling with the 'match' rule: the joint of the first four tokens is the target's
    (chi-square), and the walk did leave the first-choice chain."""
    steps = record_paths(monkeypatch)
    check_tree_sampling_is_lossless(two_layer_llama)
    branched = sum(leaves_first_choices(tree, path) for tree, path in steps)
    assert branched >= NUM_SAMPLES // 20, branched


def walk_with_a_second_chance(tree, target_logits, sampling, generator):
    """Flawed double: draws a second target sample when the first has no child (a
    multi-candidate shortcut that favours the drafter's tokens)."""
    children = tree.children()
    path, node = [], ROOT
    while True:
        token = dflash.decoding.tree.target_token(target_logits[node + 1], sampling, generator)
        if token not in children[node]:
            token = dflash.decoding.tree.target_token(target_logits[node + 1], sampling, generator)
        if token not in children[node]:
            return path, token
        node = children[node][token]
        path.append(node)


@pytest.mark.slow
def test_the_sampling_check_rejects_a_walk_with_a_second_chance(two_layer_llama, monkeypatch):
    """Negative control for the chi-square check above."""
    monkeypatch.setattr(dflash.decoding.tree, "accepted_path", walk_with_a_second_chance)
    with pytest.raises(AssertionError, match="do not follow"):
        check_tree_sampling_is_lossless(two_layer_llama)
