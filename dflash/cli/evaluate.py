"""`python -m dflash.evaluate`: evaluate drafting methods on a benchmark (config: dflash/conf/evaluate.yaml).

`methods` lists the methods compared (`dflash.methods`): methods that draft with the
DFlash drafter read `drafter.*` and `decoding.block_size`, and every method with settings
has its own group named after it (`ngram.*`, `eagle3.*`, `dflash_tree.*`).

Every setting is checked before Hydra runs (`dflash.cli.common.run_app`, then `check_app`) and the
prompts are loaded before any model. The run directory is locked (`dflash.locks.DirectoryLock`) until
results.json is written.
"""

from __future__ import annotations

import os

import hydra
from omegaconf import DictConfig

from dflash.cli.common import CONF_DIR, app_config, exits_on_config_error, resolved_config, run_app, set_cpu_threads
from dflash.layout import RESULTS_FILE
from dflash.locks import DirectoryLock
from dflash.structured import config_key

LOCK_REMEDY = "wait for it to finish, or evaluate into another directory (hydra.run.dir=DIR)"


def check_app(app) -> None:
    """What needs no model, before Hydra runs and again in each job: the drafter directory is
    read (a wrong or damaged one fails before the target loads), and every listed method's own
    files (e.g. eagle3.path)."""
    from dflash.methods import METHODS

    if app.drafter.path is not None and any(METHODS[name].uses_dflash_drafter for name in app.methods):
        from dflash.drafter.io import check_drafter_dir

        with config_key("drafter"):
            check_drafter_dir(app.drafter.path)
    for name in app.methods:
        METHODS[name].check(getattr(app, name, None) or METHODS[name].default_settings())


@hydra.main(config_path=str(CONF_DIR), config_name="evaluate", version_base="1.3")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    from dflash.eval import EvalSettings, benchmark_source, evaluate, format_results, load_benchmark
    from dflash.methods import METHODS
    from dflash.specs import build_drafter, load_target

    app = app_config(cfg)  # dflash.schema.EvaluateAppConfig
    check_app(app)
    set_cpu_threads(app.cpu_threads)
    settings = EvalSettings(
        decoding=app.decoding,
        chat_template=app.benchmark.chat_template,
        enable_thinking=app.benchmark.enable_thinking,
        methods=list(app.methods),
        method_settings={name: getattr(app, name) for name, method in METHODS.items() if method.settings is not None},
        hf_generate=app.hf_generate,
        warmup_tokens=app.warmup_tokens,
    )
    with config_key("benchmark"):
        samples = load_benchmark(app.benchmark)
    uses_drafter = any(METHODS[name].uses_dflash_drafter for name in app.methods)
    with DirectoryLock(cfg.paths.output_dir, "hydra.run.dir", LOCK_REMEDY):
        target = load_target(app.target)
        drafter = build_drafter(app.drafter, target) if uses_drafter else None
        results = evaluate(
            target,
            drafter,
            samples,
            settings,
            benchmark=app.benchmark.name,
            target_label=app.target.path,
            drafter_label=app.drafter.path or "random",
            config=resolved_config(cfg),
            benchmark_source=benchmark_source(app.benchmark),
        )
        path = results.write(os.path.join(cfg.paths.output_dir, RESULTS_FILE))
    print(format_results(results))
    print(f"results: {path}")


def main() -> None:
    run_app(_hydra_main, "evaluate", check=check_app)
