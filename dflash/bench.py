"""`python -m dflash.bench` (`make bench`): what one decoding step costs on this machine,
against the floor its memory bandwidth sets, and the acceptance length each block size
needs to break even.

    python -m dflash.bench                                   # SmolLM2-135M, float32, 2 threads
    python -m dflash.bench --dtype bfloat16 --drafter artifacts/demo/.../drafter --out bench.md
    python -m dflash.bench --target tiny_qwen3 --quick       # seconds; what CI runs
    python -m dflash.bench --target DIR --device cuda --dtype bfloat16 --engine graphs

It prints (and writes with --out, as Markdown):
- the machine: CPU model (or GPU), threads, torch;
- the bytes of weights one forward reads (`weight_bytes`), the read bandwidth measured here
  (`read_bandwidth`) and the floor they imply: bytes / bandwidth, no forward can be faster;
- the kernels the engine chose (`TargetModel.kernel_path`);
- per verify width B: the target's forward over B new tokens with the drafter's taps after
  `--context` cached positions, on the fast engine and on the HF forward (reference), each against
  the floor and the one-token forward; the drafter's propose for a block of B (a random drafter of
  `--drafter-layers` layers unless `--drafter` names one: cost does not depend on its weights;
  `--draft-vocab` gives it a draft vocabulary, as the demo's drafter has), against the floor of the
  bytes it reads (`drafter_bytes`); a DFlash step's cost (propose + verify) in autoregressive steps,
  which is the acceptance length it needs to break even;
- batched greedy generation (regeneration's path) in tokens/s on both forwards, the fast one's steps
  after its prefill apart, against the compute floor: the FLOPs of every prompt and new token (2 x the
  weights each multiplies) over the measured throughput of the fastest matmul kernel here;
- llama.cpp's t(B) on this machine (CPU only): its own `llama-bench` on the target converted to GGUF in the
  same dtype, B tokens after `--context` cached ones, the same threads, the median of its samples, beside
  our verify (llama.cpp built and converted by `dflash.llamacpp`). `--llama-cpp` builds what is missing
  (minutes); without it the row appears where llama-bench and the GGUF exist already, else a line says how
  to get them; `--no-llama-cpp` leaves it out.

Steps take turns within each repeat and the median counts (`dflash.timing`). Nothing else should run
on the cores meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys

from dflash.layout import artifacts_root
from dflash.llamacpp import (
    LLAMA_BENCH,
    SDIST,
    build,
    convert,
    fetch_source,
    gguf_path,
    llama_bench_command,
    llama_cpp_root,
    parse_llama_bench,
    say,
)
from dflash.timing import interleaved_ms, median_seconds

#: verify widths measured unless --widths says otherwise
WIDTHS = (1, 2, 3, 4, 8, 16)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dflash.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2_135m", help="a target config name (dflash/conf/target) or an HF directory")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: the target config's)")
    parser.add_argument("--engine", default="auto", choices=["auto", "fast", "graphs", "eager"])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the target's device)")
    parser.add_argument("--drafter", default=None, help="a drafter directory (default: a random drafter)")
    parser.add_argument("--drafter-layers", type=int, default=1)
    parser.add_argument(
        "--draft-vocab", type=int, default=None, help="a random drafter drafts over this many tokens (the demo's: 8192)"
    )
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="verify widths B, comma-separated")
    parser.add_argument("--context", type=int, default=300, help="positions in the KV cache before each forward")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=64, help="prompts per batch of the generation benchmark (0: skip)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per prompt of the generation benchmark")
    parser.add_argument("--quick", action="store_true", help="3 repeats, widths 1 and 4, batch 4 of 8 tokens: a smoke run")
    parser.add_argument("--out", default=None, help="also write the report to this Markdown file")
    parser.add_argument(
        "--llama-cpp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="llama.cpp's t(B) beside ours: build and convert what is missing (minutes); default: only where built",
    )
    args = parser.parse_args(argv)
    try:
        args.widths = sorted({int(w) for w in args.widths.split(",")})
    except ValueError:
        parser.error(f"--widths: comma-separated integers, got {args.widths!r}")
    if not args.widths or args.widths[0] < 1:
        parser.error("--widths: every width must be >= 1")
    if args.quick:
        args.repeats, args.widths, args.batch, args.new_tokens = 3, [1, 4], min(args.batch, 4), 8
    if args.device != "cpu" and not args.device.startswith("cuda"):
        parser.error(f"--device: cpu or cuda (cuda:N), got {args.device!r}")
    if args.repeats < 1 or args.context < 1 or args.threads < 1:
        parser.error("--repeats, --context and --threads must be >= 1")
    if args.draft_vocab is not None and (args.drafter or args.draft_vocab < 1):
        parser.error("--draft-vocab: a positive size, for a random drafter (a drafter directory brings its own)")
    if args.llama_cpp and args.device != "cpu":
        parser.error(f"--llama-cpp: llama.cpp's row runs on the CPU; it needs --device cpu, got {args.device!r}")
    return args


def target_spec(name: str, dtype: str | None, engine: str, device: str = "cpu"):
    """A TargetSpec from a config name of dflash/conf/target (paths resolved as the apps do) or a directory."""
    from omegaconf import OmegaConf

    from dflash import CONF_DIR
    from dflash.errors import ConfigError
    from dflash.specs import TargetSpec

    config_file = os.path.join(CONF_DIR, "target", f"{name}.yaml")
    if os.path.isdir(name):
        fields = {"path": name}
    elif os.path.isfile(config_file):
        node = OmegaConf.load(config_file)
        node.pop("defaults", None)
        merged = OmegaConf.merge({"paths": {"artifacts": artifacts_root()}}, {"target": node})
        fields = OmegaConf.to_container(merged.target, resolve=True)
    else:
        names = sorted(f[:-5] for f in os.listdir(os.path.join(CONF_DIR, "target")) if not f.startswith("_"))
        raise ConfigError("--target", f"{name!r} is neither a directory nor a target config ({', '.join(names)})")
    if dtype is not None:
        fields["dtype"] = dtype
    return TargetSpec(**fields, engine=engine, device=device)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def weight_bytes(target) -> int:
    """Bytes one forward reads: every parameter once (a tied embedding is the head), less an
    untied input embedding, of which a forward reads a few rows."""
    seen, total = set(), 0
    for parameter in target.model.parameters():
        if parameter.data_ptr() in seen:
            continue
        seen.add(parameter.data_ptr())
        total += parameter.numel() * parameter.element_size()
    embedding = target.embed_tokens.weight
    if embedding.data_ptr() != target.lm_head.weight.data_ptr():
        total -= embedding.numel() * embedding.element_size()
    return total


def drafter_bytes(target, drafter) -> int:
    """Bytes one propose reads: the drafter's weights in the dtype it proposes in
    (`TargetModel.draft_dtype`, else its own) and the head rows it drafts over, in bfloat16
    where the target's fast engine drafts on a CPU (`TargetModel.draft_logits`), else the
    head's dtype."""
    import torch

    dtype = target.draft_dtype
    own = sum(p.numel() * (p.element_size() if dtype is None else dtype.itemsize) for p in drafter.parameters())
    head = target.lm_head.weight
    rows = head.shape[0] if drafter.draft_vocab is None else drafter.draft_vocab.numel()
    return own + rows * head.shape[1] * (head.element_size() if dtype is None else torch.bfloat16.itemsize)


