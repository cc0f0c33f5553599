"""Draft token trees built from a DFlash block's per-slot distributions.

Tree rule (best-first by expected acceptance, the heuristic of SpecInfer, Sequoia and
DDTree, arXiv 2604.12989; our own code): a node at depth d holds one of slot d's
candidate tokens, and its score is the product of the slot probabilities along its
root path, an estimate of the chance that greedy verification accepts the whole path.
The tree is the `budget` highest-scoring paths, prefix-closed (a node's parent always
scores at least as high as the node, so it is chosen first).

The slots of one DFlash block are drafted together, from the anchor and the context
only: slot d's distribution is NOT conditioned on the token chosen at depth d-1. A
child's probability is therefore the same slot distribution whichever parent it hangs
under; the tree only spends the budget on the combinations that look likeliest.

Invariants of a `TokenTree` of N nodes:
- nodes are in best-first order, so every parent precedes its children (parent < i);
- a node's depth is its parent's + 1 (depth 1 hangs from the root, the anchor);
- siblings hold distinct tokens, so at most one child matches any target token.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch

ROOT = -1  # parent index of depth-1 nodes: the anchor, which is not a node


@dataclass
class TokenTree:
    """N draft nodes below the anchor.

    tokens: (N,) long token ids.
    parents: N parent node indices, ROOT for depth-1 nodes.
    depths: N depths >= 1 (slot index in the block).
    """

    tokens: torch.Tensor
    parents: list[int]
    depths: list[int]

    @property
    def size(self) -> int:
        return len(self.parents)

    def children(self) -> dict[int, dict[int, int]]:
        """{parent index (ROOT for the anchor): {token id: child index}}."""
        table: dict[int, dict[int, int]] = {ROOT: {}}
        for node, (parent, token) in enumerate(zip(self.parents, self.tokens.tolist())):
            table.setdefault(parent, {})[token] = node
            table[node] = {}
        return table


def build_tree(draft_logits: torch.Tensor, budget: int, min_score: float = 0.0) -> TokenTree:
    """The best-first tree of at most `budget` nodes.

    Args:
        draft_logits: (D, V) drafter logits of slots 1..D; the tree is at most D deep.
        budget: number of draft nodes, >= 1.
        min_score: confidence-adaptive drafts (`draft_threshold`): nodes whose score is
            below it are left out, except the first (so a step always drafts one token).
    Returns:
        a TokenTree whose node scores (product of slot probabilities) never increase.

    Children of one parent are candidates of one slot in rank order, so expanding a
    popped node needs only two new candidates: its first child and its next sibling.
    """
    num_slots = draft_logits.shape[0]
    width = min(budget, draft_logits.shape[1])
    top_logp, top_tokens = draft_logits.float().log_softmax(-1).topk(width, dim=-1)
    top_logp, top_token_ids = top_logp.tolist(), top_tokens.tolist()
    # heap entries: (-path log-prob, parent, depth, rank in the slot, parent's path log-prob)
    heap = [(-top_logp[0][0], ROOT, 1, 0, 0.0)]
    tokens, parents, depths = [], [], []
    min_logp = math.log(min_score) if min_score > 0 else -math.inf
    while heap and len(tokens) < budget:
        negative_score, parent, depth, rank, parent_logp = heapq.heappop(heap)
        if tokens and -negative_score < min_logp:
            break  # scores only fall from here on
        node = len(tokens)
        tokens.append(top_token_ids[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        if rank + 1 < width:
            heapq.heappush(heap, (-(parent_logp + top_logp[depth - 1][rank + 1]), parent, depth, rank + 1, parent_logp))
        if depth < num_slots:
            heapq.heappush(heap, (negative_score - top_logp[depth][0], node, depth + 1, 0, -negative_score))
    return TokenTree(torch.tensor(tokens, dtype=torch.long, device=draft_logits.device), parents, depths)


def chain_tree(tokens: torch.Tensor) -> TokenTree:
    """The tree of one branch: `tokens` (k,) in a row below the anchor (a looked-up chain)."""
    count = tokens.numel()
    return TokenTree(tokens, [ROOT] + list(range(count - 1)) if count else [], list(range(1, count + 1)))


def tree_depths(parents: list[int]) -> list[int]:
    """Node depths from parent indices (ROOT: depth 1); parents precede their children."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent == ROOT else depths[parent] + 1)
    return depths


def tree_attention_mask(tree: TokenTree, context_length: int, device) -> torch.Tensor:
    """Boolean mask (True: visible) for one target forward over [anchor, node 0, ..., node N-1].

    Every row sees the committed context [0, context_length) (the positions before the
    anchor, already in the KV cache); the anchor sees itself; node i sees the anchor, its
    ancestors and itself. Boolean, the form the engine's attention kernel reads;
    `TargetModel.forward` makes it additive for transformers' attention.

    Returns:
        (1, 1, N + 1, context_length + N + 1) bool.
    """
    size = tree.size + 1
    visible = torch.zeros(size, size, dtype=torch.bool)
    visible[:, 0] = True  # row 0 is the anchor, an ancestor of every node
    for node, parent in enumerate(tree.parents):
        row = node + 1
        visible[row] = visible[parent + 1]
        visible[row, row] = True
    return torch.cat([torch.ones(size, context_length, dtype=torch.bool), visible], dim=1).to(device)[None, None]


def tree_position_ids(tree: TokenTree, anchor_position: int, device) -> torch.Tensor:
    """(1, N + 1) positions of [anchor, nodes]: anchor_position + depth."""
    depths = torch.tensor([0] + tree.depths, dtype=torch.long, device=device)
    return (anchor_position + depths).unsqueeze(0)
