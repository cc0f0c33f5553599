"""`python -m dflash.regenerate`: the target writes the responses of a prompt mix
(config: dflash/conf/regenerate.yaml, data sources: dflash/conf/data/*.yaml).

Reads the prompts of `data.sources` (or of `data.path` when there are none) and writes JSONL shards to
`regenerate.output_dir` (by default `data.path`, where training then reads them). Re-running resumes:
finished shards are kept. Every setting is checked, the prompts are loaded and the output directory is
locked before the target loads, so a bad value (or a second regeneration into it) fails in seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import hydra
from omegaconf import DictConfig

from dflash.cli.common import CONF_DIR, exits_on_config_error, run_app
from dflash.errors import require
from dflash.locks import DirectoryLock
from dflash.structured import build

log = logging.getLogger(__name__)


@hydra.main(config_path=str(CONF_DIR), config_name="regenerate", version_base="1.3")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    from dflash.data import RegenerateSettings, load_conversations, regenerate
    from dflash.data.regenerate import LOCK_REMEDY
    from dflash.data.sources import describe_source
    from dflash.specs import load_target

    data = build(cfg.data, "data")
    group = build(cfg.regenerate, "regenerate")
    require(bool(group.output_dir), "regenerate.output_dir", "is required")
    output_dir = os.path.abspath(os.path.expanduser(group.output_dir))
    # the settings without output_dir: they go into the manifest, which resumption compares
    settings = RegenerateSettings(**{f.name: getattr(group, f.name) for f in dataclasses.fields(RegenerateSettings)})
    target_spec = None if settings.server_url else build(cfg.target, "target")

    rows = []
    for source, key in data.prompt_sources():
        require(
            os.path.abspath(os.path.expanduser(source.path)) != output_dir,
            "regenerate.output_dir",
            f"is the prompt source {key}.path itself; write the regenerated data elsewhere "
            "(regenerate.output_dir=DIR) and train with data.path=DIR",
        )
        loaded = load_conversations(source, key)
        log.info("%s: %s", key, describe_source(source, len(loaded)))  # the data summary: where from, how drawn
        rows += loaded
    require(bool(rows), "data.sources", "the sources hold no prompt to answer")

    with DirectoryLock(output_dir, "regenerate.output_dir", LOCK_REMEDY):
        target = load_target(target_spec) if target_spec is not None else None
        path = regenerate(target, rows, output_dir, settings)
    print(f"regenerated {len(rows)} conversations: {path}")


def main() -> None:
    run_app(_hydra_main, "regenerate", output_dirs=("regenerate.output_dir",))
