"""The DFlash drafter: config, model, mask token, save/load.

The names below are imported on first use (PEP 562): the config schemas of its modules
(`dflash.schema`) are read without importing torch."""

import importlib

_EXPORTS = {
    "dflash.drafter.config": ["DrafterConfig", "default_target_layer_ids"],
    "dflash.drafter.io": ["init_drafter_from", "load_drafter", "load_drafter_config", "place_drafter", "save_drafter"],
    "dflash.drafter.mask_token": ["resolve_mask_token_id"],
    "dflash.drafter.model": ["DFlashDrafter", "DrafterCache"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'dflash.drafter' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
