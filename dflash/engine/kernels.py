"""Weight matmuls of the fast engine: per row count, the fastest kernel measured here.

No CPU kernel wins everywhere: MKL's float32 GEMM falls far below memory bandwidth at a
few rows on some CPUs, oneDNN's bfloat16 at one row, and our own kernel
(`csrc/small_gemm.cpp`) is bound by arithmetic from 8 rows on (docs/design.md, "Measured
figures"). So `tune` times each candidate on the real weights of each shape, streamed as a
forward streams them, and `Linear` calls the winner per row count.

Our own kernels come from `native.module()` (csrc/, built for the instruction set this CPU
runs best).

Invariants:
- Every candidate computes x @ W.T + b in the weight's dtype; they differ in rounding
  only (float32: within 1e-5 relative). Which one ran is recorded (`describe`).
- A candidate that fails on this machine (no oneDNN, no MKL, no instruction set or no C++
  compiler for our kernel) is skipped, never an error; the dense `F.linear` is always
  there. On CUDA only the dense kernel runs.
- Choices hold for row counts up to `MAX_TUNED_ROWS`; larger inputs (prefill, batched
  regeneration) run the kernel tuned for `MAX_TUNED_ROWS` rows.
- Autograd never reaches a packed weight: with gradients enabled, `Linear` runs dense.
- Measured once per machine. A group's choices are kept in a JSON file
  (`$DFLASH_KERNEL_CHOICES`, default `~/.cache/dflash/kernel_choices.json`; `off` keeps
  nothing) under a key of everything that can change the winner: the CPU model and flags,
  torch's version, the thread count, our kernels' source and instruction set, the weights' shape, dtype and
  count, the row counts and the candidates. Another process with the same key reuses them
  instead of measuring again; a key that differs in anything is measured.
- Attention of a few new positions (`attention_plan` once per forward, then `run_attention`
  per layer; `csrc/decode_attention.cpp`, in the same module) computes what SDPA computes
  (float32: within 1e-5 relative, bfloat16: within its rounding) or returns None, and the
  engine runs SDPA: it is never an error.
- The layer ops (`layer_ops`, `csrc/layer_ops.cpp`, the same module) run where the module
  does, on CPU in float32 or bfloat16, under inference mode; else PyTorch's ops run.
- `argmax` equals `Tensor.argmax(-1)` index for index; it uses our kernel only where this
  process has already loaded the module (it never starts a build).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

import dflash.engine.native as native
from dflash.fileio import read_json, write_json
from dflash.locks import lock_file

log = logging.getLogger(__name__)

#: row counts tuned one by one; a row count in between uses the next one up
TUNED_ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
MAX_TUNED_ROWS = 64


def _dense(linear: Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, linear.weight, linear.bias)


def _onednn(linear: Linear, x: torch.Tensor) -> torch.Tensor:
    packed = linear.packed("onednn", lambda w: torch.ops.mkldnn._reorder_linear_weight(w, 4))
    shape = x.shape
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), packed, linear.bias, "none", [], "")
    return out.view(*shape[:-1], out.shape[-1])


def _mkl(linear: Linear, x: torch.Tensor) -> torch.Tensor:
    packed = linear.packed("mkl", lambda w: torch.ops.mkl._mkl_reorder_linear_weight(w, 4))
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    out = torch.ops.mkl._mkl_linear(flat, packed, linear.weight, linear.bias, flat.shape[0])
    return out.view(*shape[:-1], out.shape[-1])


def _ours(linear: Linear, x: torch.Tensor) -> torch.Tensor:
    ops = native.module()
    packed = linear.packed(f"ours/{ops.isa}", lambda weight: pack(weight, tile_columns(ops, weight)))
    shape = x.shape
    out = ops.small_linear(x.reshape(-1, shape[-1]).contiguous(), packed, linear.bias, linear.weight.shape[0])
    return out.view(*shape[:-1], out.shape[-1])


def tile_columns(ops, weight: torch.Tensor) -> int:
    """Output columns per packed tile of our GEMM in `ops` (a kernel module) for this weight's dtype."""
    return ops.tile_columns[str(weight.dtype).removeprefix("torch.")]


