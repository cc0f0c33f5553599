"""Directory names of sweep jobs: the grid point, readable, plus a hash of anything else.

`grid_dirname` names a job after the overrides of the sweep's grid keys (its
`hydra.sweeper.params`), e.g. `drafter.num_layers=3,seed=0`, so the evaluation stage of
a two-stage sweep can find a drafter by its grid values. Any other command-line override
adds a short hash (`drafter.num_layers=3,seed=0+3fa2c1d9`), so it never becomes a path component.

Registered as the OmegaConf resolver `dflash_grid_dirname` (used by dflash/conf/sweep/_layout.yaml)
when Hydra loads the dflash launcher plugin, which it does in every Hydra app.
"""

from __future__ import annotations

import hashlib

RESOLVER = "dflash_grid_dirname"
HASH_CHARS = 8


def override_key(override: str) -> str:
    """The key of a command-line override: `+sweep=x` -> `sweep`, `~a.b` -> `a.b`."""
    return override.lstrip("+~").split("=", 1)[0]


def grid_dirname(overrides: list[str], grid_keys: list[str], exclude_keys: list[str] = ()) -> str:
    """`k=v` of the grid overrides (sorted, comma-separated), plus `+<hash>` of the others.

    overrides: the job's task overrides; grid_keys: the swept keys; exclude_keys: keys that
    never name a directory (the sweep selector itself, resume settings).
    Returns "default" for a job with no override at all.
    """
    grid_keys = {override_key(k) for k in grid_keys}
    excluded = {override_key(k) for k in exclude_keys}
    grid = sorted(o.lstrip("+") for o in overrides if override_key(o) in grid_keys)
    others = sorted(o for o in overrides if override_key(o) not in grid_keys | excluded)
    name = ",".join(grid).replace("/", "_")
    if others:
        digest = hashlib.sha256("\n".join(others).encode()).hexdigest()[:HASH_CHARS]
        name = f"{name}+{digest}" if name else digest
    return name or "default"


def _resolve(overrides, params, exclude_keys) -> str:
    from omegaconf import OmegaConf

    def plain(node):
        return OmegaConf.to_container(node) if OmegaConf.is_config(node) else (node or [])

    return grid_dirname(list(plain(overrides)), list(plain(params)), list(plain(exclude_keys)))


def register_resolver() -> None:
    """Make `${dflash_grid_dirname:<overrides>,<sweeper params>,<exclude keys>}` available."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve)
