"""The EAGLE-3 drafter: one Llama decoder layer over [token embedding ; fused target features].

Invariants (EAGLE-3, Li et al. 2025; layout of SGLang's and vLLM's llama_eagle3.py):
- Input at position t is the pair (embedding of token t+1, hidden h_t) and its output
  predicts token t+2. For real context h_t = fc(concat of the three tapped target
  layers at t); at chain step j > 0, h_t is the drafter's own pre-norm output of the
  previous step, and the pair sits at rope position t + j.
- The layer's attention reads 2H inputs: concat(input_layernorm(embedding),
  hidden_norm(h)); the residual stream starts at h (not normed). Logits come from
  `lm_head(norm(output))` over the draft vocabulary; draft id d is target id d + d2t[d].
- The embedding is the target's (frozen, `TargetModel.embed`); `lm_head` is the
  drafter's own (EAGLE-3 trains it), initialised from the target's head rows.
- Parameter and buffer names are the EAGLE-3 checkpoint names (`fc.weight`,
  `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`).
"""

from __future__ import annotations

import torch
from torch import nn

from dflash.drafter.attention import attend
from dflash.drafter.model import DrafterCache, DrafterMLP, RMSNorm
from dflash.eagle3.config import Eagle3Config
from dflash.engine import apply_rope


class Eagle3Attention(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        width = 2 * config.hidden_size
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x: (b, q, 2H) -> q (b, heads, q, d), k and v (b, kv_heads, q, d), rope applied."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def out(self, attn: torch.Tensor) -> torch.Tensor:
        """attn: (b, heads, q, d) -> (b, q, H)."""
        b, _, n, _ = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class Eagle3Layer(nn.Module):
    """The midlayer, split around attention so that decoding (KV cache) and training
    (training-time test) supply their own attention pattern."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Eagle3Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DrafterMLP(config)  # the same SwiGLU MLP as DFlash layers: gate/up/down_proj

    def qkv(self, embeds, hidden, cos, sin):
        """embeds, hidden: (b, q, H) -> attention inputs of concat(normed embeds, normed hidden)."""
        return self.self_attn.qkv(torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1), cos, sin)

    def finish(self, attn: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """attn (b, heads, q, d), residual `hidden` (b, q, H) -> pre-norm output (b, q, H)."""
        hidden = hidden + self.self_attn.out(attn)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Drafter(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.config = config
        self.fc = nn.Linear(len(config.target_layer_ids) * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.arange(config.vocab_size) < config.draft_vocab_size)
        self.rotary_emb = LlamaRotaryEmbedding(config.rope_hf_config())
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def set_draft_vocab(self, draft_to_target: torch.Tensor) -> None:
        """Choose the draft vocabulary: `draft_to_target` (draft_vocab_size,) ascending target ids."""
        ids = draft_to_target.to(self.d2t.device, torch.long)
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def draft_to_target(self) -> torch.Tensor:
        """(draft_vocab_size,) target id of each draft id."""
        return self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)

    def rope(self, hidden: torch.Tensor, positions: torch.Tensor):
        """(cos, sin), each (b, q, head_dim), for positions (b, q)."""
        return self.rotary_emb(hidden, positions)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pre-norm outputs (..., H) -> float logits over the draft vocabulary (..., draft_vocab)."""
        return self.lm_head(self.norm(hidden)).float()

    def target_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pre-norm outputs (n, H) -> (n, vocab) float logits, -inf outside the draft vocabulary."""
        logits = self.draft_logits(hidden)
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., self.draft_to_target] = logits
        return full

    def forward_cached(self, embeds, hidden, positions, cache: DrafterCache) -> torch.Tensor:
        """Decoding: new pairs attend to the cached ones and causally to each other.

        Args:
            embeds: (1, q, H) embeddings of tokens t+1; hidden: (1, q, H) h_t (fused
                features or the drafter's own previous output); positions: (1, q).
            cache: the drafter's keys/values of earlier pairs; the new ones are appended.
        Returns:
            (1, q, H) pre-norm outputs.
        """
        q, k, v = self.midlayer.qkv(embeds, hidden, *self.rope(hidden, positions))
        past = cache.length
        k, v = cache.append(0, k, v)
        new = q.shape[2]
        mask = torch.arange(past + new, device=q.device) <= past + torch.arange(new, device=q.device).unsqueeze(1)
        return self.midlayer.finish(attend(q, k, v, mask), hidden)
