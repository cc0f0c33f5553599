"""dflash: train and evaluate DFlash block-diffusion drafters for speculative decoding."""

from pathlib import Path

__version__ = "0.1.0"

#: The Hydra configs, shipped inside the package (groups, experiment/, sweep/).
CONF_DIR = Path(__file__).resolve().parent / "conf"


def lazy_exports(package: str, exports: dict[str, list[str]]):
    """(`__all__`, `__getattr__`) of a package whose names, `{module: [name, ...]}`, are imported
    on first use (PEP 562), so its light modules (config schemas) are read without torch."""
    import importlib

    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str):
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module_of[name]), name)

    return sorted(module_of), __getattr__
