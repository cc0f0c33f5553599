"""Benchmarks, the evaluator (DFlash vs autoregressive vs HF generate), results.json.

The names below are imported on first use (PEP 562): the config schemas of its modules
(`dflash.schema`) are read without importing torch."""

import importlib

_EXPORTS = {
    "dflash.eval.benchmarks": ["BENCHMARKS", "BenchmarkSpec", "Sample", "benchmark_source", "load_benchmark"],
    "dflash.eval.evaluator": ["evaluate"],
    "dflash.eval.settings": ["DecodingSettings", "EvalSettings"],
    "dflash.eval.prompts": ["PromptBuilder", "stop_token_ids"],
    "dflash.eval.report": ["format_results"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'dflash.eval' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
