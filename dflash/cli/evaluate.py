"""`python -m dflash.evaluate`: evaluate drafting methods on a benchmark (config: dflash/conf/evaluate.yaml).

`methods` lists the methods compared (`dflash.methods`): methods that draft with the
DFlash drafter read `drafter.*` and `decoding.block_size`, and every method with settings
has its own group named after it (`ngram.*`, `eagle3.*`, `dflash_tree.*`).

Checks every setting and loads the prompts before loading any model, so a bad value fails in seconds,
not after an 8B model has loaded. The run directory is locked (`dflash.locks.DirectoryLock`) from then
until results.json is written: a second evaluation into it exits at once, naming the first.
"""

from __future__ import annotations

import os

import hydra
from omegaconf import DictConfig

from dflash.cli.common import CONF_DIR, exits_on_config_error, resolved_config, run_app, set_cpu_threads
from dflash.layout import RESULTS_FILE
from dflash.locks import DirectoryLock
from dflash.structured import build, config_key

LOCK_REMEDY = "wait for it to finish, or evaluate into another directory (hydra.run.dir=DIR)"


@hydra.main(config_path=str(CONF_DIR), config_name="evaluate", version_base="1.3")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    # imported here, not at the top, so that override errors are reported before torch loads
    from dflash.drafter.io import check_drafter_dir
    from dflash.eval import EvalSettings, benchmark_source, evaluate, format_results, load_benchmark, write_results
    from dflash.methods import METHODS, check_method_names
    from dflash.specs import build_drafter, load_target

    config = resolved_config(cfg)
    benchmark = build(cfg.benchmark, "benchmark")
    methods = list(cfg.methods)
    check_method_names(methods)
    set_cpu_threads(cfg.cpu_threads)
    settings = EvalSettings(
        decoding=build(cfg.decoding, "decoding"),
        chat_template=benchmark.chat_template,
        enable_thinking=benchmark.enable_thinking,
        methods=methods,
        # every method's group is checked, listed or not: a typo fails now, not in a later run
        method_settings={
            name: build(cfg[name], name) for name, method in METHODS.items() if method.settings is not None and name in cfg
        },
        hf_generate=cfg.hf_generate,
        warmup_tokens=cfg.warmup_tokens,
    )
    target_spec = build(cfg.target, "target")
    drafter_spec = build(cfg.drafter, "drafter")
    with config_key("benchmark"):
        samples = load_benchmark(benchmark)
    uses_drafter = any(METHODS[name].uses_dflash_drafter for name in methods)
    if uses_drafter and drafter_spec.path is not None:
        with config_key("drafter"):  # a wrong or damaged drafter fails before the target loads
            check_drafter_dir(drafter_spec.path)
    for name in methods:  # likewise every method's own files (e.g. eagle3.path)
        METHODS[name].check(settings.method_settings.get(name) or METHODS[name].default_settings())

    with DirectoryLock(cfg.paths.output_dir, "hydra.run.dir", LOCK_REMEDY):
        target = load_target(target_spec)
        drafter = build_drafter(drafter_spec, target) if uses_drafter else None
        results = evaluate(
            target,
            drafter,
            samples,
            settings,
            benchmark=benchmark.name,
            target_label=target_spec.path,
            drafter_label=drafter_spec.path or "random",
            config=config,
            benchmark_source=benchmark_source(benchmark),
        )
        path = write_results(results, os.path.join(cfg.paths.output_dir, RESULTS_FILE))
    print(format_results(results))
    print(f"results: {path}")


def main() -> None:
    run_app(_hydra_main, "evaluate")