def read_bandwidth(device) -> float:
    """Bytes per second: CPU, summing a 1 GiB float32 buffer; GPU, copying 1 GiB on the device
    (read + write counted)."""
    import torch

    if device.type == "cuda":
        source = torch.empty(256 * 1024**2, dtype=torch.float32, device=device)
        target = torch.empty_like(source)
        seconds = median_seconds(lambda: target.copy_(source), 10, device)
        return 2 * source.numel() * 4 / seconds
    buffer = torch.ones(256 * 1024**2, dtype=torch.float32)
    seconds = median_seconds(buffer.sum, 5, device)
    return buffer.numel() * 4 / seconds


def matmul_flops(dtype, device) -> float:
    """FLOP/s of a large matmul in the target's dtype (the compute floor's denominator): the
    fastest of the engine's matmul kernels that run here (`dflash.engine.kernels`: torch's,
    oneDNN's, MKL's, ours), as a 512-row linear of 576 -> 4,096."""
    import torch

    from dflash.engine import kernels

    x = torch.randn(512, 576, dtype=dtype, device=device)
    linear = kernels.Linear(torch.randn(4096, 576, dtype=dtype, device=device), None)
    with torch.inference_mode():
        seconds = min(median_seconds(lambda run=kernels.KERNELS[name]: run(linear, x), 10, device) for name in linear.candidates())
    return 2 * 512 * 576 * 4096 / seconds


