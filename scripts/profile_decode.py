"""Where the decode loop's time goes on a GPU: the open anomaly of `make gpu-check` section b.

On an H100 (docs/results/gpu-check-2026-11-23-h100-full.md) the 5-layer drafter's propose took
47-68 ms and qwen3's autoregressive loop 58 ms/token against a 7.8 ms target forward. This
script takes one family's random target and drafter (the same builders as gpu_check) and
measures, each with CUDA synchronised, the SM clock sampled (NVML) while it runs:
- t(n): one target forward of n tokens after a 256-token prompt's cache;
- the autoregressive loop per token (`generate`, B = 1), and again after a longer prompt
  (key lengths this process has not run yet);
- `DFlashProposer.propose` (a prefill of the prompt's features, then steps of 4 new ones),
  and the bare drafter forward under it;
- HF `generate()` at batch 8 (as regeneration runs it), per new token;
- a torch.profiler trace of 8 autoregressive steps and of 8 propose calls: host time per
  op, device (kernel) time per op, and wall time against summed kernel time.
It does all of that on a fresh target and drafter, then again after one section-a training
step (the state the gpu-check's section b inherited), and writes a Markdown report. Every
measurement runs under the decode loop's attention kernels
(`dflash.target.cache.decode_attention`); `--allow-cudnn` adds cuDNN's SDPA back to them, as
torch's default has it.

    PYTHONPATH=$PWD python scripts/profile_decode.py --out docs/results/decode-profile.md
    PYTHONPATH=$PWD python scripts/profile_decode.py --allow-cudnn --no-training --out before.md
Without CUDA it runs the toy shapes in float32 (a smoke run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402  (the builders and the section-a step the anomaly appeared after)

PROMPT_LEN = 256
STEP_FEATURES = 4  # new context positions per propose step (an accepted run of 3 + the bonus)


class ClockSampler:
    """Mean / min SM clock (MHz) over a `with` block, sampled by NVML every 5 ms (empty without it)."""

    def __init__(self):
        self.samples: list[int] = []
        self.handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        except Exception:  # no NVML (CPU, or the package is missing): clocks are left out
            pass

    def __enter__(self):
        self.samples, self.running = [], True
        if self.handle is not None:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.samples.append(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.running = False
        if self.handle is not None:
            self.thread.join()

    def text(self) -> str:
        if not self.samples:
            return "n/a"
        return f"{statistics.mean(self.samples):.0f} (min {min(self.samples)})"


def timed_ms(device, fn, repeats: int) -> list[float]:
    """Milliseconds of `repeats` calls of fn, each synchronised."""
    times = []
    for _ in range(repeats):
        _, seconds = gpu_check.timed(device, fn)
        times.append(seconds * 1e3)
    return times


def propose_run(drafter, target, prompt: torch.Tensor, steps: int):
    """A fresh DFlashProposer's calls: the prompt's features first, then `steps` calls of
    STEP_FEATURES new positions each; returns (proposer, list of per-call ms)."""
    from dflash.dflash.proposer import DFlashProposer

    proposer = DFlashProposer(drafter, target.embed, target.logits)
    width = len(proposer.target_layer_ids) * target.config.hidden_size
    device = target.device
    generator = torch.Generator(device=device).manual_seed(0)
    features = torch.randn(1, PROMPT_LEN + steps * STEP_FEATURES + 1, width, device=device, dtype=target.dtype, generator=generator)
    block = drafter.config.block_size
    times = []
    seen = 0
    for step in range(steps + 1):
        length = PROMPT_LEN + 1 + step * STEP_FEATURES  # committed tokens; the anchor is the last
        committed = prompt[:, :1].expand(1, length).contiguous()
        new = features[:, seen : length - 1]
        _, seconds = gpu_check.timed(device, lambda c=committed, n=new: proposer.propose(c, n, block, block - 1))
        seen = length - 1
        times.append(seconds * 1e3)
    return proposer, times


def bare_drafter_ms(drafter, target, repeats: int) -> list[float]:
    """One block of B through the drafter with a PROMPT_LEN context, no cache, inference mode."""
    device, block = target.device, drafter.config.block_size
    width = drafter.config.num_target_features * target.config.hidden_size
    context = torch.randn(1, PROMPT_LEN, width, device=device, dtype=target.dtype)
    embeds = torch.randn(1, block, target.config.hidden_size, device=device, dtype=target.dtype)
    positions = torch.arange(PROMPT_LEN, PROMPT_LEN + block, device=device).unsqueeze(0)
    context_positions = torch.arange(PROMPT_LEN, device=device).unsqueeze(0)

    @torch.inference_mode()
    def forward():
        return drafter(embeds, positions, context, context_positions, mask=None, cache=None)

    forward()
    return timed_ms(device, forward, repeats)


def profile_tables(fn, device, rows: int) -> tuple[str, str, float, float]:
    """(table by host self time, table by device self time, wall ms, summed kernel ms) of one fn() call."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    gpu_check.sync(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        fn()
        gpu_check.sync(device)
        wall = (time.perf_counter() - start) * 1e3
    averages = prof.key_averages()
    host = averages.table(sort_by="self_cpu_time_total", row_limit=rows)
    if device.type != "cuda":
        return host, "(no device on CPU)", wall, 0.0
    kernels = sum(event.self_device_time_total for event in averages if event.device_type == torch.autograd.DeviceType.CUDA)
    return host, averages.table(sort_by="self_device_time_total", row_limit=rows), wall, kernels / 1e3


