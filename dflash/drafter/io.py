"""Save and load drafters as HF-style directories (config.json + model.safetensors + dflash.py).

The layout is the one public DFlash drafters use, so the reference, SGLang, vLLM and
speculators read ours and we read theirs: config.json is a Qwen3 config with
`architectures: ["DFlashDraftModel"]`, `auto_map: {"AutoModel": "dflash.DFlashDraftModel"}`,
`block_size`, `num_target_layers`, rope keys for transformers 4 and 5, and
`dflash_config: {target_layer_ids, mask_token_id, mask_token, block_size}`
(`DrafterConfig.to_hf_dict`); weights are named `layers.{i}.self_attn.{q,k,v,o}_proj`,
`...{q,k}_norm`, `layers.{i}.mlp.*`, `fc`, `hidden_norm`, `norm`. No embedding and no
LM head: those are the target's. dflash.py is `dflash.drafter.hf_modeling`, the code
`AutoModel.from_pretrained(dir, trust_remote_code=True)` runs.

A DSpark drafter (`DrafterConfig.markov_rank` > 0) is the same directory with
`architectures: ["DSparkDraftModel"]`, its heads' keys and tensors
(`dflash.drafter.heads`) and no `auto_map` (dflash.py has no heads); llama.cpp serves it.
A DFlash2 drafter (`DrafterConfig.selector_rank` > 0) likewise: `architectures:
["DFlash2DraftModel"]`, the four DFlash2 keys in `dflash_config`, its convolutions' and selector's
tensors, no `auto_map`.

A drafter trained over a draft vocabulary (`training.draft_vocab_size`) also keeps it in
draft_vocab.json (`{"token_ids": [...]}`, ascending), which our decoding drafts over
(`DFlashDrafter.draft_vocab`); other readers ignore the file and draft over the whole
vocabulary.
"""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from dflash.drafter.config import DrafterConfig
from dflash.drafter.config_json import DFLASH2_KEYS
from dflash.drafter.model import DFlashDrafter
from dflash.errors import ConfigError, reading, require
from dflash.fileio import atomic_write, write_json
from dflash.layout import DRAFT_VOCAB_FILE, DRAFTER_CONFIG, DRAFTER_MODULE, DRAFTER_WEIGHTS

_HEADS = ("markov_head.", "confidence_head.")  # DSpark's optional heads (`dflash.drafter.heads`)


def _optional_part(name: str) -> bool:
    """Whether weight `name` belongs to DSpark's heads or DFlash2's convolutions and selector."""
    return name.startswith((*_HEADS, "candidate_selector.")) or ".attention_conv." in name or ".mlp_conv." in name


_FIX = "point drafter.path at a directory that save_drafter or python -m dflash.export wrote"
_MODELING_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_modeling.py")

# Fields a directory must share with the configured drafter for `init_drafter_from`, and
# the config key that changes each one (None: fixed by the target).
_INIT_FIELDS = {
    "hidden_size": None,
    "num_attention_heads": None,
    "num_key_value_heads": None,
    "head_dim": None,
    "attention_bias": None,
    "num_target_layers": None,
    "num_hidden_layers": "drafter.num_layers",
    "intermediate_size": "drafter.intermediate_size",
    "target_layer_ids": "drafter.target_layer_ids",
    "use_target_features": "drafter.use_target_features",
    "mask_token_id": "drafter.mask_token",
}


def save_drafter(drafter: DFlashDrafter, directory: str, dtype: torch.dtype | None = None) -> None:
    """Write `config.json`, `model.safetensors`, `dflash.py` and, when the drafter has one, its
    draft vocabulary (`draft_vocab.json`) into `directory` (created if needed).

    Files are written to temporary names and renamed, so a killed job never leaves a
    half-written drafter behind.
    """
    os.makedirs(directory, exist_ok=True)
    state = {name: tensor.detach().to(dtype or tensor.dtype).contiguous().cpu() for name, tensor in drafter.state_dict().items()}
    config = drafter.config.to_hf_dict()
    config["dtype"] = str(dtype or next(drafter.parameters()).dtype).removeprefix("torch.")
    atomic_write(os.path.join(directory, DRAFTER_WEIGHTS), lambda path: save_file(state, path, metadata={"format": "pt"}))
    atomic_write(os.path.join(directory, DRAFTER_MODULE), lambda path: shutil.copyfile(_MODELING_SOURCE, path))
    vocab_path = os.path.join(directory, DRAFT_VOCAB_FILE)
    if drafter.draft_vocab is not None:
        write_json(vocab_path, {"token_ids": drafter.draft_vocab.tolist()})
    elif os.path.exists(vocab_path):  # an earlier drafter's, in the same directory
        os.remove(vocab_path)
    write_json(os.path.join(directory, DRAFTER_CONFIG), config, indent=2, sort_keys=True)


def load_drafter_config(directory: str, attn_implementation: str = "sdpa") -> DrafterConfig:
    """Read a drafter directory's config.json; ConfigError (drafter.path) when it is missing or damaged."""
    require(os.path.isdir(directory), "path", f"directory {directory!r} does not exist")
    path = os.path.join(directory, DRAFTER_CONFIG)
    require(os.path.isfile(path), "path", f"{directory!r} has no {DRAFTER_CONFIG}; is it a drafter directory?")
    with reading("path", path, _FIX):
        with open(path) as f:
            data = json.load(f)
    require(isinstance(data, dict), "path", f"{path!r} is not a drafter config (no JSON object); {_FIX}")
    return DrafterConfig.from_hf_dict(data, attn_implementation=attn_implementation)


