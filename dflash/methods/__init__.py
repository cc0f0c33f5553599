"""The drafting methods, one module each: `BUILTIN` lists them, `METHODS` maps a
method's name to its `Method` (`dflash.methods.base`).

Adding a method is one new module here that defines `METHOD = Method(...)`, its entry in
`BUILTIN`, and its config group (`dflash/conf/<name>/default.yaml` for evaluation, and for
a trained method `dflash/conf/method/<name>.yaml`); nothing else names it (docs/design.md
lists what a method provides). Modules import their heavy dependencies inside
functions, so reading the registry loads no model code.
"""

from __future__ import annotations

from dflash.errors import require
from dflash.methods import dflash, dflash2, dflash_lookup, dflash_tree, dspark, eagle3, ngram
from dflash.methods.base import EvalContext, Method, MethodSetup

BUILTIN: tuple[Method, ...] = (
    dflash.METHOD,
    dflash2.METHOD,
    dflash_lookup.METHOD,
    dflash_tree.METHOD,
    dspark.METHOD,
    eagle3.METHOD,
    ngram.METHOD,
)
METHODS: dict[str, Method] = {method.name: method for method in BUILTIN}


def check_method_names(names: list[str]) -> None:
    """ConfigError unless `names` is a non-empty list of distinct, known methods."""
    require(isinstance(names, list) and len(names) > 0, "methods", f"must be a non-empty list, e.g. [dflash], got {names!r}")
    unknown = [name for name in names if name not in METHODS]
    require(not unknown, "methods", f"unknown method {unknown[0]!r}; choose from {sorted(METHODS)}" if unknown else "")
    require(len(set(names)) == len(names), "methods", f"a method is listed twice: {names}")


def build_method(name: str, target, settings=None, context: EvalContext | None = None) -> MethodSetup:
    """Method `name` ready to run on `target` (a `TargetModel`); settings None: its defaults.

    context: the DFlash drafter and decoding settings (`EvalContext`); required, with a
    drafter, by methods that draft with it."""
    check_method_names([name])
    method = METHODS[name]
    context = context or EvalContext()
    if method.uses_dflash_drafter:
        require(context.drafter is not None, "methods", f"{name} needs a drafter (drafter.path, or null for a random one)")
    return method.build(target, method.default_settings() if settings is None else settings, context)


def trained_methods() -> dict[str, Method]:
    """The methods `python -m dflash.train` can train (`method=NAME`)."""
    return {name: method for name, method in METHODS.items() if method.build_objective is not None}


def method_of_checkpoint(drafter_config: dict) -> Method | None:
    """The trained method whose drafters carry `drafter_config["architectures"]`, or None."""
    architectures = set(drafter_config.get("architectures") or [])
    for method in trained_methods().values():
        if architectures & set(method.architectures):
            return method
    return None


def label(name: str) -> str:
    """A method's name in tables and reports (the name itself for unknown ones)."""
    method = METHODS.get(name)
    return method.label if method is not None else name


def width_label(name: str, block_size: int, settings: dict) -> str:
    """How a table row names a method's verify width, e.g. "(B=16)" or "(k=7)" (unknown methods: k)."""
    method = METHODS.get(name)
    return method.width_label(block_size, settings) if method is not None else f"(k={block_size - 1})"


__all__ = [
    "BUILTIN",
    "METHODS",
    "EvalContext",
    "Method",
    "MethodSetup",
    "build_method",
    "check_method_names",
    "label",
    "method_of_checkpoint",
    "trained_methods",
    "width_label",
]