def measure(family: str, target, drafter, prompt: torch.Tensor, state: str, steps: int, files: list) -> list[str]:
    from dflash.decoding import generate
    from dflash.training.forward import set_attention_implementation

    set_attention_implementation(drafter, "sdpa")
    device = target.device
    sampler = ClockSampler()
    lines = [f"### {family}, {state}", "", "| what | median ms | min ms | first ms | SM clock MHz |", "|---|---|---|---|---|"]
    layer_ids = drafter.config.target_layer_ids
    for n in (1, 16):
        with sampler:
            milliseconds = gpu_check.verify_forward_seconds(target, prompt, n, layer_ids, 10) * 1e3
        lines.append(f"| t({n}) target forward (median of 10) | {milliseconds:.2f} | | | {sampler.text()} |")
    generate(target, prompt, max_new_tokens=8)  # warm-up
    longer = 384 if state == "fresh" else 512  # key lengths this process has not run yet
    for what, ids in (("", prompt), (f", prompt {longer} (new key lengths)", prompt.repeat(1, 2)[:, :longer])):
        with sampler:
            result = generate(target, ids, max_new_tokens=64)
        per_token = result.decode_time_s * 1e3 / (len(result.output_ids) - 1)
        lines.append(f"| autoregressive, per token (63 steps){what} | {per_token:.2f} | | | {sampler.text()} |")
    with sampler:
        _, times = propose_run(drafter, target, prompt, steps)
    lines.append(
        f"| propose, {steps} steps of {STEP_FEATURES} new positions | {statistics.median(times[1:]):.2f} | "
        f"{min(times[1:]):.2f} | {times[0]:.2f} (prefill) | {sampler.text()} |"
    )
    with sampler:
        times = bare_drafter_ms(drafter, target, 20)
    lines.append(f"| bare drafter forward, block {drafter.config.block_size}, {PROMPT_LEN} context | "
                 f"{statistics.median(times):.2f} | {min(times):.2f} | | {sampler.text()} |")  # fmt: skip

    batch = torch.randint(0, target.config.vocab_size - 2, (8, 128), generator=torch.Generator().manual_seed(3)).to(device)
    padding = torch.ones_like(batch)
    for row in range(8):  # left padding, as regeneration batches prompts of different lengths
        padding[row, : 8 * row] = 0
    with sampler:
        _, seconds = gpu_check.timed(
            device,
            lambda: target.model.generate(
                input_ids=batch, attention_mask=padding, max_new_tokens=48, min_new_tokens=48, do_sample=False
            ),
        )
    lines.append(
        f"| HF generate(), batch 8, prompts 72-128 left-padded, per new token | {seconds * 1e3 / 48:.2f} | | | {sampler.text()} |"
    )

    host, kernels, wall, busy = profile_tables(lambda: generate(target, prompt, max_new_tokens=9), device, 18)
    files.append((f"{family}-{state}-autoregressive", host, kernels))
    lines += ["", f"- profiled autoregressive (8 steps + prefill): wall {wall:.1f} ms, kernels {busy:.1f} ms"]
    host, kernels, wall, busy = profile_tables(lambda: propose_run(drafter, target, prompt, 8), device, 18)
    files.append((f"{family}-{state}-propose", host, kernels))
    lines += [f"- profiled propose (prefill + 8 steps): wall {wall:.1f} ms, kernels {busy:.1f} ms", ""]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="decode-profile.md", help="report path; profiler tables go beside it")
    parser.add_argument("--families", default="qwen3-8b,llama-3.1-8b")
    parser.add_argument("--steps", type=int, default=30, help="propose steps timed")
    parser.add_argument("--no-training", action="store_true", help="skip the state after a section-a training step")
    parser.add_argument("--allow-cudnn", action="store_true", help="let decoding use cuDNN's SDPA (torch's default)")
    args = parser.parse_args(argv)
    from torch.nn.attention import SDPBackend

    from dflash.target import cache  # decode_attention and its kernel list

    if args.allow_cudnn:  # in place: the decode loop's decorator holds this very list
        cache.DECODE_SDPA_BACKENDS[:] = [*cache.DECODE_SDPA_BACKENDS, SDPBackend.CUDNN_ATTENTION]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sizes = gpu_check.sizes_for(device, quick=True, layers=None)
    report = ["# Decode-loop profile", "", *gpu_check.machine_lines(device), ""]
    kernels = ", ".join(backend.name for backend in cache.DECODE_SDPA_BACKENDS)
    report.append(f"SDPA kernels allowed: {kernels}.")
    report.append(f"Random targets at {'full' if device.type == 'cuda' else 'toy'} width, {sizes.layers} decoder layers, "
                  f"drafter {sizes.drafter_layers} layers, block {sizes.block_size}, {dtype}, prompt {PROMPT_LEN} tokens.")  # fmt: skip
    report.append("")
    files: list = []
    for family in args.families.split(","):
        gpu_check.progress(f"{family}: building")
        target = gpu_check.build_target(family, sizes.layers, device, dtype, tiny=device.type != "cuda")
        drafter = gpu_check.build_drafter(target, sizes.drafter_layers, sizes.block_size, dtype)
        vocab = target.config.vocab_size
        prompt = torch.randint(0, vocab - 2, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(2)).to(device)
        with cache.decode_attention():
            report += measure(family, target, drafter, prompt, "fresh", args.steps, files)
        gpu_check.write_report(args.out, report)
        if not args.no_training:
            gpu_check.progress(f"{family}: section a's training step, then again")
            gpu_check.section_training(family, target, drafter, sizes, device, dtype)
            with cache.decode_attention():
                report += measure(family, target, drafter, prompt, "after-training", args.steps, files)
            gpu_check.write_report(args.out, report)
        del target, drafter
        gpu_check.free_memory()
    tables = os.path.splitext(args.out)[0] + "-tables.txt"
    with open(tables, "w") as handle:
        for name, host, kernels in files:
            handle.write(f"# {name}: ops by host self time\n{host}\n\n# {name}: by device self time\n{kernels}\n\n")
    report.append(f"Profiler tables: {os.path.basename(tables)} beside this report. Command: {' '.join(sys.argv)}")
    gpu_check.write_report(args.out, report)
    gpu_check.progress(f"report written to {args.out}")


if __name__ == "__main__":
    main()
