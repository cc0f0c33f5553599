"""Training path == decoding path (docs/design.md invariants 3 to 6).

The drafter's logits for a block computed by training (many blocks per sequence, one
forward, sparse mask, full-sequence target features) must equal those of decoding
(`DFlashProposer` with its DrafterCache, context fed incrementally as the engine feeds
it). This guards the off-by-one that gives 98% training accuracy and 10% acceptance.
"""

import pytest
import torch

from dflash.decoding import generate
from dflash.decoding.verify import propose_tokens
from dflash.dflash.proposer import DFlashProposer
from dflash.specs import DrafterSpec, build_drafter
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target
from dflash.training.anchors import Anchors
from dflash.training.blocks import build_blocks
from dflash.training.forward import draft_blocks, target_features
from helpers.decoding import PartialOracleProposer


def _target_and_drafter(arch: str, block_size: int, window: int | None = None, causal: bool = False):
    model, tokenizer = build_tiny_target(arch, seed=0)
    target = TargetModel(model, tokenizer)
    spec = DrafterSpec(num_layers=2, block_size=block_size, num_target_features=3, attention_window=window, block_causal=causal)
    drafter = build_drafter(spec, target).eval()
    with torch.no_grad():  # larger than init weights, so context mistakes move the logits clearly
        for parameter in drafter.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.15)
    return target, drafter


def _training_logits(target, drafter, input_ids, attention_mask, anchor_positions, anchor_valid):
    """(b, N, B-1, V) logits of slots 1..B-1 from the training path."""
    block_size = drafter.block_size
    anchors = Anchors(positions=anchor_positions, valid=anchor_valid)
    blocks = build_blocks(input_ids, attention_mask, anchors, block_size, drafter.config.mask_token_id)
    features = target_features(target, input_ids, drafter.config.target_layer_ids)
    with torch.no_grad():
        hidden = draft_blocks(drafter, target.embed, features, attention_mask, anchors, blocks)
        logits = target.logits(hidden)
    batch, num_blocks = anchor_positions.shape
    return logits.view(batch, num_blocks, block_size, -1)[:, :, 1:]


# (arch, block size, window, causal): a window of 5 binds on context keys at every anchor past 5,
# and on the block's own keys where B > 5; None, False is the published drafter.
SHAPES = [
    ("qwen3", 4, None, False),
    ("llama", 16, None, False),
    ("qwen3", 4, 5, False),
    ("llama", 8, 5, True),
    ("qwen3", 4, None, True),
]


@pytest.mark.parametrize("arch,block_size,window,causal", SHAPES)
def test_training_blocks_equal_proposer_blocks_fed_incrementally(arch, block_size, window, causal):
    target, drafter = _target_and_drafter(arch, block_size, window, causal)
    torch.manual_seed(3)
    long_len, short_len = 48, 30
    input_ids = torch.randint(0, 256, (2, long_len))
    attention_mask = torch.ones(2, long_len, dtype=torch.bool)
    attention_mask[0, short_len:] = False  # sequence 0 is right-padded
    anchors = {0: [1, 6, 7, 13, 29], 1: [4, 5, 20, 33, 47]}  # overlapping blocks, first and last tokens
    positions = torch.tensor([anchors[0], anchors[1]])
    training = _training_logits(target, drafter, input_ids, attention_mask, positions, torch.ones_like(positions, dtype=torch.bool))

    for row, length in ((0, short_len), (1, long_len)):
        ids = input_ids[row : row + 1, :length]
        features = target_features(target, ids, drafter.config.target_layer_ids)
        proposer = DFlashProposer(drafter, target.embed, target.logits)
        proposer.reset()
        seen = 0
        for j, anchor in enumerate(anchors[row]):
            decoding = proposer.propose(ids[:, : anchor + 1], features[:, seen:anchor], block_size, block_size - 1)
            seen = anchor
            torch.testing.assert_close(training[row, j], decoding, atol=1e-5, rtol=1e-5)

    # Negative control: the same comparison with labels/positions one step off fails.
    inner = positions[:, :-1]
    shifted = _training_logits(target, drafter, input_ids, attention_mask, inner + 1, torch.ones_like(inner, dtype=torch.bool))
    assert (shifted[1, 0] - training[1, 0]).abs().max() > 1e-2
    if window is not None:  # and training with the window off by one (`>` for llama.cpp's `>=`) fails
        drafter.config.attention_window = window + 1
        wider = _training_logits(
            target, drafter, input_ids, attention_mask, positions, torch.ones_like(positions, dtype=torch.bool)
        )
        drafter.config.attention_window = window
        assert (wider - training).abs().max() > 1e-2


