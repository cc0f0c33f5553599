"""`python -m dflash.sweep NAME`: run an ablation sweep (dflash/conf/sweep/NAME.yaml) end to end.

    python -m dflash.sweep depth --scale cpu --dry-run    # the CPU recipe; print the commands only
    python -m dflash.sweep block_size --gpus 0,1,2,3 --seeds 0,1,2
    python -m dflash.sweep depth hydra/launcher=slurm hydra.launcher.partition=gpu

`--scale` picks the recipe (dflash/conf/sweep/scale/NAME.yaml: full, cpu; default: the
sweep's own, full for all but the cpu-only ones). Runs the sweep's `prepare` commands,
then `python -m dflash.<app> -m +sweep=NAME [sweep/scale=S] ...` (a Hydra multirun;
evaluation stages take `sweep/eval_scale=S`), then the sweep named by its `next` key the
same way. Each stage is an ordinary Hydra command, printed before it runs, so any stage
can be re-run by hand. Re-running skips finished grid points. A per-scale name also
works: `depth_cpu` is `depth --scale cpu`.

Extra arguments are Hydra overrides. `hydra...` overrides go to every stage; other
(task) overrides go to the first stage only, and are refused for two-stage sweeps: the
second stage finds the first stage's drafters by their directory names, which task
overrides would change. `--seeds` sweeps the training seed (`seed=` in training stages,
`train_seed=` in evaluation stages); tables then report mean and std over seeds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from dflash.errors import ConfigError, require
from dflash.sweep.stages import SweepPlan, available_scales, available_sweeps, sweep_plan

SEED_KEY = {"train": "seed", "evaluate": "train_seed"}


def stage_commands(plan: SweepPlan, overrides: list[str], gpus: str | None, seeds: str | None, first: bool) -> list[list[str]]:
    """argv lists for one stage: its prepare commands, then its multirun."""
    hydra_overrides = [o for o in overrides if _is_hydra_override(o)]
    task_overrides = [o for o in overrides if not _is_hydra_override(o)] if first else []
    if gpus is not None:
        hydra_overrides.append(f"hydra.launcher.gpus={_gpu_value(gpus)}")
    if seeds is not None:
        task_overrides.append(f"{SEED_KEY[plan.app]}={seeds}")
    commands = [[sys.executable, "-m", *cmd] for cmd in plan.prepare]
    commands.append([sys.executable, "-m", f"dflash.{plan.app}", "-m", *plan.overrides, *task_overrides, *hydra_overrides])
    return commands


def sweep_and_scale(name: str, scale: str | None) -> tuple[str, str | None]:
    """(sweep, scale) of a command line; a per-scale name (`depth_cpu`) is its sweep at that scale."""
    if name in available_sweeps():
        return name, scale
    for known in available_scales():
        stem = name.removesuffix(f"_{known}")
        if stem != name and stem in available_sweeps():
            require(scale in (None, known), "scale", f"{name!r} is sweep {stem!r} at scale {known!r}, not {scale!r}")
            return stem, known
    return name, scale


def sweep_commands(
    name: str,
    overrides: list[str],
    gpus: str | None = None,
    seeds: str | None = None,
    scale: str | None = None,
    follow_next: bool = True,
) -> list[list[list[str]]]:
    """The commands of every stage of sweep `name` at `scale` (one list of argv lists per
    stage); only its own stage when `follow_next` is false."""
    require(gpus is None or gpus == "auto" or _is_int_list(gpus), "--gpus", f"give a count (8), ids (0,2,5) or auto, not {gpus!r}")
    require(seeds is None or _is_int_list(seeds), "--seeds", f"give integer seeds like 0,1,2, not {seeds!r}")
    name, scale = sweep_and_scale(name, scale)
    plans = [sweep_plan(name, scale)]
    while follow_next and plans[-1].next is not None:
        plans.append(sweep_plan(plans[-1].next, scale))
        require(
            plans[-1].scale == plans[0].scale,
            "scale",
            f"sweep {plans[-2].name!r} runs at scale {plans[0].scale!r} but its next stage {plans[-1].name!r} at {plans[-1].scale!r}",
        )
    task_overrides = [o for o in overrides if not _is_hydra_override(o)]
    require(
        len(plans) == 1 or not task_overrides,
        "overrides",
        f"sweep {name!r} has {len(plans)} stages ({' -> '.join(p.name for p in plans)}); the later stages find the "
        f"first one's drafters by directory name, which {task_overrides} would change. Run the stages yourself: "
        + "; ".join(f"python -m dflash.{p.app} -m {' '.join(p.overrides)} ..." for p in plans),
    )
    return [stage_commands(plan, overrides, gpus, seeds, first=i == 0) for i, plan in enumerate(plans)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help=f"a sweep in dflash/conf/sweep/: {', '.join(available_sweeps())}")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (hydra.* ones apply to every stage)")
    parser.add_argument("--scale", help=f"the recipe: {', '.join(available_scales())} (default: the sweep's own, usually full)")
    parser.add_argument("--gpus", help="GPU count N (ids 0..N-1) or ids 0,2,5 (default: the sweep's, usually all visible)")
    parser.add_argument("--seeds", help="training seeds to sweep, e.g. 0,1,2")
    parser.add_argument("--no-next", action="store_true", help="run this sweep's own stage only, not the stages after it")
    parser.add_argument("--dry-run", action="store_true", help="print the commands without running them")
    args = parser.parse_intermixed_args(argv)  # overrides may come before or after --seeds/--gpus
    try:
        stages = sweep_commands(args.name, args.overrides, args.gpus, args.seeds, args.scale, follow_next=not args.no_next)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    status = 0
    for commands in stages:
        for i, command in enumerate(commands):
            print("$ " + " ".join(_shell_quote(part) for part in command), flush=True)
            if args.dry_run:
                continue
            returncode = subprocess.run(command, check=False).returncode
            is_prepare = i < len(commands) - 1
            if returncode != 0 and is_prepare:
                print(f"error: preparation step failed with status {returncode}; the sweep did not start", file=sys.stderr)
                return returncode
            # A later stage still runs after failed jobs: its jobs whose inputs are
            # missing fail with their own error.json, the others produce results.
            status = status or returncode
    return status


def _is_hydra_override(override: str) -> bool:
    return override.lstrip("+~").startswith(("hydra.", "hydra/"))


def _is_int_list(text: str) -> bool:
    return all(part.strip().isdigit() for part in text.split(","))


def _gpu_value(gpus: str) -> str:
    return gpus if gpus.isdigit() or gpus == "auto" else f"[{gpus}]"


def _shell_quote(part: str) -> str:
    return part if all(c.isalnum() or c in "-_=./+,:[]@" for c in part) else "'" + part.replace("'", "'\\''") + "'"