def pack(weight: torch.Tensor, tile: int) -> torch.Tensor:
    """The layout of csrc/small_gemm.cpp: tiles of `tile` output rows, k-major (bfloat16: k in pairs)."""
    n, k = weight.shape
    if weight.dtype == torch.float32:
        return weight.view(n // tile, tile, k).transpose(1, 2).contiguous()
    return weight.view(n // tile, tile, k // 2, 2).permute(0, 2, 1, 3).contiguous()


KERNELS = {"dense": _dense, "onednn": _onednn, "mkl": _mkl, "ours": _ours}


def _bucket(rows: int) -> int:
    for tuned in TUNED_ROWS:
        if rows <= tuned:
            return tuned
    return MAX_TUNED_ROWS


class Linear:
    """A frozen linear layer whose kernel is chosen per row count (module invariants)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight = weight.detach().contiguous()
        self.bias = None if bias is None else bias.detach().contiguous()
        self._packed: dict[str, torch.Tensor] = {}
        self.choice: dict[int, str] = {}

    @property
    def shape_key(self) -> tuple:
        return (*self.weight.shape, self.weight.dtype, self.bias is not None)

    def packed(self, kind: str, pack) -> torch.Tensor:
        if kind not in self._packed:
            self._packed[kind] = pack(self.weight)
        return self._packed[kind]

    def candidates(self) -> list[str]:
        if self.weight.device.type != "cpu":
            return ["dense"]
        names = ["dense"]
        if torch.backends.mkldnn.is_available():
            names.append("onednn")
        if self.weight.dtype == torch.float32 and torch.backends.mkl.is_available():  # none in aarch64 builds
            names.append("mkl")
        n, k = self.weight.shape
        ops = native.module() if self.weight.dtype in (torch.float32, torch.bfloat16) and k % 2 == 0 else None
        if ops is not None and n % tile_columns(ops, self.weight) == 0:
            names.append("ours")
        return names

    def drop_unused(self) -> None:
        """Free packed copies that no row count chose."""
        used = set(self.choice.values())
        for kind in list(self._packed):
            if kind.split("/")[0] not in used:  # "ours/<isa>": our kernel's layout for one instruction set
                del self._packed[kind]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            return _dense(self, x)
        rows = x.numel() // x.shape[-1]
        return KERNELS[self.choice.get(_bucket(rows), "dense")](self, x)

    def describe(self) -> str:
        """The kernels chosen, e.g. 'dense(1-3) mkl(4-16)'."""
        if not self.choice:
            return "dense"
        runs: list[list] = []
        for rows in sorted(self.choice):
            kind = self.choice[rows]
            if runs and runs[-1][0] == kind:
                runs[-1][2] = rows
            else:
                runs.append([kind, rows, rows])
        return " ".join(f"{kind}({lo}-{hi})" if lo != hi else f"{kind}({lo})" for kind, lo, hi in runs)


@torch.inference_mode()
def tune(linears: list[Linear], rows: tuple[int, ...] = (*TUNED_ROWS, MAX_TUNED_ROWS), repeats: int = 5) -> None:
    """Choose each linear's kernel per row count: the choices kept for this machine and
    these weights (module invariants), else measured and kept."""
    groups: dict[tuple, list[Linear]] = defaultdict(list)
    for linear in linears:
        groups[linear.shape_key].append(linear)
    for group in groups.values():
        key = _choice_key(group, rows)
        choice = _kept_choice(key, group[0], rows)
        if choice is None:
            choice = _measure(group, rows, repeats)
            _keep_choice(key, choice)
        for linear in group:
            linear.choice = dict(choice)
            linear.drop_unused()


def _measure(group: list[Linear], rows: tuple[int, ...], repeats: int) -> dict[int, str]:
    """The fastest kernel per row count, timed on the linears of one shape in turn (all of
    them, as a forward streams them from memory). Each repeat times every row count and
    candidate once, so the repeats of one pair are spread over the whole measurement, and a
    pair's fastest repeat decides: a slow spell of a shared machine only adds time, and it
    cannot cover every repeat."""
    names = _working(group[0])
    weight = group[0].weight
    inputs = {count: torch.randn(count, weight.shape[1], dtype=weight.dtype, device=weight.device) for count in rows}
    for name in names:  # warm: packs the weights, pages them in
        _sweep(KERNELS[name], group, inputs[rows[0]])
    times: dict[tuple[int, str], float] = {}
    for _ in range(repeats):
        for count, x in inputs.items():
            for name in names:
                seconds = _sweep(KERNELS[name], group, x)
                times[count, name] = min(seconds, times.get((count, name), seconds))
    return {count: min(names, key=lambda name: times[count, name]) for count in rows}


def choices_path() -> str | None:
    """The file of kept choices (None: `DFLASH_KERNEL_CHOICES=off`)."""
    path = os.environ.get("DFLASH_KERNEL_CHOICES")
    if path == "off":
        return None
    if not path:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(cache, "dflash", "kernel_choices.json")
    return path


@functools.cache
def _machine() -> str:
    """The CPU model and its flags, torch's version and our kernels' source, as one digest."""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = "".join(sorted({line for line in f if line.startswith(("model name", "flags"))}))
    except OSError:
        cpu = platform.processor()
    return hashlib.sha256(cpu.encode() + torch.__version__.encode() + native.source_text()).hexdigest()[:16]


def _choice_key(group: list[Linear], rows: tuple[int, ...]) -> str | None:
    linear = group[0]
    if linear.weight.device.type != "cpu" or choices_path() is None:
        return None
    ops = native.module()
    parts = [_machine(), ops and ops.isa, torch.get_num_threads(), *linear.shape_key, len(group), rows, linear.candidates()]
    return json.dumps(parts, default=str)


def _kept_choice(key: str | None, linear: Linear, rows: tuple[int, ...]) -> dict[int, str] | None:
    kept = read_json(choices_path()) if key else None
    kept = kept.get(key) if isinstance(kept, dict) else None
    if not isinstance(kept, dict) or sorted(kept) != sorted(str(count) for count in rows):
        return None
    choice = {int(count): name for count, name in kept.items()}
    return choice if set(choice.values()) <= set(linear.candidates()) else None


def _keep_choice(key: str | None, choice: dict[int, str]) -> None:
    """Add one key's choices to the file (under a lock: two processes tuning at once keep
    both); a file that cannot be written costs a measurement next time, never an error."""
    if key is None:
        return
    path = choices_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".lock", "w") as held:
            lock_file(held)
            kept = read_json(path)
            kept = kept if isinstance(kept, dict) else {}
            kept[key] = {str(count): name for count, name in choice.items()}
            write_json(path, kept)
    except (OSError, ValueError) as error:
        log.warning("engine: could not keep the kernel choices in %s (%s)", path, error)


def _working(linear: Linear) -> list[str]:
    """The candidates that run here and agree with the dense kernel."""
    x = torch.randn(3, linear.weight.shape[1], dtype=linear.weight.dtype, device=linear.weight.device)
    reference = _dense(linear, x).float()
    tolerance = 1e-4 if linear.weight.dtype == torch.float32 else 5e-2
    names = []
    for name in linear.candidates():
        try:
            out = KERNELS[name](linear, x).float()
        except (RuntimeError, AttributeError, NotImplementedError):
            linear._packed.pop(name, None)
            continue
        scale = reference.abs().max().clamp_min(1e-6)
        if out.shape == reference.shape and float((out - reference).abs().max() / scale) <= tolerance:
            names.append(name)
    return names


def _sweep(kernel, group: list[Linear], x: torch.Tensor) -> float:
    """Seconds to run `kernel` once over every linear of the group."""
    start = time.perf_counter()
    for linear in group:
        kernel(linear, x)
    return time.perf_counter() - start


_ATTENTION_HEAD_DIMS = (64, 128, 256)
_attention_broken = False


def attention_plan(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor | None] | None:
    """(the mask expanded to (batch, 1, q, keys),) where our decode-attention kernel computes
    softmax(query keys^T / sqrt(d) + mask) values for tensors like these, as SDPA with
    `enable_gqa` does (query (b, heads, q, d); keys, values (b, kv_heads, L, d), views of a
    cache, any strides with the last one 1, never copied); None, and the caller runs SDPA:
    not CPU, not float32 or bfloat16 throughout, a head_dim other than 64/128/256, a mask
    that is not boolean or does not broadcast, gradients, or no kernel on this machine."""
    batch, heads, q, head_dim = query.shape
    if (
        _attention_broken
        or query.device.type != "cpu"
        or head_dim not in _ATTENTION_HEAD_DIMS
        or query.dtype not in (torch.float32, torch.bfloat16)
        or keys.dtype != query.dtype
        or values.dtype != query.dtype
        or heads % keys.shape[1]
        or keys.stride(-1) != 1
        or values.stride(-1) != 1
        or (torch.is_grad_enabled() and not torch.is_inference_mode_enabled())
        or native.module() is None
    ):
        return None
    if mask is not None:
        if mask.dtype != torch.bool or mask.dim() > 4 or (mask.dim() == 4 and mask.shape[1] != 1):
            return None
        try:
            mask = mask.expand(batch, 1, q, keys.shape[2])
        except RuntimeError:
            return None
    return (mask,)


def run_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
    """Our kernel on tensors `attention_plan` accepted (mask: the plan's); None, and SDPA from
    then on, if the kernel fails."""
    global _attention_broken
    if _attention_broken:
        return None
    if query.stride(-1) != 1:
        query = query.contiguous()
    try:
        return native.module().decode_attention(query, keys, values, mask, query.shape[-1] ** -0.5)
    except (RuntimeError, AttributeError) as error:  # a module built without it, a shape it refuses
        _attention_broken = True
        log.warning("engine: our attention kernel failed (%s); SDPA from now on", str(error)[:200])
        return None


def layer_ops(like: torch.Tensor):
    """Our fused layer ops (`csrc/layer_ops.cpp`: RMSNorm after an optional residual add,
    SiLU-and-multiply, rotary embedding into the cache) for tensors like this one, or None
    and the engine runs PyTorch's ops: not CPU, not float32 or bfloat16, or no kernel on this
    machine. Callers run under inference mode (the ops have no backward) and check the
    widths and dtypes (rows of multiples of 16, head_dim of 32, one dtype)."""
    return native.module() if like.device.type == "cpu" and like.dtype in (torch.float32, torch.bfloat16) else None


def attention_available(like: torch.Tensor) -> bool:
    """Whether our attention kernel can run for tensors like this one (device, dtype, a built kernel)."""
    return not _attention_broken and layer_ops(like) is not None


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(-1)`, equal to it index for index (the first maximum; the first NaN if
    any), through our kernel for contiguous float32 or bfloat16 CPU rows where this process
    has loaded it: torch's CPU argmax compares one value at a time, ours 16 at once."""
    ops = layer_ops(logits) if native.module.cache_info().currsize else None
    if ops is None or logits.dim() == 0 or logits.shape[-1] == 0 or not logits.is_contiguous():
        return logits.argmax(-1)
    return ops.argmax_rows(logits).view(logits.shape[:-1])
