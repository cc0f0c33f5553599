"""Typed specs for the target and the drafter, and the functions that build them.

Entry points turn Hydra config groups `target` and `drafter` into these dataclasses
(their schemas: dflash/schema.py, which rejects unknown keys and wrong types) and call
`load_target` / `build_drafter`; library code never reads Hydra objects. The builders import
torch and the models inside them: the specs are config schemas, read before torch loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dflash.drafter.config import check_attn_implementation
from dflash.errors import ConfigError, check_writable_dir, require
from dflash.structured import config_key
from dflash.target.engines import ENGINES

if TYPE_CHECKING:
    from dflash.drafter import DFlashDrafter, DrafterConfig
    from dflash.target import TargetModel


@dataclass
class TargetSpec:
    """Where the target comes from."""

    path: str
    """Hub id ("Qwen/Qwen3-8B") or local HF directory."""
    dtype: str = "auto"
    attn_implementation: str | None = "sdpa"
    device: str = "cpu"
    build: dict | None = None
    """For offline tiny targets: {"arch": "qwen3"|"llama", "seed": int, ...}; the target is
    built and saved at `path` when that directory does not exist yet."""
    gguf_file: str | None = None
    """A GGUF file (a path, or `pkg:<distribution>:<file>` for one shipped in an installed
    package) converted once into an HF directory at `path`, and again only when the file
    changes (`dflash.target.gguf`)."""
    engine: str = "auto"
    """The forward that decodes: "auto" (the fast engine, `dflash.engine.forward`, where it can run the
    family on a CPU; else the HF forward), "fast" (also on CUDA), "graphs" (the fast engine with its
    decode steps replayed as CUDA graphs, `dflash.engine.graphs`; on a CPU it runs "fast") or "eager"
    (the HF forward with a DynamicCache). A target the fast engine cannot run falls back to the HF
    forward with one log line."""

    def __post_init__(self):
        require(self.engine in ENGINES, "engine", f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        require(
            self.build is None or self.gguf_file is None,
            "gguf_file",
            "a target is either built here (target.build) or converted from a GGUF file (target.gguf_file), not both",
        )
        if self.gguf_file is not None:  # a missing file or package fails now, before anything loads
            from dflash.target.gguf import locate_gguf

            locate_gguf(self.gguf_file)


@dataclass
class DrafterSpec:
    """Which drafter to use."""

    path: str | None = None
    """A drafter directory; None builds a new randomly initialised drafter from the fields
    below (for training, tests and the random-drafter floor)."""
    init_from: str | None = None
    """A drafter directory (ours or a published one) whose weights start the new drafter
    built from the fields below; its shape must match them."""
    num_layers: int = 5
    block_size: int = 16
    """Training block size of a new drafter (a loaded drafter keeps its own)."""
    target_layer_ids: list[int] | None = None
    """Explicit taps; None = the default rule with `num_target_features` taps."""
    num_target_features: int | None = None
    """Taps of the default rule; None = as many taps as drafter layers."""
    intermediate_size: int | None = None
    """The drafter's MLP width (None: the target's)."""
    mask_token: str | None = None
    """Token string to use as <mask> (None: the tokenizer's, else "<|MASK|>")."""
    attn_implementation: str = "sdpa"
    """"sdpa", "flex_attention" or "flash_attention_2"."""
    dtype: str = "float32"
    """The drafter's weights ("auto": the target's)."""
    seed: int | None = None
    """Initialisation of a new drafter (None: 0; `python -m dflash.train` passes the run's
    `seed`, so a seed sweep trains different drafters)."""
    use_target_features: bool = True
    """False builds a standalone block-diffusion drafter whose context is the prefix's token
    embeddings (the target-context ablation); taps are ignored."""
    init_from_target: bool = False
    """Start a new drafter from the target's top layers and final norm
    (`dflash.drafter.target_init`) instead of random weights."""
    attention_window: int | None = None
    """A new drafter's sliding window, llama.cpp's rule in every layer: a query at position p1 does
    not see a key at p0 when p1 - p0 >= attention_window (slot k of the block at anchor a is at
    a + k; context and block keys alike); None: no window. A loaded drafter keeps its own."""
    block_causal: bool = False
    """A new drafter's block is causal: slot k sees slots 0..k (and the context); False: every slot
    sees the whole block. A loaded drafter keeps its own."""
    draft_vocab: bool = True
    """Draft over the directory's draft vocabulary (draft_vocab.json: the tokens its training
    scored, `training.draft_vocab_size`) where it has one: the head reads those rows only.
    False drafts over the whole vocabulary. Drafts only propose: the output is the same."""

    def __post_init__(self):
        # now, not after the target has loaded
        check_attn_implementation(self.attn_implementation)
        window = self.attention_window
        require(window is None or window >= 1, "attention_window", f"must be >= 1 (or null: no window), got {window}")
        require(
            not self.init_from_target or (self.path is None and self.init_from is None),
            "init_from_target",
            "starts a new drafter from the target's weights; it cannot be combined with drafter.path or drafter.init_from",
        )


@config_key("target")  # the builder of the group adds its name to the fields its checks name
def load_target(spec: TargetSpec) -> TargetModel:
    """Load the frozen target (building or converting it first for offline targets)."""
    import torch

    from dflash.target import TargetModel

    if spec.build is not None:
        build_offline_target(spec.path, dict(spec.build))
    if spec.gguf_file is not None:
        from dflash.target.gguf import convert_gguf

        check_writable_dir("path", os.path.dirname(os.path.abspath(os.path.expanduser(spec.path))))
        convert_gguf(spec.gguf_file, spec.path)
    if spec.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", f"{spec.device!r} requested but CUDA is not available; use target.device=cpu")
    return TargetModel.load(
        spec.path, dtype=spec.dtype, attn_implementation=spec.attn_implementation, device=spec.device, engine=spec.engine
    )


def build_offline_target(path: str, build: dict) -> None:
    """Create the offline target at `path` if it is missing (or, for tiny_code, stale).

    build["kind"]: "random" (default; random tiny Qwen3/Llama, see `dflash.toy.tiny`)
    or "tiny_code" (a small code LM pre-trained here on the Python standard library,
    rebuilt only when its build config changes; see `dflash.toy.tiny_code`).
    """
    kind = build.pop("kind", "random")
    with config_key("build"):
        require(kind in ("random", "tiny_code"), "kind", f"unknown kind {kind!r}; choose random or tiny_code")
    if kind == "tiny_code":
        from dflash.toy.tiny_code import build_tiny_code_target

        with config_key("build"):
            build_tiny_code_target(path, build)
    elif not os.path.isdir(path):
        _build_random_target_atomically(path, build)


def _build_random_target_atomically(path: str, build: dict) -> None:
    """Build into a temp dir and rename it into place: concurrent jobs of a sweep may
    race to build the same target, and a killed build must not look finished."""
    import shutil
    import tempfile

    from dflash.toy.tiny import save_tiny_target

    parent = os.path.dirname(os.path.abspath(path))
    check_writable_dir("path", parent)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".building-")
    try:
        with config_key("build"):
            save_tiny_target(tmp, arch=build.pop("arch", "qwen3"), seed=build.pop("seed", 0), **build)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.isdir(path):  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@config_key("drafter")