def llama_cpp_gguf(model_dir: str, dtype: str, args) -> tuple[str | None, str]:
    """(the GGUF file of the target that llama-bench times, "") or (None, the line saying why
    there is none): --llama-cpp fetches, builds and converts what is missing, the default takes
    what is there."""
    root = llama_cpp_root()
    if args.llama_cpp is False or args.device != "cpu":
        return None, ""
    if args.llama_cpp:
        os.makedirs(root, exist_ok=True)
        source = fetch_source(root)
        build(root, source, (LLAMA_BENCH,))
        return convert(root, source, model_dir, dtype), ""
    if not os.path.isfile(os.path.join(root, "build", "bin", LLAMA_BENCH)):
        return None, f"llama.cpp: not built in {root}; --llama-cpp builds it (minutes)"
    gguf = gguf_path(root, model_dir, dtype)
    if not os.path.isfile(gguf):
        return None, f"llama.cpp: built, but this target has no {dtype} GGUF file yet; --llama-cpp converts it"
    return gguf, ""


def llama_cpp_costs(gguf: str, dtype: str, args) -> tuple[dict, str]:
    """({B: ms} of llama-bench on `gguf`, the line saying what it timed)."""
    command = llama_bench_command(os.path.join(llama_cpp_root(), "build", "bin"), gguf, args)
    say(" ".join(command))
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"{LLAMA_BENCH} failed: {done.stderr.strip().splitlines()[-3:]}")
    costs, first = parse_llama_bench(done.stdout, args.widths)
    # not its build_number and build_commit: CMake takes them from the git checkout around the source, ours
    return costs, (
        f"llama.cpp b11434 (`{SDIST}`), `{LLAMA_BENCH}` on the target's {dtype} GGUF file ({first['model_n_params'] / 1e6:.1f}M "
        f"parameters, {first['model_size'] / 1e6:.1f} MB), {first['n_threads']} threads: t(B), a prefill of B tokens after "
        f"{first['n_depth']} in the cache (`-d`), median of {len(first['samples_ns'])} samples"
    )


def llama_cpp_lines(costs: dict, about: str, verifies: dict, decoder: str, widths: list[int]) -> list[str]:
    """The report's llama.cpp section: its t(B) beside our verify, or the line saying why there is none."""
    if not costs:
        return ["", about] if about else []
    lines = ["", about + ":", "", "| B | llama.cpp ms | verify ms | verify / llama.cpp |", "|---|---|---|---|"]
    for width in widths:
        ours = verifies[(decoder, width)]
        lines.append(f"| {width} | {costs[width]:.2f} | {ours:.2f} | {ours / costs[width]:.2f} |")
    return lines + [
        "",
        "llama.cpp's prefill computes the head's logits for its last token only, our verify for all B "
        "(and the drafter's taps when B > 1).",
    ]


