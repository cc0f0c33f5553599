"""Which Hydra app runs a sweep at a scale, what it needs first, and which sweep follows it.

A sweep file (dflash/conf/sweep/NAME.yaml, a Hydra config of the `sweep` group) holds a
`sweep:` node: `app` (train | evaluate), `prepare` (commands to run first), `next` (a
sweep to run afterwards, e.g. the evaluation stage of a two-stage ablation), `scales`
(the scales it runs at; null: all). The scale's recipe is a config group too:
`sweep/scale` for training sweeps, `sweep/eval_scale` for evaluation-only ones, with the
same option names. `sweep_plan` reads that node from the config Hydra composes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dflash import CONF_DIR
from dflash.errors import ConfigError, first_line, require

SWEEPS_DIR = CONF_DIR / "sweep"
APPS = ("train", "evaluate")
# The config group of each app's scale (dflash/conf/sweep/<group>/NAME.yaml).
SCALE_GROUP = {"train": "sweep/scale", "evaluate": "sweep/eval_scale"}


@dataclass
class SweepPlan:
    """What `python -m dflash.sweep NAME` runs: `prepare` commands, then the app's multirun.

    prepare: argv lists run as `python -m <argv>`; next: the following sweep or None;
    scale: the scale it runs at; overrides: the Hydra overrides that select the sweep and
    its scale (`+sweep=NAME`, plus `sweep/scale=S` when a scale was asked for).
    """

    name: str
    app: str
    scale: str
    prepare: list[list[str]] = field(default_factory=list)
    next: str | None = None
    overrides: list[str] = field(default_factory=list)


def available_sweeps() -> list[str]:
    """Names of the runnable sweeps (files not starting with `_`)."""
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml") if not p.name.startswith("_"))


def available_scales() -> list[str]:
    """Names of the scales (dflash/conf/sweep/scale/NAME.yaml)."""
    return sorted(p.stem for p in (CONF_DIR / SCALE_GROUP["train"]).glob("*.yaml") if not p.name.startswith("_"))


def scale_override(app: str, scale: str) -> str:
    """The override that picks `scale` for a sweep of `app`, e.g. `sweep/eval_scale=cpu`."""
    return f"{SCALE_GROUP[app]}={scale}"


def sweep_plan(name: str, scale: str | None = None) -> SweepPlan:
    """The `sweep:` node of sweep `name` at `scale` (None: the sweep's default), as Hydra composes it."""
    require(
        not name.startswith("_") and (SWEEPS_DIR / f"{name}.yaml").is_file(),
        "sweep",
        f"unknown sweep {name!r}; choose one of {available_sweeps()}",
    )
    require(scale is None or scale in available_scales(), "scale", f"unknown scale {scale!r}; choose one of {available_scales()}")
    errors = []
    for app in APPS:
        overrides = [f"+sweep={name}"] + ([scale_override(app, scale)] if scale is not None else [])
        try:
            node = _compose(app, overrides)
        except Exception as err:  # noqa: BLE001 - a sweep of the other app does not compose here; reported below
            errors.append(f"as a {app} sweep: {first_line(err)}")
            continue
        require(
            node.get("app") == app, "sweep.app", f"dflash/conf/sweep/{name}.yaml: composes for {app} but says {node.get('app')!r}"
        )
        return _plan(name, app, node, overrides)
    raise ConfigError(
        "sweep",
        f"dflash/conf/sweep/{name}.yaml does not compose{'' if scale is None else f' at scale {scale}'}: {'; '.join(errors)}",
    )


def _plan(name: str, app: str, node: dict, overrides: list[str]) -> SweepPlan:
    scale, scales = node.get("scale"), node.get("scales")
    require(
        scales is None or scale in scales,
        "scale",
        f"sweep {name!r} runs at scale {' or '.join(map(str, scales or []))} only, not {scale!r}",
    )
    unread = sorted(set(node.get("grids") or {}) - grid_names())
    require(
        not unread,
        f"sweep.grids.{unread[0] if unread else ''}",
        f"no sweep file reads this grid (a misspelt name would silently keep the sweep's own grid); "
        f"the names they read: {sorted(grid_names())}",
    )
    prepare = node.get("prepare") or []
    require(
        all(isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd) for cmd in prepare),
        "sweep.prepare",
        f"dflash/conf/sweep/{name}.yaml: expected a list of argv lists (module first), got {prepare!r}",
    )
    return SweepPlan(
        name=name, app=app, scale=scale, prepare=[list(cmd) for cmd in prepare], next=node.get("next"), overrides=overrides
    )


def grid_names() -> set[str]:
    """The `sweep.grids.<name>` a sweep file reads (`${oc.select:sweep.grids.<name>,...}`)."""
    return {m for p in SWEEPS_DIR.glob("*.yaml") for m in re.findall(r"sweep\.grids\.(\w+)", p.read_text())}


def _compose(app: str, overrides: list[str]) -> dict:
    """The unresolved `sweep` node of app `app` composed with `overrides` (Hydra's compose API)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import dflash.schema  # noqa: F401 - registers the config schemas the apps' configs start from

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=app):
        cfg = compose(app, overrides=overrides)
    # Unresolved: prepare commands keep their ${paths.artifacts}, which the commands resolve themselves.
    return OmegaConf.to_container(cfg.sweep, resolve=False)