class RecordingProposer:
    """A DFlashProposer that records each block's anchor position and logits.

    With `drafts_from`, the engine verifies that proposer's drafts instead (the
    DFlashProposer still drafts every block, and is fed and cropped by the engine as
    usual), so verify steps accept as many drafts as `drafts_from` plans.
    """

    def __init__(self, inner: DFlashProposer, drafts_from=None):
        self.inner = inner
        self.drafts_from = drafts_from
        self.target_layer_ids = inner.target_layer_ids
        self.records: list[tuple[int, torch.Tensor]] = []

    def reset(self):
        self.inner.reset()
        if self.drafts_from is not None:
            self.drafts_from.reset()

    def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator):
        return propose_tokens(self.propose(committed_ids, new_features, block_size, num_drafts), sampling, generator)

    def propose(self, committed_ids, new_features, block_size, num_drafts):
        logits = self.inner.propose(committed_ids, new_features, block_size, num_drafts)
        self.records.append((committed_ids.shape[1] - 1, logits.clone()))
        if self.drafts_from is not None:
            return self.drafts_from.propose(committed_ids, None, block_size, num_drafts)
        return logits


def _assert_engine_drafts_equal_training(target, drafter, prompt, result, recorder):
    sequence = torch.cat([prompt, torch.tensor([result.output_ids])], dim=1)
    positions = torch.tensor([[anchor for anchor, _ in recorder.records]])
    training = _training_logits(
        target,
        drafter,
        sequence,
        torch.ones_like(sequence, dtype=torch.bool),
        positions,
        torch.ones_like(positions, dtype=torch.bool),
    )
    for j, (_, decoding) in enumerate(recorder.records):
        # Cached (engine) and full-sequence target features differ only by float rounding.
        torch.testing.assert_close(training[0, j, : decoding.shape[0]], decoding, atol=1e-5, rtol=1e-5)


def test_training_blocks_equal_the_engines_drafts():
    """The engine's own feeding (prefill features, then features of accepted positions
    from verify forwards with a KV cache) against the training path on its output."""
    block_size = 4
    target, drafter = _target_and_drafter("qwen3", block_size)
    prompt = torch.tensor([[5, 80, 81, 99, 3, 17, 42]])
    recorder = RecordingProposer(DFlashProposer(drafter, target.embed, target.logits))
    result = generate(target, prompt, max_new_tokens=40, block_size=block_size, proposer=recorder)
    assert len(recorder.records) >= 10
    _assert_engine_drafts_equal_training(target, drafter, prompt, result, recorder)


@pytest.mark.parametrize(
    "arch,block_size,window,causal", [("qwen3", 8, None, False), ("llama", 4, None, False), ("qwen3", 8, 6, True)]
)
def test_training_blocks_equal_the_engines_drafts_under_partial_acceptance(arch, block_size, window, causal):
    """As above, with verify steps that accept 0..B-1 drafts: the drafter gets the
    features of several accepted positions at once and its cache is cropped back to
    the new anchor after each block (with a window, the cache keeps the keys the window hides)."""
    target, drafter = _target_and_drafter(arch, block_size, window, causal)
    prompt = torch.tensor([[5, 80, 81, 99, 3, 17, 42]])
    slots = torch.randperm(block_size, generator=torch.Generator().manual_seed(0)).tolist()
    oracle = PartialOracleProposer(target, wrong_slots=slots)
    recorder = RecordingProposer(DFlashProposer(drafter, target.embed, target.logits), drafts_from=oracle)
    max_new = 2 + sum(slot + 1 for slot in slots)
    result = generate(target, prompt, max_new_tokens=max_new, block_size=block_size, proposer=recorder)
    assert set(range(1, block_size + 1)) <= set(result.acceptance_lengths)
    _assert_engine_drafts_equal_training(target, drafter, prompt, result, recorder)