def step_costs(target, drafter, args) -> tuple[dict, dict]:
    """({(engine, B): ms} of verify forwards, {B: ms} of proposes)."""
    import torch
    from transformers import DynamicCache

    from dflash.dflash.proposer import DFlashProposer
    from dflash.target import crop_cache

    device, context = target.device, args.context
    taps = list(drafter.config.target_layer_ids)
    ids = torch.randint(
        100, min(20_000, target.embedding_rows), (1, context + max(args.widths)), generator=torch.Generator().manual_seed(0)
    ).to(device)
    with torch.inference_mode():
        caches = {"hf": DynamicCache()}
        if target.fast is not None:
            caches["fast"] = target.new_cache()
        out = None
        for cache in caches.values():
            out = target.forward(ids[:, :context], torch.arange(context, device=device).unsqueeze(0), cache, taps, logits_to_keep=1)
        features = out.features
        proposer = DFlashProposer.for_target(drafter, target)
        committed = ids[:, : context + 1]

        def verify(cache, width):
            def step():
                positions = torch.arange(context, context + width, device=device).unsqueeze(0)
                target.forward(ids[:, context : context + width], positions, cache, taps if width > 1 else None)
                crop_cache(cache, context)

            return step

        def propose(width):
            # as in decoding: the context is in the drafter's cache, one new position arrives
            proposer.reset()
            proposer.propose(committed, features, width, width - 1)
            length = proposer.cache.length

            def step():
                proposer.cache.crop(length - 1)
                proposer.propose(committed, features[:, -1:], width, width - 1)

            return step

        steps = {(engine, width): verify(cache, width) for engine, cache in caches.items() for width in args.widths}
        measured = interleaved_ms(steps, args.repeats, device)
        # one proposer (one drafter cache) serves every width: each width's proposes run together
        proposes = {w: interleaved_ms({"p": propose(w)}, args.repeats, device)["p"] for w in args.widths if w > 1}
    return measured, proposes


def generation(target, args) -> tuple[dict, int]:
    """({row: tokens/s} of batched greedy generation, every row running to --new-tokens: the
    fast engine's whole run and its steps after the prefill, HF `generate()`'s run; the fast
    run's prompt tokens)."""
    import torch

    from dflash.engine import greedy_batch

    rows = [[100 + (7 * row + i) % 5000 for i in range(48 + row % 16)] for row in range(args.batch)]
    never = {-1}  # no stop token: every row runs the full length
    results = {}
    new = args.batch * args.new_tokens
    with torch.inference_mode():
        if target.fast is not None:
            greedy_batch(target.fast, rows[:2], 2, never, 0)
            prefill = median_seconds(lambda: greedy_batch(target.fast, rows, 1, never, 0), 1, target.device)
            seconds = median_seconds(lambda: greedy_batch(target.fast, rows, args.new_tokens, never, 0), 1, target.device)
            results["fast"] = new / seconds
            if args.new_tokens > 1 and seconds > prefill:
                results["its steps after the prefill"] = (new - args.batch) / (seconds - prefill)
        ids = torch.tensor([row[-48:] for row in rows], device=target.device)
        options = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
        target.model.generate(
            ids[:2], attention_mask=torch.ones_like(ids[:2]), **{**options, "max_new_tokens": 2, "min_new_tokens": 2}
        )
        seconds = median_seconds(
            lambda: target.model.generate(ids, attention_mask=torch.ones_like(ids), **options), 1, target.device
        )
        results["hf (48-token prompts)"] = new / seconds
    return results, sum(map(len, rows))


