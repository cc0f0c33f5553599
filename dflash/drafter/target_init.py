"""Start a new drafter from the target's own weights (`drafter.init_from_target=true`).

A drafter trained from random weights spends its first steps learning what the target
already knows: how a decoder layer of this width mixes tokens, and where the final
norm puts the logits. Started from the target instead:
- drafter layer i <- target layer L - n + i (the top n layers of an L-layer target, in
  order): attention projections, MLP and both norms; Qwen3-style q_norm/k_norm when the
  target has them (a Llama target has none: they stay at ones);
- `fc` passes the last tap through (identity on its slice, zeros elsewhere), so the
  fused context starts as the deepest tapped state;
- `hidden_norm` <- the input norm of the first copied layer, so the context's keys and
  values start as that layer computes them in the target;
- `norm` <- the target's final norm.

Invariant: only the initial values change; the network, its config and its exported
files are those of a randomly initialised drafter, so serving engines read it unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash.drafter.model import DFlashDrafter
from dflash.errors import ConfigError
from dflash.target.model import TargetModel, find_decoder_layers, module_at

KEY = "init_from_target"  # the field of DrafterSpec

# Modules copied per layer, named alike in the drafter and the target; the q/k norms are optional.
_LAYER_WEIGHTS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
)
_OPTIONAL = ("self_attn.q_norm", "self_attn.k_norm")
# Families whose norms compute (1 + weight) or that put extra norms around each block:
# their weights do not mean the same in the drafter's Qwen3-style layer.
_UNSUPPORTED_FAMILIES = ("gemma", "olmo2", "cohere")


def _copy(ours: nn.Module, theirs: nn.Module, what: str) -> None:
    for name, param in ours.named_parameters(recurse=False):
        source = getattr(theirs, name, None)
        if source is None:
            raise ConfigError(KEY, f"the target's {what} has no {name!r}; this target cannot start a drafter")
        if tuple(source.shape) != tuple(param.shape):
            raise ConfigError(
                KEY,
                f"the target's {what}.{name} has shape {tuple(source.shape)}, the drafter's {tuple(param.shape)}; "
                "set drafter.intermediate_size=null (the target's) or drafter.init_from_target=false",
            )
        with torch.no_grad():
            param.copy_(source.detach().to(param.dtype))


def final_norm(target: TargetModel) -> nn.Module:
    """The target's final norm: the sibling `norm` (or `final_layernorm`) of its layer list."""
    layers = find_decoder_layers(target.model)
    for parent in target.model.modules():
        if any(child is layers for child in parent.children()):
            for name in ("norm", "final_layernorm", "ln_f"):
                norm = getattr(parent, name, None)
                if isinstance(norm, nn.Module) and hasattr(norm, "weight"):
                    return norm
    raise ConfigError(KEY, f"cannot find the final norm of {type(target.model).__name__}")


def init_from_target(drafter: DFlashDrafter, target: TargetModel) -> None:
    """Copy the target's top layers, input norm and final norm into `drafter` (in place)."""
    family = str(getattr(target.config, "model_type", ""))
    if family.startswith(_UNSUPPORTED_FAMILIES):
        raise ConfigError(KEY, f"{family} targets are not supported (their norms differ from the drafter's); set it to false")
    layers = find_decoder_layers(target.model)
    num_layers = len(drafter.layers)
    if num_layers > len(layers):
        raise ConfigError(KEY, f"the drafter has {num_layers} layers, the target only {len(layers)}")
    sources = layers[len(layers) - num_layers :]
    for i, (ours, theirs) in enumerate(zip(drafter.layers, sources)):
        where = f"layer {len(layers) - num_layers + i}"
        for name in _LAYER_WEIGHTS:
            source = module_at(theirs, name)
            if source is None:
                raise ConfigError(KEY, f"the target's {where} has no {name}; this target cannot start a drafter")
            _copy(module_at(ours, name), source, f"{where} {name}")
        for name in _OPTIONAL:
            source = module_at(theirs, name)
            if source is not None:
                _copy(module_at(ours, name), source, f"{where} {name}")
    _copy(drafter.hidden_norm, sources[0].input_layernorm, f"layer {len(layers) - num_layers} input_layernorm")
    _copy(drafter.norm, final_norm(target), "final norm")
    if drafter.fc is not None:
        width = drafter.config.hidden_size
        with torch.no_grad():
            drafter.fc.weight.zero_()
            drafter.fc.weight[:, -width:] = torch.eye(width, dtype=drafter.fc.weight.dtype)
