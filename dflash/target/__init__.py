"""The frozen target model and its helpers.

The names below are imported on first use (PEP 562): the config schemas of its modules
(`dflash.schema`) are read without importing torch."""

from dflash import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "dflash.target.cache": ["cache_length", "crop_cache"],
        "dflash.target.model": ["TargetModel", "TargetOutput", "extract_features"],
    },
)
