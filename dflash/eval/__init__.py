"""Benchmarks, the evaluator (DFlash vs autoregressive vs HF generate), results.json.

The names below are imported on first use (PEP 562): the config schemas of its modules
(`dflash.schema`) are read without importing torch."""

from dflash import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "dflash.eval.benchmarks": ["BENCHMARKS", "BenchmarkSpec", "Sample", "benchmark_source", "load_benchmark"],
        "dflash.eval.evaluator": ["evaluate"],
        "dflash.eval.settings": ["DecodingSettings", "EvalSettings"],
        "dflash.eval.prompts": ["PromptBuilder", "stop_token_ids"],
        "dflash.eval.report": ["format_results"],
    },
)
