"""Validation tau_sim (the training metric) against measured tau (the real decode loop), per
drafter and prompt family, and where a gap comes from.

tau_sim = 1 + sum_k prod_{i<=k} acc_i over the held-out conversations of the training data
(random anchors anywhere in the target's own answers, teacher forced); measured tau is
what the lossless loop accepts on the evaluation prompts (64 new tokens). Three things can
part them: the prompts (HumanEval in the harness's wording is not the stdlib headers the
drafter trained on), the position (tau_sim averages anchors over whole answers of up to 192
tokens, the evaluation decodes the first 64), and the metric itself (it multiplies
per-slot accuracies as if errors were independent). `--decode-val JOB` separates them for a
drafter: it decodes the held-out training conversations' own prompts with the real loop at
64 and at 192 new tokens (`python -m dflash.evaluate`, results under --work/<sweep>/<job>/,
outside the sweeps root, so the tables never read them as runs).

    python benchmarks/tau_gap.py --root artifacts/sweeps --sweeps depth_smollm2 block_size_smollm2 --out gap.md
    python benchmarks/tau_gap.py --root artifacts/sweeps --sweeps block_size_smollm2 \
        --decode-val block_size_smollm2/drafter.block_size=8,seed=0 --out gap.md
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import subprocess
import sys

import numpy as np

from dflash.data.datamodule import split_conversations
from dflash.fileio import write_jsonl
from dflash.layout import CSV_DIR, DRAFTER_DIR, RESULTS_FILE, Results

FAMILIES = ("humaneval", "math", "chat")
VAL_FAMILIES = {"builtin:code": "code (val)", "builtin:math": "math (val)", "builtin:chat": "chat (val)"}
GAP = 0.10


def best_tau_sim(job: str) -> tuple[float | None, int | None]:
    """(the highest val/tau_sim logged, its step): the checkpoint the job exported."""
    best = (None, None)
    for path in sorted(glob.glob(os.path.join(job, CSV_DIR, "version_*", "metrics.csv"))):
        with open(path) as f:
            for row in csv.DictReader(f):
                value = row.get("val/tau_sim")
                if value and (best[0] is None or float(value) > best[0]):
                    best = (float(value), int(float(row["step"])))
    return best


def job_rows(root: str, sweeps: list[str]) -> list[dict]:
    rows = []
    for sweep in sweeps:
        for job in sorted(glob.glob(os.path.join(root, sweep, "*", RESULTS_FILE))):
            job_dir = os.path.dirname(job)
            results = Results.read(job)
            tau_sim, step = best_tau_sim(job_dir)
            families = results.families or {}
            rows.append(
                {
                    "sweep": sweep,
                    "job": os.path.basename(job_dir),
                    "tau_sim": tau_sim,
                    "step": step,
                    "block": results.block_size,
                    "all": results.tau,
                    **{family: (families.get(family) or {}).get("tau") for family in FAMILIES},
                }
            )
    return rows


def _gap(measured: float | None, simulated: float | None) -> str:
    if measured is None or not simulated:
        return "–"
    gap = measured / simulated - 1
    return f"{gap:+.0%}" + (" **" if abs(gap) > GAP else "")


def gap_table(rows: list[dict]) -> str:
    lines = [
        "| sweep | job | B | val tau_sim (step) | tau all | HumanEval | math | chat | gap all | gap HumanEval | gap math | gap chat |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        taus = " | ".join("–" if r[k] is None else f"{r[k]:.2f}" for k in ("all", *FAMILIES))
        gaps = " | ".join(_gap(r[k], r["tau_sim"]) for k in ("all", *FAMILIES))
        sim = "–" if r["tau_sim"] is None else f"{r['tau_sim']:.2f} ({r['step']})"
        lines.append(f"| {r['sweep']} | {r['job']} | {r['block']} | {sim} | {taus} | {gaps} |")
    lines += ["", f"gap = measured tau / val tau_sim - 1; ** marks |gap| > {GAP:.0%}.", ""]
    return "\n".join(lines)


def family_summary(rows: list[dict]) -> str:
    """Mean gap per sweep and family (over the sweep's jobs)."""
    lines = [
        "| sweep | jobs | mean tau_sim | mean gap all | HumanEval | math | chat |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for sweep in dict.fromkeys(r["sweep"] for r in rows):
        mine = [r for r in rows if r["sweep"] == sweep and r["tau_sim"]]
        if not mine:
            continue
        cells = []
        for key in ("all", *FAMILIES):
            gaps = [r[key] / r["tau_sim"] - 1 for r in mine if r[key] is not None]
            cells.append(f"{np.mean(gaps):+.0%}" if gaps else "–")
        lines.append(f"| {sweep} | {len(mine)} | {np.mean([r['tau_sim'] for r in mine]):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def validation_prompts(config: dict, out: str) -> str:
    """The user prompts of the held-out conversations the job validated on, as a mixed
    benchmark file (family = the data source), in the datamodule's own split."""
    data = config["data"]
    shards = sorted(glob.glob(os.path.join(data["path"], "rows-*.jsonl")))
    conversations = [json.loads(line) for shard in shards for line in open(shard) if line.strip()]
    _, held_out = split_conversations(len(conversations), data["val_fraction"], data["seed"])
    sources, ends = [], 0
    for source in data["sources"]:
        ends += source["limit"]
        sources.append((ends, VAL_FAMILIES.get(source["path"], source["path"])))
    rows = []
    for index in held_out:
        family = next(name for end, name in sources if index < end)
        rows.append(
            {"turns": [next(m["content"] for m in conversations[index]["messages"] if m["role"] == "user")], "family": family}
        )
    return write_jsonl(out, rows)


def decode_validation(job: str, out_dir: str, python: str, tokens: tuple[int, ...]) -> dict[int, dict]:
    """Decode the job's held-out training prompts with its drafter into `out_dir`; {max_new_tokens: results}."""
    config = Results.read(os.path.join(job, RESULTS_FILE)).config
    os.makedirs(out_dir, exist_ok=True)
    prompts = validation_prompts(config, os.path.join(out_dir, "val_prompts.jsonl"))
    found = {}
    for n in tokens:
        run_dir = os.path.join(out_dir, f"val_{n}")
        results_path = os.path.join(run_dir, RESULTS_FILE)
        if not os.path.isfile(results_path):
            command = [
                python, "-m", "dflash.evaluate", "target=smollm2_135m", f"drafter.path='{os.path.join(job, DRAFTER_DIR)}'",
                "benchmark=jsonl", f"benchmark.path='{prompts}'", "benchmark.name=smollm2_val", "benchmark.prompt_format=raw",
                f"decoding.max_new_tokens={n}", "hf_generate=false", "cpu_threads=1", f"hydra.run.dir='{run_dir}'",
            ]  # fmt: skip
            print("$ " + " ".join(command[1:]), flush=True)
            subprocess.run(command, check=True)
        found[n] = Results.read(results_path).to_json()
    return found


def decode_table(job: str, row: dict, decoded: dict[int, dict]) -> str:
    lines = [
        f"**{job}** (val tau_sim {row['tau_sim']:.2f}; evaluation prompts: all {row['all']:.2f}, "
        + ", ".join(f"{f} {row[f]:.2f}" for f in FAMILIES if row[f] is not None)
        + ")",
        "",
        "| held-out training prompts | tokens | prompts | measured tau | / val tau_sim |",
        "| --- | --- | --- | --- | --- |",
    ]
    for n, results in decoded.items():
        for family, figures in {"all": results, **(results.get("families") or {})}.items():
            lines.append(
                f"| {family} | {n} | {figures['num_prompts']} | {figures['tau']:.2f} | {figures['tau'] / row['tau_sim'] - 1:+.0%} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="artifacts/sweeps")
    parser.add_argument("--sweeps", nargs="+", required=True, help="sweep directories under --root")
    parser.add_argument("--decode-val", nargs="*", default=[], help="jobs (<sweep>/<job>) whose held-out prompts to decode")
    parser.add_argument("--tokens", default="64,192", help="new tokens per decode of --decode-val")
    parser.add_argument("--work", default="artifacts/tau_gap", help="where --decode-val writes its evaluations")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rows = job_rows(args.root, args.sweeps)
    text = ["## tau_sim against measured tau, per drafter", "", gap_table(rows), "## Mean gap per sweep", "", family_summary(rows)]
    for job in args.decode_val:
        row = next(r for r in rows if f"{r['sweep']}/{r['job']}" == job)
        tokens = tuple(int(n) for n in args.tokens.split(","))
        decoded = decode_validation(os.path.join(args.root, job), os.path.join(args.work, job), sys.executable, tokens)
        text += ["## Decoding the held-out training prompts", "", decode_table(job, row, decoded)]
    with open(args.out, "w") as f:
        f.write("\n".join(text))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
