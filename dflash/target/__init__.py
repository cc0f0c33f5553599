"""The frozen target model and its helpers.

The names below are imported on first use (PEP 562): the config schemas of its modules
(`dflash.schema`) are read without importing torch."""

import importlib

_EXPORTS = {
    "dflash.target.cache": ["cache_length", "crop_cache"],
    "dflash.target.model": ["TargetModel", "TargetOutput", "extract_features"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'dflash.target' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