def report(args) -> str:
    import torch

    from dflash.specs import DrafterSpec, build_drafter, load_target

    torch.set_num_threads(args.threads)
    target_config = target_spec(args.target, args.dtype, args.engine, args.device)
    target = load_target(target_config)
    dtype = str(target.dtype).removeprefix("torch.")
    gguf, about = llama_cpp_gguf(target_config.path, dtype, args)  # first: a build or conversion is over before timing
    if target.fast is not None:
        target.new_cache()  # tunes the kernels: untimed
    device = target.device
    spec = DrafterSpec(path=args.drafter, num_layers=args.drafter_layers, block_size=max(args.widths), dtype="auto", seed=0)
    drafter = build_drafter(spec, target).eval()
    if args.draft_vocab is not None:  # which tokens does not change the cost: the first ones
        drafter.draft_vocab = torch.arange(min(args.draft_vocab, target.lm_head.weight.shape[0]))
    nbytes = weight_bytes(target)
    bandwidth = read_bandwidth(device)
    floor_ms = 1000 * nbytes / bandwidth
    propose_bytes = drafter_bytes(target, drafter)
    drafter_floor_ms = 1000 * propose_bytes / bandwidth
    verifies, proposes = step_costs(target, drafter, args)
    engines = [engine for engine in ("fast", "hf") if (engine, 1) in verifies]
    decoder = engines[0]
    one = verifies[(decoder, 1)]
    llama, about = llama_cpp_costs(gguf, dtype, args) if gguf else ({}, about)

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    lines = [
        f"# Step costs: {args.target}, {dtype}",
        "",
        f"- `python -m dflash.bench {' '.join(sys.argv[1:])}`".rstrip()
        + f", {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {where}; {args.threads} threads; torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}",
        f"- weights read per forward: {nbytes / 1e6:.1f} MB; measured read bandwidth {bandwidth / 1e9:.1f} GB/s; "
        f"floor {floor_ms:.2f} ms per forward",
        f"- decoding forward: {target.kernel_path}",
        f"- context {args.context} positions; drafter: {args.drafter or f'random, {args.drafter_layers} layer(s)'}"
        f" (drafts over {'all tokens' if drafter.draft_vocab is None else f'{drafter.draft_vocab.numel()} tokens'}), "
        f"{propose_bytes / 1e6:.1f} MB read per propose, floor {drafter_floor_ms:.3g} ms; "
        f"median of {args.repeats} interleaved repeats",
        "",
        "| B | verify ms | / floor | / t(1) | HF forward ms | propose ms | / its floor | step ms | break-even tau |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for width in args.widths:
        verify = verifies[(decoder, width)]
        hf = verifies.get(("hf", width))
        propose = proposes.get(width, 0.0)
        step = verify + propose
        lines.append(
            f"| {width} | {verify:.2f} | {verify / floor_ms:.2f} | {verify / one:.2f} | {hf:.2f} | {propose:.2f} "
            f"| {propose / drafter_floor_ms:.2f} | {step:.2f} | {step / one:.2f} |"
        )
    lines += [
        "",
        "verify: the target's forward over B new tokens (with the drafter's taps when B > 1) on the engine that decodes; "
        "HF forward: the same on transformers' forward with a DynamicCache (reference); propose: the drafter's block of B "
        "with one new context position (B = 1: no drafter), against the floor of the bytes it reads; "
        "break-even tau = step / t(1).",
        *llama_cpp_lines(llama, about, verifies, decoder, args.widths),
    ]
    if args.batch:
        rates, prompt_tokens = generation(target, args)
        flops = matmul_flops(target.dtype, device)
        # the weights a token multiplies (`weight_bytes`' count); a prompt token skips the head
        per_new = weight_bytes(target) // target.lm_head.weight.element_size()
        per_prompt = per_new - target.lm_head.weight.numel()
        new = args.batch * args.new_tokens
        run_floor = new * flops / (2 * (new * per_new + prompt_tokens * per_prompt))
        lines += [
            "",
            f"Batched greedy generation, {args.batch} prompts ({prompt_tokens} prompt tokens) x {args.new_tokens} new "
            "tokens: " + ", ".join(f"{name} {rate:.0f} tok/s" for name, rate in rates.items()) + ". Compute floor at a "
            f"measured {flops / 1e9:.0f} GFLOP/s (the fastest matmul kernel here): {run_floor:.0f} new tok/s for the fast run (its prompts "
            f"included, 2 x {per_prompt / 1e6:.0f}M FLOPs per prompt token), {flops / (2 * per_new):.0f} tok/s for its "
            f"steps (2 x {per_new / 1e6:.0f}M FLOPs per new token).",
        ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    from dflash.cli.common import exits_on_config_error

    args = parse_args(argv)
    text = exits_on_config_error(report)(args)
    print(text, end="")
    if args.out:
        from dflash.fileio import write_text

        write_text(args.out, text)


if __name__ == "__main__":
    main()
