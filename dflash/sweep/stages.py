"""Which Hydra app runs a sweep, what it needs first, and which sweep follows it.

A sweep file (dflash/conf/sweep/NAME.yaml, a Hydra config of the `sweep` group) holds a `sweep:`
node: `app` (train | evaluate), `prepare` (commands to run first), `next` (a sweep to
run afterwards, e.g. the evaluation stage of a two-stage ablation). Those keys may come
from the `_*.yaml` bases it includes, so `sweep_plan` merges the `sweep:` nodes along
the file's own defaults list (bases first, the file last), as Hydra does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import yaml

from dflash.errors import ConfigError, require

SWEEPS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "sweep")
APPS = ("train", "evaluate")


@dataclass
class SweepPlan:
    """What `python -m dflash.sweep NAME` runs: `prepare` commands, then the app's multirun.

    prepare: argv lists run as `python -m <argv>`; next: the following sweep or None.
    """

    name: str
    app: str
    prepare: list[list[str]] = field(default_factory=list)
    next: str | None = None


def available_sweeps(sweeps_dir: str = SWEEPS_DIR) -> list[str]:
    """Names of the runnable sweeps (files not starting with `_`)."""
    return sorted(f[:-5] for f in os.listdir(sweeps_dir) if f.endswith(".yaml") and not f.startswith("_"))


def sweep_plan(name: str, sweeps_dir: str = SWEEPS_DIR) -> SweepPlan:
    """The merged `sweep:` node of dflash/conf/sweep/NAME.yaml as a `SweepPlan`."""
    require(
        not name.startswith("_") and os.path.isfile(os.path.join(sweeps_dir, f"{name}.yaml")),
        "sweep",
        f"unknown sweep {name!r}; choose one of {available_sweeps(sweeps_dir)}",
    )
    node = _merged_sweep_node(name, sweeps_dir, seen=())
    app = node.get("app")
    require(app in APPS, "sweep.app", f"dflash/conf/sweep/{name}.yaml: expected one of {list(APPS)}, got {app!r}")
    prepare = node.get("prepare") or []
    require(
        all(isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd) for cmd in prepare),
        "sweep.prepare",
        f"dflash/conf/sweep/{name}.yaml: expected a list of argv lists (module first), got {prepare!r}",
    )
    follow = node.get("next")
    if follow is not None:
        sweep_plan(follow, sweeps_dir)  # a typo in `next` fails before anything runs
    return SweepPlan(name=name, app=app, prepare=[list(cmd) for cmd in prepare], next=follow)


def _merged_sweep_node(name: str, sweeps_dir: str, seen: tuple[str, ...]) -> dict:
    if name in seen:
        raise ConfigError("sweep", f"dflash/conf/sweep/{name}.yaml includes itself through {' -> '.join(seen)}")
    with open(os.path.join(sweeps_dir, f"{name}.yaml")) as f:
        content = yaml.safe_load(f) or {}
    merged: dict = {}
    for entry in content.get("defaults", []):
        # Entries naming another file of this group ("_cpu"); "override /x: y" entries are dicts.
        if isinstance(entry, str) and entry != "_self_":
            merged.update(_merged_sweep_node(entry, sweeps_dir, (*seen, name)))
    merged.update(content.get("sweep") or {})
    return merged
