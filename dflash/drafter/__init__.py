"""The DFlash drafter: config, model, mask token, save/load.

The names below are imported on first use (PEP 562): the config schemas of its modules
(`dflash.schema`) are read without importing torch."""

from dflash import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "dflash.drafter.config": ["DrafterConfig", "default_target_layer_ids"],
        "dflash.drafter.io": ["init_drafter_from", "load_drafter", "load_drafter_config", "place_drafter", "save_drafter"],
        "dflash.drafter.mask_token": ["resolve_mask_token_id"],
        "dflash.drafter.model": ["DFlashDrafter", "DrafterCache"],
    },
)
