"""Tables and figures of the paper from sweep results (`python -m dflash.tables`).

records (`collect_runs` from result directories, `collect_wandb_runs` from wandb)
-> `build_tables` (main table, one per ablation) -> Markdown / LaTeX (`render`) and
PNG figures (`plots`); `write_report` does all of it.
"""

from dflash.reports.collect import collect_runs
from dflash.reports.report import write_report
from dflash.reports.tables import build_tables
from dflash.reports.wandb_source import collect_wandb_runs

__all__ = ["build_tables", "collect_runs", "collect_wandb_runs", "write_report"]
