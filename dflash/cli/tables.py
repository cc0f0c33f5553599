"""`python -m dflash.tables`: the paper's tables and figures from sweep results (dflash/conf/tables.yaml).

Reads result directories under `root` (results.json, error.json of failed jobs,
.hydra/config.yaml of unfinished ones, csv/*/metrics.csv for accuracy curves) or the
runs of a wandb project, and writes `tables.md`, `tables.tex` and `plots/*.png` into
`out_dir`. The Markdown is also printed.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from dflash.cli.common import CONF_DIR, exits_on_config_error, run_app
from dflash.errors import require
from dflash.structured import build


def load_records(settings):
    """The run records of the configured source."""
    if settings.source == "wandb":
        import wandb

        from dflash.reports import collect_wandb_runs

        return collect_wandb_runs(wandb.Api(), settings.project, settings.entity, settings.groups)
    from dflash.reports import collect_runs

    return collect_runs(settings.root)


def complete_runs(records: list) -> tuple[list, list]:
    """(finished and failed runs, incomplete runs): a run that started and has no result yet
    (no results.json, no error.json) has nothing to tabulate."""
    from dflash.reports.records import PENDING

    return [r for r in records if r.status != PENDING], [r for r in records if r.status == PENDING]


def incomplete_note(incomplete: list) -> str:
    """One line naming the skipped runs."""
    more = f" and {len(incomplete) - 1} more" if len(incomplete) > 1 else ""
    return f"note: skipped {len(incomplete)} incomplete run(s) without results.json: {incomplete[0].source}{more}"


@hydra.main(config_path=str(CONF_DIR), config_name="tables", version_base="1.3")
@exits_on_config_error
def _hydra_main(cfg: DictConfig) -> None:
    from dflash.reports import write_report
    from dflash.reports.records import FAILED

    settings = build(cfg, "")  # dflash.schema.TablesAppConfig
    where = settings.root if settings.source == "dirs" else f"wandb project {settings.project}"
    records, incomplete = complete_runs(load_records(settings))
    if incomplete:
        print(incomplete_note(incomplete))
    require(bool(records), "root" if settings.source == "dirs" else "project", f"no finished or failed runs in {where}")
    found = sorted({record.ablation for record in records if record.ablation})
    missing = [name for name in settings.ablations if name not in found]
    require(not missing, "ablations", f"no runs of {missing[0]!r} in {where}; it holds {found}" if missing else "")
    report = write_report(records, settings.out_dir, settings.formats, settings.plots, settings.ablations, settings.metric)
    print(report.markdown)
    failed = sum(record.status == FAILED for record in records)
    print(f"{len(records) - failed} finished and {failed} failed runs from {where}; wrote:")
    for path in report.files:
        print(f"  {path}")


def main() -> None:
    run_app(_hydra_main, "tables", output_dirs=("out_dir",))