def check_drafter_dir(directory: str, attn_implementation: str = "sdpa") -> DrafterConfig:
    """The config of the drafter directory, after checking that its weights file is readable
    and holds exactly the tensors, of the shapes, that the config needs. Reads only the
    weights' header (cheap: meant for checking inputs before any model loads)."""
    config = load_drafter_config(directory, attn_implementation)
    path = os.path.join(directory, DRAFTER_WEIGHTS)
    require(os.path.isfile(path), "path", f"{directory!r} has no {DRAFTER_WEIGHTS}")
    with reading("path", path, _FIX, errors=(OSError, SafetensorError)):
        with safe_open(path, "pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    with torch.device("meta"):
        needed = {name: tuple(tensor.shape) for name, tensor in DFlashDrafter(config).state_dict().items()}
    common = sorted(needed.keys() & shapes.keys())
    problems = [f"{name} is {shapes[name]}, not {needed[name]}" for name in common if shapes[name] != needed[name]][:2]
    if needed.keys() - shapes.keys():
        problems.append(f"missing {sorted(needed.keys() - shapes.keys())[:3]}")
    if shapes.keys() - needed.keys():
        problems.append(f"unexpected {sorted(shapes.keys() - needed.keys())[:3]}")
    mismatch = f"{DRAFTER_WEIGHTS} does not match {DRAFTER_CONFIG} in {directory!r}: {'; '.join(problems)}; {_FIX}"
    require(not problems, "path", mismatch)
    return config


def load_drafter(
    directory: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    attn_implementation: str = "sdpa",
) -> DFlashDrafter:
    """Load a drafter directory written by `save_drafter` (or a public DFlash drafter)."""
    drafter = DFlashDrafter(check_drafter_dir(directory, attn_implementation))
    path = os.path.join(directory, DRAFTER_WEIGHTS)
    with reading("path", path, _FIX, errors=(OSError, SafetensorError)):
        state = load_file(path)
    drafter.load_state_dict(state, strict=True)
    drafter.draft_vocab = load_draft_vocab(directory, drafter.config.vocab_size)
    return place_drafter(drafter, device, dtype or next(iter(state.values())).dtype).eval()


def load_draft_vocab(directory: str, vocab_size: int) -> torch.Tensor | None:
    """The directory's draft vocabulary (`draft_vocab.json`) as (K,) long ids, or None without
    one; ConfigError (drafter.path) unless it holds distinct ascending ids below `vocab_size`."""
    path = os.path.join(directory, DRAFT_VOCAB_FILE)
    if not os.path.isfile(path):
        return None
    with reading("path", path, _FIX):
        with open(path) as f:
            data = json.load(f)
    ids = data.get("token_ids") if isinstance(data, dict) else None
    valid = isinstance(ids, list) and len(ids) > 0 and all(type(i) is int for i in ids)
    valid = valid and 0 <= ids[0] and ids[-1] < vocab_size and all(a < b for a, b in zip(ids, ids[1:]))
    require(valid, "path", f'{path!r} must hold {{"token_ids": [distinct ascending ids below {vocab_size}]}}; {_FIX}')
    return torch.tensor(ids, dtype=torch.long)


def place_drafter(drafter: DFlashDrafter, device: str | torch.device, dtype: torch.dtype) -> DFlashDrafter:
    """Move `drafter` to `device` and cast its weights to `dtype`, keeping the rotary
    frequencies in float32 (as HF models loaded in bf16 do): `drafter.to(torch.bfloat16)`
    would round them too, and a bf16 `inv_freq` puts cos off by up to 0.4 at position 4000."""
    drafter.to(device=device)
    for parameter in drafter.parameters():
        parameter.data = parameter.data.to(dtype)
    return drafter


def init_drafter_from(drafter: DFlashDrafter, directory: str) -> None:
    """Copy the weights of the drafter directory `directory` (ours or a published one)
    into `drafter`, the drafter configured for this run (`drafter.init_from`).

    The directory must hold the same network for the same target: width, heads, depth,
    taps and mask token id equal; a mismatch is a ConfigError naming the key to change.
    The block size may differ: it does not shape the weights. DSpark's heads are copied where
    both have them (of the same rank); a head only one side has is left as it is (a DFlash
    drafter starts a DSpark drafter's layers, its new heads stay new). DFlash2's convolutions and
    selector likewise, where both have them with the same four settings.
    """
    try:
        source = load_drafter(directory)
    except ConfigError as err:
        raise ConfigError("init_from", str(err).removeprefix(f"{err.key}: ")) from None
    for name, key in _INIT_FIELDS.items():
        theirs, ours = getattr(source.config, name), getattr(drafter.config, name)
        if theirs != ours:
            wanted = source.config.mask_token if name == "mask_token_id" and source.config.mask_token else theirs
            fix = f"set {key}={wanted}" if key else "it was trained for another target"
            raise ConfigError("init_from", f"{name} is {theirs} in {directory!r} but {ours} here; {fix}")
    theirs, ours = source.config.markov_rank, drafter.config.markov_rank
    require(
        not (theirs and ours) or theirs == ours,
        "init_from",
        f"markov_rank is {theirs} in {directory!r} but {ours} here; set method.markov_rank={theirs}",
    )
    if source.config.dflash2 and drafter.config.dflash2:
        for name in DFLASH2_KEYS:
            theirs, ours = getattr(source.config, name), getattr(drafter.config, name)
            require(theirs == ours, "init_from", f"{name} is {theirs} in {directory!r} but {ours} here; set method.{name}={theirs}")
    state = {name: tensor for name, tensor in source.state_dict().items() if name in drafter.state_dict()}
    missing = drafter.load_state_dict(state, strict=False).missing_keys
    if any(not _optional_part(name) for name in missing):  # the fields above fix every other weight
        raise RuntimeError(f"init_from left {missing[:3]} unset")
