"""What each sweep cell cost: training steps and minutes, evaluation minutes, the whole job.

Reads each job directory under --root/<sweep>: job.log (its first time stamp and the last
progress line's step and elapsed training time), train.log (its last time stamp: training
and export done), results.json (its time: the evaluation done) and reused_from.json (a cell copied from another job costs that job's minutes once,
and a few seconds here). Times are wall-clock on the machine the sweep ran on, with the
load it had (two jobs side by side, one thread each).

    python benchmarks/cell_budgets.py --root artifacts/sweeps --sweeps block_size_smollm2 depth_smollm2 --out budgets.md
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from datetime import datetime

from dflash.fileio import read_json
from dflash.layout import LOG_FILE, RESULTS_FILE
from dflash.training.reuse import REUSED_FILE

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]")
PROGRESS = re.compile(r"train: step (\d+)/(\d+).*?elapsed (\d+):(\d\d):(\d\d)")


def _stamps(path: str) -> list[datetime]:
    if not os.path.isfile(path):
        return []
    with open(path, errors="replace") as f:
        return [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S") for line in f if (m := STAMP.match(line))]


def job_budget(job: str) -> dict:
    """{steps, train_min, eval_min, job_min, reused_from} of one job directory (None where unknown)."""
    reused = None
    if os.path.isfile(os.path.join(job, REUSED_FILE)):
        reused = read_json(os.path.join(job, REUSED_FILE))["job"]
    source = reused or job
    steps = train_s = None
    with open(os.path.join(source, LOG_FILE), errors="replace") as f:
        for line in f:
            if m := PROGRESS.search(line):
                steps = int(m.group(1))
                train_s = int(m.group(3)) * 3600 + int(m.group(4)) * 60 + int(m.group(5))
    stamps = _stamps(os.path.join(source, LOG_FILE))
    train_end = _stamps(os.path.join(source, "train.log"))
    finished = datetime.fromtimestamp(os.path.getmtime(os.path.join(source, RESULTS_FILE)))  # written last
    job_s = (finished - stamps[0]).total_seconds() if stamps else None
    eval_s = (finished - train_end[-1]).total_seconds() if train_end else None
    return {
        "steps": steps,
        "train_min": None if train_s is None else train_s / 60,
        "eval_min": None if eval_s is None else eval_s / 60,
        "job_min": None if job_s is None else job_s / 60,
        "reused_from": os.path.relpath(reused, os.path.dirname(os.path.dirname(job))) if reused else None,
    }


def table(root: str, sweeps: list[str]) -> tuple[str, float]:
    lines = [
        "| sweep | job | steps | training min | evaluation min | job min | trained in |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    total = 0.0
    for sweep in sweeps:
        for results in sorted(glob.glob(os.path.join(root, sweep, "*", RESULTS_FILE))):
            job = os.path.dirname(results)
            b = job_budget(job)
            if b["reused_from"] is None and b["job_min"] is not None:
                total += b["job_min"]

            def fmt(value):
                return "–" if value is None else f"{value:.1f}"

            where = b["reused_from"] or "this job"
            lines.append(
                f"| {sweep} | {os.path.basename(job)} | {b['steps'] or '–'} | {fmt(b['train_min'])} | {fmt(b['eval_min'])} | "
                f"{fmt(b['job_min'])} | {where} |"
            )
    lines += ["", f"Job minutes spent (copied cells counted once, where they trained): {total:.0f} ({total / 60:.1f} h).", ""]
    return "\n".join(lines), total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="artifacts/sweeps")
    parser.add_argument("--sweeps", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    text, _ = table(args.root, args.sweeps)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
