"""Tree verification: one target forward checks a tree of draft candidates (batch size 1).

Per step: the drafter drafts a block [anchor, mask x (B-1)] once; `build_tree` turns its
per-slot distributions into a tree of `tree_budget` nodes (token_tree.py states the
rule); the target runs once over [anchor, nodes] with a tree attention mask (each node
sees the committed context, its ancestors and itself) at positions anchor + depth. The
walk from the anchor follows the child equal to the target's own token at each node and
stops at the first node with no such child: the path's tokens are accepted and the
target's token there is emitted too.

Lossless: every emitted token is the target's own choice (argmax, or with
`verify_rule="match"` its own sample) given the tokens before it; the tree only decides
how many of them one forward yields. Sampling with the "rejection" rule is refused: the
tree's candidates are the drafter's top tokens, not samples from it.

Cache invariant, as in engine.py, at the top of each step: committed tokens occupy
positions [0, L); the target cache holds [0, L-1) (not the anchor at L-1), and the
drafter has seen target features of exactly [0, L-1). After the verify forward the
cache holds the anchor and all N nodes; `keep_cache_positions` moves the accepted
path's entries right behind the anchor and drops the rest, and the drafter receives the
anchor's and the path's features, in path order.
"""

from __future__ import annotations

import time

import torch

from dflash.decoding.engine import GenerationResult, commit, prefill, synchronize, target_token
from dflash.decoding.proposer import Proposer
from dflash.decoding.sampling import SamplingConfig
from dflash.decoding.token_tree import ROOT, TokenTree, build_tree, tree_attention_mask, tree_position_ids
from dflash.errors import require
from dflash.target import TargetModel
from dflash.target.cache import keep_cache_positions

#: attention implementations that read a custom 4D mask (flash attention ignores it)
TREE_ATTENTION = ("sdpa", "eager")


def check_tree_support(target: TargetModel, sampling: SamplingConfig) -> None:
    """One ConfigError line for a target or sampling setting tree verification cannot keep lossless."""
    implementation = getattr(target.config, "_attn_implementation", None)
    require(
        implementation in TREE_ATTENTION,
        "target.attn_implementation",
        f"tree verification needs a custom attention mask, which {implementation!r} ignores; "
        f"use one of {TREE_ATTENTION}",
    )
    layer_types = getattr(target.config, "layer_types", None) or ()
    windowed = getattr(target.config, "sliding_window", None) and (
        not layer_types or "sliding_attention" in layer_types
    )
    require(
        not windowed,
        "methods",
        f"tree verification (method dflash_tree) does not support sliding-window targets ({target.config.model_type}); "
        "use method dflash (chain verification)",
    )
    require(
        sampling.greedy or sampling.verify_rule == "match",
        "decoding.verify_rule",
        "tree verification samples with the 'match' rule only (the tree holds the drafter's top tokens, not samples); "
        "set decoding.verify_rule=match or decoding.temperature=0",
    )


def accepted_path(
    tree: TokenTree, target_logits: torch.Tensor, sampling: SamplingConfig, generator
) -> tuple[list[int], int]:
    """Walk the tree along the target's own tokens.

    Args:
        target_logits: (N + 1, V); row 0 follows the anchor, row i + 1 follows node i.
    Returns:
        (path, next_token): accepted node indices from depth 1 down, and the target's
        token after the last of them.
    """
    children = tree.children()
    path, node = [], ROOT
    while True:
        token = target_token(target_logits[node + 1], sampling, generator)
        child = children[node].get(token)
        if child is None:
            return path, token
        path.append(child)
        node = child


@torch.inference_mode()
def generate_tree(
    target: TargetModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    proposer: Proposer,
    block_size: int,
    tree_budget: int,
    draft_threshold: float = 0.0,
    stop_token_ids: list[int] | tuple[int, ...] = (),
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `input_ids` with tree verification, losslessly.

    Same arguments, semantics and timing fields as `engine.generate`; acceptance_lengths
    are accepted path lengths + 1 (the target's own token counts).

    Args:
        input_ids: (1, P) prompt ids, P >= 1.
        proposer: returns per-slot logits (num_drafts, V) for a block (e.g. DFlashProposer).
        block_size: B; the tree is at most B - 1 deep.
        tree_budget: number of draft nodes per verify step (the target verifies
            tree_budget + 1 tokens per step).
        draft_threshold: leave out nodes whose path score (product of slot
            probabilities) is below it; 0 keeps the full budget every step.
    """
    require(block_size >= 2, "decoding.block_size", f"tree verification drafts, so it needs >= 2, got {block_size}")
    require(tree_budget >= 1, "dflash_tree.budget", f"must be >= 1, got {tree_budget}")
    require(0 <= draft_threshold <= 1, "decoding.draft_threshold", f"must be in [0, 1], got {draft_threshold}")
    require(max_new_tokens >= 1, "decoding.max_new_tokens", f"must be >= 1, got {max_new_tokens}")
    require(input_ids.dim() == 2 and input_ids.shape[0] == 1, "input_ids", "batch size 1 is supported: shape (1, P)")
    require(input_ids.shape[1] >= 1, "prompt", "the prompt is empty")
    check_tree_support(target, sampling)
    device = target.device
    input_ids = input_ids.to(device)
    stop_ids = set(int(t) for t in stop_token_ids)
    layer_ids = proposer.target_layer_ids
    proposer.reset()

    cache, pending_features, result, committed = prefill(target, input_ids, layer_ids, sampling, generator)
    done = result.output_ids[0] in stop_ids or max_new_tokens == 1
    start = time.perf_counter()
    while not done:
        anchor_pos = committed.shape[1] - 1
        num_drafts = min(block_size - 1, max_new_tokens - len(result.output_ids) - 1)
        if num_drafts > 0:
            draft_logits = proposer.propose(committed, pending_features, block_size, num_drafts)
            tree = build_tree(draft_logits, tree_budget, min_score=draft_threshold)
            pending_features = None
        else:
            tree = TokenTree.empty(device)
        verify_ids = torch.cat([committed[:, -1], tree.tokens]).unsqueeze(0)
        mask = tree_attention_mask(tree, anchor_pos, target.dtype, device)
        positions = tree_position_ids(tree, anchor_pos, device)
        out = target.forward(verify_ids, positions, cache, layer_ids, attention_mask=mask)
        path, next_token = accepted_path(tree, out.logits[0], sampling, generator)

        # cache positions: the anchor at anchor_pos, node i at anchor_pos + 1 + i
        keep_cache_positions(cache, anchor_pos + 1, [anchor_pos + 1 + node for node in path])
        if layer_ids is not None:
            kept = out.features[:, [0] + [1 + node for node in path]]
            pending_features = kept if pending_features is None else torch.cat([pending_features, kept], dim=1)

        emitted = tree.tokens[path].tolist() + [next_token]
        result.draft_counts.append(tree.tokens.numel())
        committed, done = commit(result, committed, emitted, stop_ids, max_new_tokens)
    synchronize(device)
    result.decode_time_s = time.perf_counter() - start
    return result
