"""Tree verification: one target forward checks a tree of draft candidates (batch size 1).

Per step: the drafter drafts a block [anchor, mask x (B-1)] once; `build_tree` turns its
per-slot distributions into a tree of `budget` nodes (token_tree.py states the
rule); the target runs once over [anchor, nodes] with a tree attention mask (each node
sees the committed context, its ancestors and itself) at positions anchor + depth. The
walk from the anchor follows the child equal to the target's own token at each node and
stops at the first node with no such child: the path's tokens are accepted and the
target's token there is emitted too. Behind prompt lookup (`LookupFirst`), a step that
finds the context repeated verifies the looked-up chain as a tree of one branch.

Lossless: every emitted token is the target's own choice (argmax, or with
`verify_rule="match"` its own sample) given the tokens before it; the tree only decides
how many of them one forward yields. Sampling with the "rejection" rule is refused: the
tree's candidates are the drafter's top tokens, not samples from it.

Cache: after the verify forward the cache holds the anchor and all N nodes;
`keep_cache_positions` moves the accepted path's entries right behind the anchor and
drops the rest, and the drafter receives the anchor's and the path's features, in path
order. The loop, its other invariants and its record live in `dflash.decoding.loop`.
"""

from __future__ import annotations

import torch

from dflash.decoding.loop import target_token
from dflash.decoding.ngram import LookupFirst
from dflash.decoding.proposer import BlockProposer
from dflash.decoding.sampling import SamplingConfig
from dflash.decoding.token_tree import (
    ROOT,
    TokenTree,
    build_tree,
    chain_tree,
    tree_attention_mask,
    tree_depths,
    tree_position_ids,
)
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
        f"tree verification needs a custom attention mask, which {implementation!r} ignores; use one of {TREE_ATTENTION}",
    )
    layer_types = getattr(target.config, "layer_types", None) or ()
    windowed = getattr(target.config, "sliding_window", None) and (not layer_types or "sliding_attention" in layer_types)
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


def accepted_path(tree: TokenTree, target_logits: torch.Tensor, sampling: SamplingConfig, generator) -> tuple[list[int], int]:
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


class TreeVerifier:
    """A best-first token tree of `budget` draft nodes (the target verifies budget + 1 tokens
    per step) from one block of a `BlockProposer`, at most B - 1 deep; accepts the walk along
    the target's own tokens (`accepted_path`). Nodes whose path score (product of slot
    probabilities) is below `draft_threshold` are left out; 0 keeps the full budget."""

    name = "tree"

    def __init__(self, budget: int, draft_threshold: float = 0.0):
        self.budget = budget
        self.draft_threshold = draft_threshold

    @staticmethod
    def check(target: TargetModel, sampling: SamplingConfig) -> None:
        check_tree_support(target, sampling)

    def draft(self, proposer: BlockProposer, committed_ids, new_features, block_size, num_drafts, sampling, generator) -> TokenTree:
        """The tree over the block's per-slot logits (num_drafts, V); behind prompt lookup
        (`LookupFirst`), a lookup step's tokens as a tree of one branch, verified as a chain is."""
        if isinstance(proposer, LookupFirst):
            looked_up = proposer.lookup(committed_ids, new_features, block_size, num_drafts)
            if looked_up is not None:
                return chain_tree(looked_up)
            new_features, block_size, num_drafts = proposer.inner_request(new_features, block_size, num_drafts)
            proposer = proposer.inner
        draft_logits = proposer.propose(committed_ids, new_features, block_size, num_drafts)
        return build_tree(draft_logits, self.budget, min_score=self.draft_threshold)

    @staticmethod
    def rebuild(draft_tokens: torch.Tensor, parents: list[int]) -> TokenTree:
        return TokenTree(draft_tokens, list(parents), tree_depths(parents))

    @staticmethod
    def layout(tree: TokenTree, anchor_position: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions anchor_position + depth (1, N + 1) and the tree's boolean mask (`tree_attention_mask`)."""
        return tree_position_ids(tree, anchor_position, device), tree_attention_mask(tree, anchor_position, device)

    @staticmethod
    def accept(tree: TokenTree, target_logits: torch.Tensor, sampling, generator) -> tuple[list[int], int]:
        """The anchor's row and the path's rows (node i is row i + 1), and the target's token after the path."""
        path, next_token = accepted_path(tree, target_logits, sampling, generator)
        return [0] + [1 + node for node in path], next_token

    @staticmethod
    def compact(cache, anchor_position: int, kept_rows: list[int]) -> None:
        """Row r sits at cache position anchor_position + r; the path's entries move behind the anchor."""
        keep_cache_positions(cache, anchor_position + 1, [anchor_position + row for row in kept_rows[1:]])
