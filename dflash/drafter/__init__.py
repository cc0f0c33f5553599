"""The DFlash drafter: config, model, mask token, save/load."""

from dflash.drafter.config import DrafterConfig, default_target_layer_ids
from dflash.drafter.io import init_drafter_from, load_drafter, load_drafter_config, place_drafter, save_drafter
from dflash.drafter.mask_token import resolve_mask_token_id
from dflash.drafter.model import DFlashDrafter, DrafterCache

__all__ = [
    "DFlashDrafter",
    "DrafterCache",
    "DrafterConfig",
    "default_target_layer_ids",
    "init_drafter_from",
    "load_drafter",
    "load_drafter_config",
    "place_drafter",
    "resolve_mask_token_id",
    "save_drafter",
]
