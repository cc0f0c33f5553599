"""Validation tau_sim against wall-clock training minutes, read from training runs' logs.

    python benchmarks/tau_vs_minutes.py RUN_DIR[=LABEL] ... [--out plot.png] [--markdown]

Each run's `train.log` (written by `python -m dflash.train`) holds progress lines
(`train: step N/..., elapsed H:MM:SS`) and validation lines (`train: validation at step N:
loss L, tau_sim T`), each with a timestamp. Minutes count from the fit's start (the first
progress line's timestamp less its elapsed time), validation time included: what a
budget of `trainer.max_minutes` buys. A resumed run's later segments are not handled.
Prints one line per validation (or a Markdown table), and draws the curves with --out.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys

STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]"
PROGRESS = re.compile(STAMP + r".*train: step (\d+)(?:/\d+)?[ ,].*elapsed (\d+):(\d\d):(\d\d)")
VALIDATION = re.compile(STAMP + r".*train: validation at step (\d+): loss ([\d.]+), tau_sim ([\d.]+)")


def _time(stamp: str, millis: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() + int(millis) / 1000


def curve(run_dir: str) -> list[tuple[float, int, float, float]]:
    """[(minutes, step, val loss, val tau_sim)] of one run, in order."""
    path = os.path.join(run_dir, "train.log")
    started, points = None, []
    with open(path) as f:
        for line in f:
            match = PROGRESS.match(line)
            if match and started is None:
                hours, minutes, seconds = (int(x) for x in match.group(4, 5, 6))
                started = _time(match.group(1), match.group(2)) - (3600 * hours + 60 * minutes + seconds)
            match = VALIDATION.match(line)
            if match and started is not None:
                points.append(
                    (
                        (_time(match.group(1), match.group(2)) - started) / 60,
                        int(match.group(3)),
                        float(match.group(4)),
                        float(match.group(5)),
                    )
                )
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="RUN_DIR or RUN_DIR=LABEL")
    parser.add_argument("--out", help="write the plot (PNG) here")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table instead of plain lines")
    args = parser.parse_args(argv)
    curves = {}
    for spec in args.runs:
        run_dir, _, label = spec.partition("=")
        if not os.path.isfile(os.path.join(run_dir, "train.log")):
            print(f"error: {run_dir}: no train.log (give the run directory of python -m dflash.train)", file=sys.stderr)
            return 2
        curves[label or os.path.basename(run_dir.rstrip("/"))] = curve(run_dir)
    if args.markdown:
        print("| run | minutes | step | val loss | tau_sim |\n|---|---|---|---|---|")
    for label, points in curves.items():
        for minutes, step, loss, tau in points:
            if args.markdown:
                print(f"| {label} | {minutes:.1f} | {step} | {loss:.3f} | {tau:.3f} |")
            else:
                print(f"{label}\t{minutes:.2f} min\tstep {step}\tval loss {loss:.3f}\ttau_sim {tau:.3f}")
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for label, points in curves.items():
            ax.plot([p[0] for p in points], [p[3] for p in points], marker="o", markersize=3, label=label)
        ax.set_xlabel("training minutes (2-core CPU, validation included)")
        ax.set_ylabel("validation tau_sim (bonus token counted)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.out, dpi=120)
        print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