def build_drafter(spec: DrafterSpec, target: TargetModel) -> DFlashDrafter:
    """Load the drafter at `spec.path`, or build a random one; check it fits `target`."""
    import torch

    from dflash.drafter import DFlashDrafter, DrafterConfig, init_drafter_from, load_drafter, place_drafter, resolve_mask_token_id
    from dflash.target.model import resolve_dtype

    dtype = resolve_dtype(spec.dtype)
    dtype = target.dtype if dtype == "auto" else dtype
    require(
        spec.path is None or spec.init_from is None,
        "init_from",
        "set drafter.path (use a drafter as it is) or drafter.init_from (train a new drafter from its weights), not both",
    )
    if spec.path is not None:
        drafter = load_drafter(spec.path, device=target.device, dtype=dtype, attn_implementation=spec.attn_implementation)
        if not spec.draft_vocab:
            drafter.draft_vocab = None
        check_drafter_fits(drafter.config, target)
        rows = target.embedding_rows
        fits = drafter.draft_vocab is None or int(drafter.draft_vocab[-1]) < rows
        require(fits, "path", f"the drafter's draft_vocab.json names token ids beyond the target's {rows}-token vocabulary")
        if target.tokenizer is not None and target.tokenizer.mask_token is None:
            mask = target.tokenizer.convert_ids_to_tokens(drafter.config.mask_token_id)
            target.tokenizer.add_special_tokens({"mask_token": mask})
        return drafter
    mask_token_id = resolve_mask_token_id(target.tokenizer, target.embedding_rows, spec.mask_token)
    config = DrafterConfig.from_target(
        target.config,
        num_layers=spec.num_layers,
        block_size=spec.block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=spec.target_layer_ids,
        num_target_features=spec.num_target_features,
        intermediate_size=spec.intermediate_size,
        attn_implementation=spec.attn_implementation,
        use_target_features=spec.use_target_features,
        attention_window=spec.attention_window,
        block_causal=spec.block_causal,
    )
    config.mask_token = target.tokenizer.convert_ids_to_tokens(mask_token_id)
    torch.manual_seed(0 if spec.seed is None else spec.seed)  # training passes the run's seed (cli/train.py)
    drafter = DFlashDrafter(config)
    if spec.init_from is not None:
        init_drafter_from(drafter, spec.init_from)
    if spec.init_from_target:
        from dflash.drafter.target_init import init_from_target

        init_from_target(drafter, target)
    return place_drafter(drafter, target.device, dtype)


def check_drafter_fits(config: DrafterConfig, target: TargetModel) -> None:
    """ConfigError unless the drafter's width, taps and mask token fit the target."""
    require(
        config.hidden_size == target.hidden_size,
        "path",
        f"drafter hidden size {config.hidden_size} does not match the target's {target.hidden_size}; "
        "this drafter was trained for another target",
    )
    bad = [i for i in config.target_layer_ids if not 0 <= i < target.num_layers]
    require(
        not bad,
        "target_layer_ids",
        f"drafter taps layers {bad}, but the target has {target.num_layers} layers (0..{target.num_layers - 1})",
    )
    require(
        config.mask_token_id < target.embedding_rows,
        "mask_token",
        f"mask token id {config.mask_token_id} has no row in the target's {target.embedding_rows}-row embedding",
    )
