"""The levers figure of issue 37: validation tau_sim against training minutes, and measured
tau per family against minutes, from curves.csv and measured.csv beside this file.

    python docs/results/demo-recipe-2026-11-26-xeon/levers_plot.py            # writes levers.png
    python docs/results/demo-recipe-2026-11-26-xeon/levers_plot.py --extract NAME TRAIN_LOG
        # appends NAME's validation points (minutes from its first step) to curves.csv
"""

import csv
import datetime
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]"


def extract(name: str, log: str) -> None:
    """Minutes are wall minutes from the first progress line less its elapsed time (the
    training clock's start), so the disk cache fill before it is not counted."""
    start, rows = None, []
    for line in open(log):
        stamp = re.match(STAMP, line)
        if not stamp:
            continue
        when = datetime.datetime.fromisoformat(stamp.group(1))
        elapsed = re.search(r"train: step \d+, .* elapsed (\d+):(\d\d):(\d\d)", line)
        if start is None and elapsed:
            h, m, s = map(int, elapsed.groups())
            start = when - datetime.timedelta(hours=h, minutes=m, seconds=s)
        val = re.search(r"validation at step (\d+): loss [\d.]+, tau_sim ([\d.]+)", line)
        if val and start is not None:
            rows.append([name, round((when - start).total_seconds() / 60, 2), val.group(1), val.group(2)])
    path = os.path.join(HERE, "curves.csv")
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(["run", "minutes", "step", "val_tau_sim"])
        writer.writerows(rows)


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, list] = {}
    for row in csv.DictReader(open(os.path.join(HERE, "curves.csv"))):
        curves.setdefault(row["run"], []).append((float(row["minutes"]), float(row["val_tau_sim"])))
    measured = list(csv.DictReader(open(os.path.join(HERE, "measured.csv"))))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.4), layout="constrained")
    colours: dict[str, str] = {}
    for name in [*curves, *(row["run"] for row in measured)]:
        colours.setdefault(name, f"C{len(colours)}")
    for name, points in curves.items():
        left.plot(*zip(*points), marker="o", label=name, color=colours[name])
    left.set(xlabel="training minutes (fill not counted)", ylabel="validation tau_sim (own held-out split)")
    left.set_title("tau_sim during training", fontsize=10)
    left.legend(fontsize=7)
    markers = {"humaneval": "o", "math": "s", "chat": "^"}
    for row in measured:
        point = float(row["minutes"]), float(row["tau_per_prompt"])
        right.scatter(*point, marker=markers[row["family"]], color=colours[row["run"]])
    for run in dict.fromkeys(row["run"] for row in measured):
        right.scatter([], [], color=colours[run], label=run)
    for family, marker in markers.items():
        right.scatter([], [], color="grey", marker=marker, label=family)
    right.set(xlabel="training minutes", ylabel="measured tau per prompt (float32, lossless)")
    right.set_title("measured tau, 16 HumanEval + 8 math + 8 chat held-out prompts", fontsize=10)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.savefig(os.path.join(HERE, "levers.png"), dpi=120)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--extract"]:
        extract(sys.argv[2], sys.argv[3])
    else:
        plot()
