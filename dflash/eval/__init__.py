"""Benchmarks, the evaluator (DFlash vs autoregressive vs HF generate), results.json."""

from dflash.eval.benchmarks import BENCHMARKS, BenchmarkSpec, Sample, benchmark_source, load_benchmark
from dflash.eval.evaluator import DecodingSettings, EvalSettings, evaluate
from dflash.eval.prompts import PromptBuilder, stop_token_ids
from dflash.eval.report import format_results

__all__ = [
    "BENCHMARKS",
    "BenchmarkSpec",
    "DecodingSettings",
    "EvalSettings",
    "PromptBuilder",
    "Sample",
    "benchmark_source",
    "evaluate",
    "format_results",
    "load_benchmark",
    "stop_token_ids",
]
