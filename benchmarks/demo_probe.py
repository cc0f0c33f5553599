"""The demo's stage-1 probe alone (`dflash.cli.demo_plan.measure`), with every timed call printed,
and the plan it makes for a fresh 30-minute budget: how steady the rates are from run to run, and
what the plan charges stage 2 and the cache fill (prints numbers; not a test).

    python benchmarks/demo_probe.py ARTIFACTS     # ARTIFACTS: a demo's paths.artifacts (target converted)
"""

from __future__ import annotations

import json
import sys
import time

import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

import dflash.timing
from dflash import CONF_DIR
from dflash.cli import demo_plan
from dflash.cli.common import resolved_config
from dflash.cli.demo import data_prompts
from dflash.specs import TargetSpec, load_target
from dflash.timing import timed


def main(artifacts: str) -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("demo", overrides=[f"paths.artifacts={artifacts}"], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        prompts, sources = data_prompts(cfg, artifacts)
    with open_dict(cfg):
        del cfg["hydra"]
    torch.set_num_threads(cfg.cpu_threads)
    target_cfg = resolved_config(cfg.target)
    target = load_target(TargetSpec(**target_cfg))
    seconds = []

    def recorded(run):  # every timed call of the probe, in order
        result, took = timed(run)
        seconds.append(round(took, 3))
        return result, took

    dflash.timing.timed = recorded
    measured = demo_plan.measure(target, target_cfg, cfg, prompts, sources, forward_s=0.015)  # the evaluation's part only
    now = time.time()
    planned = demo_plan.plan(measured, cfg, now, now)
    summary = {
        "answers tok/s": measured.answer_tokens_per_s,
        "cache fill tok/s": measured.fill_tokens_per_s,
        "probe s": measured.probe_s,
        "plan": {"answers": planned.data_dtype, "precision": planned.precision, "prompts": planned.prompts},
        "planned s": {part: planned.seconds[part] for part in ("data", "cache_fill")},
    }
    print("calls (s, in order: the fill in turns, then per dtype (1 token, 6 tokens) x 3):", seconds)
    print(json.dumps(summary, default=round))


if __name__ == "__main__":
    main(sys.argv[1])
