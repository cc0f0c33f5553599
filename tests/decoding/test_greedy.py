"""Greedy speculative decoding is lossless: token for token the target's own greedy output."""

import pytest
import torch

import dflash.decoding.chain
from dflash.decoding import generate
from helpers.decoding import PROMPTS, OracleProposer, PartialOracleProposer, hf_greedy, lossy_verify, random_proposer

BLOCK_SIZES = [1, 2, 4, 8, 16]


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_random_drafter_output_equals_hf_greedy(tiny_target, block_size):
    proposer = random_proposer(tiny_target)
    for prompt, max_new in zip(PROMPTS, [40, 25, 33, 17]):
        ids = tiny_target.tokenizer(prompt, return_tensors="pt").input_ids
        expected = hf_greedy(tiny_target, ids, max_new)
        result = generate(tiny_target, ids, max_new_tokens=max_new, block_size=block_size, proposer=proposer)
        assert result.output_ids == expected, (prompt, block_size)
        assert sum(result.acceptance_lengths) + 1 == len(result.output_ids)


def check_partial_acceptance(target, ids, block_size, max_new, oracle, stop=None):
    """Speculative output equals HF greedy and every verify step accepts what the oracle
    planned. Steps the oracle never saw are the engine's draft-less last steps (one token
    left to emit); a stop token cuts the last step short."""
    expected = hf_greedy(target, ids, max_new, eos=stop)
    result = generate(
        target, ids, max_new_tokens=max_new, block_size=block_size, proposer=oracle, stop_token_ids=[stop] if stop else []
    )
    assert result.output_ids == expected, "speculative output differs from HF greedy"
    lengths = result.acceptance_lengths
    assert len(lengths) - len(oracle.planned_accepts) in (0, 1)
    planned = [accepts + 1 for accepts in oracle.planned_accepts] + [1] * (len(lengths) - len(oracle.planned_accepts))
    if stop is None:
        assert lengths == planned
    else:
        assert lengths[:-1] == planned[:-1] and 1 <= lengths[-1] <= planned[-1]
    assert 1 + sum(lengths) == len(result.output_ids)
    return result


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_partial_acceptance_hits_every_accept_length_and_stays_lossless(tiny_target, block_size):
    """One wrong draft per block at a slot from a seeded permutation: every accept length
    0..B-1 occurs, the engine reports exactly the planned lengths (+1 for the bonus
    token), and max_new_tokens cuts the second round of the schedule mid-block."""
    slots = torch.randperm(block_size, generator=torch.Generator().manual_seed(block_size)).tolist()
    ids = tiny_target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    max_new = 1 + sum(slot + 1 for slot in slots) + block_size // 2 + 1
    result = check_partial_acceptance(tiny_target, ids, block_size, max_new, PartialOracleProposer(tiny_target, wrong_slots=slots))
    assert set(range(1, block_size + 1)) <= set(result.acceptance_lengths)


def test_partial_acceptance_with_random_slots_and_a_stop_token(tiny_target):
    """The oracle's own random slots, and a stop token that ends the output inside a block."""
    ids = tiny_target.tokenizer(PROMPTS[3], return_tensors="pt").input_ids
    reference = hf_greedy(tiny_target, ids, 60)
    stop_index = next(i for i in range(10, 60) if reference[i] not in reference[:i])
    result = check_partial_acceptance(
        tiny_target, ids, 8, 60, PartialOracleProposer(tiny_target, seed=1), stop=reference[stop_index]
    )
    assert len(result.output_ids) == stop_index + 1
    assert len(set(result.acceptance_lengths)) >= 4


def test_greedy_check_catches_a_verify_that_keeps_one_wrong_draft(tiny_target, monkeypatch):
    """Negative control: the equality check above fails for a lossy engine."""
    monkeypatch.setattr(dflash.decoding.chain, "verify", lossy_verify)  # keeps the first rejected draft
    ids = tiny_target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    with pytest.raises(AssertionError, match="differs from HF greedy"):
        check_partial_acceptance(tiny_target, ids, 4, 20, PartialOracleProposer(tiny_target))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_oracle_drafter_accepts_whole_blocks_and_stays_lossless(tiny_target, block_size):
    ids = tiny_target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    max_new = 1 + 3 * block_size  # prefill token + exactly three full blocks
    expected = hf_greedy(tiny_target, ids, max_new)
    result = generate(tiny_target, ids, max_new_tokens=max_new, block_size=block_size, proposer=OracleProposer(tiny_target))
    assert result.output_ids == expected
    assert result.acceptance_lengths == [block_size] * 3
    assert result.tau == block_size


def test_stop_token_inside_an_accepted_block_ends_output_there(tiny_target):
    ids = tiny_target.tokenizer(PROMPTS[1], return_tensors="pt").input_ids
    reference = hf_greedy(tiny_target, ids, 40)
    stop_index = next(i for i in range(5, 40) if reference[i] not in reference[:i])
    stop = reference[stop_index]
    result = generate(
        tiny_target, ids, max_new_tokens=40, block_size=8, proposer=OracleProposer(tiny_target), stop_token_ids=[stop]
    )
    assert result.output_ids == reference[: stop_index + 1]
    assert result.output_ids == hf_greedy(tiny_target, ids, 40, eos=stop)


def test_stop_token_from_prefill_ends_immediately(qwen3_target):
    ids = qwen3_target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    first = hf_greedy(qwen3_target, ids, 1)[0]
    result = generate(
        qwen3_target, ids, max_new_tokens=20, block_size=4, proposer=OracleProposer(qwen3_target), stop_token_ids=[first]
    )
    assert result.output_ids == [first] and result.num_steps == 0


@pytest.mark.parametrize("max_new", [1, 2, 5, 11, 12])
def test_max_new_tokens_inside_a_block_is_never_exceeded(tiny_target, max_new):
    ids = tiny_target.tokenizer(PROMPTS[3], return_tensors="pt").input_ids
    result = generate(tiny_target, ids, max_new_tokens=max_new, block_size=8, proposer=OracleProposer(tiny_target))
    assert result.output_ids == hf_greedy(tiny_target, ids, max_new)


def test_result_reports_times_and_rates(qwen3_target):
    ids = qwen3_target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    result = generate(qwen3_target, ids, max_new_tokens=10, block_size=4, proposer=random_proposer(qwen3_target))
    assert result.prefill_time_s > 0 and result.decode_time_s > 0
    assert result.tokens_per_s == pytest.approx(10 / result.total_time_s)
    assert all(1 <= n <= 4 for n in result.acceptance_lengths)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -3}, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, "max_new_tokens"),
        ({"max_new_tokens": 5, "block_size": 0}, "block_size"),
        ({"max_new_tokens": 5, "block_size": -1}, "block_size"),
        ({"max_new_tokens": 5, "block_size": 4}, "drafter"),  # no proposer
        ({"max_new_tokens": 5, "block_size": 4.0, "use_proposer": True}, "block_size"),
    ],
)
def test_bad_generation_settings_are_one_error_naming_the_setting(qwen3_target, settings, key):
    from dflash.errors import ConfigError

    settings = dict(settings)
    proposer = random_proposer(qwen3_target) if settings.pop("use_proposer", False) else None
    ids = qwen3_target.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    with pytest.raises(ConfigError, match=f"^{key}: ") as error:
        generate(qwen3_target, ids, proposer=proposer, **settings)
    assert "\n" not in str(error.value)
