"""`python -m dflash.regenerate`: the target writes the responses of a prompt mix
(config: dflash/conf/regenerate.yaml, data sources: dflash/conf/data/*.yaml).

Reads the prompts of `data.sources` (or of `data.path` when there are none) and writes JSONL shards to
`regenerate.output_dir` (by default `data.path`, where training then reads them). Re-running resumes:
finished shards are kept. Every setting is checked before Hydra runs (`dflash.cli.common.run_app`, then
`check_app`), and the prompts are loaded and the output directory locked before the target loads, so a
bad value (or a second regeneration into it) fails in seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import hydra
from omegaconf import DictConfig

from dflash.cli.common import CONF_DIR, app_config, exits_on_config_error, run_app
from dflash.errors import require
from dflash.locks import DirectoryLock

log = logging.getLogger(__name__)


def check_app(app) -> None:
    """What needs no model, before Hydra runs and again in the job: every local prompt source has
    data files, and none is the output directory."""
    from dflash.data.sources import check_local_source

    require(bool(app.regenerate.output_dir), "regenerate.output_dir", "is required: the directory the shards go to")
    output_dir = os.path.abspath(os.path.expanduser(app.regenerate.output_dir))
    for source, key in app.data.prompt_sources():
        require(
            os.path.abspath(os.path.expanduser(source.path)) != output_dir,
            "regenerate.output_dir",
            f"is the prompt source {key}.path itself; write the regenerated data elsewhere "
            "(regenerate.output_dir=DIR) and train with data.path=DIR",
        )
        check_local_source(source, key)


@hydra.main(config_path=str(CONF_DIR), config_name="regenerate", version_base="1.3")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    from dflash.data import RegenerateSettings, load_conversations
    from dflash.data.regenerate import LOCK_REMEDY, regenerate
    from dflash.data.sources import describe_source
    from dflash.specs import load_target

    app = app_config(cfg)  # dflash.schema.RegenerateAppConfig
    check_app(app)
    output_dir = os.path.abspath(os.path.expanduser(app.regenerate.output_dir))
    # the settings without output_dir: they go into the manifest, which resumption compares
    settings = RegenerateSettings(**{f.name: getattr(app.regenerate, f.name) for f in dataclasses.fields(RegenerateSettings)})
    rows = []
    for source, key in app.data.prompt_sources():
        loaded = load_conversations(source, key)
        log.info("%s: %s", key, describe_source(source, len(loaded)))  # the data summary: where from, how drawn
        rows += loaded
    require(bool(rows), "data.sources", "the sources hold no prompt to answer")

    with DirectoryLock(output_dir, "regenerate.output_dir", LOCK_REMEDY):
        target = None if settings.server_url else load_target(app.target)
        path = regenerate(target, rows, output_dir, settings)
    print(f"regenerated {len(rows)} conversations: {path}")


def main() -> None:
    run_app(_hydra_main, "regenerate", output_dirs=("regenerate.output_dir",), check=check_app)
