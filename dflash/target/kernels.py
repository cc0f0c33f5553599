"""Weight matmuls of the fast engine: per row count, the fastest kernel measured here.

No CPU kernel wins everywhere. On the AMD EPYC (Zen 4) MKL's float32 GEMM runs at 3 GB/s
at 2-3 rows, where oneDNN's prepacked weights run near memory bandwidth; on the Intel Xeon
MKL is fastest at 1-3 rows and MKL's own packed GEMM at 8 (docs/results/engine-*.md). So
`tune` measures each candidate on the real weights of each shape, streamed the way a
forward streams them, and `Linear` calls the winner for each row count.

Invariants:
- Every candidate computes x @ W.T + b in the weight's dtype; they differ in rounding
  only (float32: within 1e-5 relative). Which one ran is recorded (`describe`).
- A candidate that fails on this machine (no oneDNN, no MKL) is skipped, never an error;
  the dense `F.linear` is always there. On CUDA only the dense kernel runs.
- Choices hold for row counts up to `MAX_TUNED_ROWS`; larger inputs (prefill, batched
  regeneration) run the kernel tuned for `MAX_TUNED_ROWS` rows.
- Autograd never reaches a packed weight: with gradients enabled, `Linear` runs dense.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

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


KERNELS = {"dense": _dense, "onednn": _onednn, "mkl": _mkl}


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
        names = ["dense", "onednn"]
        if self.weight.dtype == torch.float32:
            names.append("mkl")
        return names

    def drop_unused(self) -> None:
        """Free packed copies that no row count chose."""
        used = set(self.choice.values())
        for kind in list(self._packed):
            if kind not in used:
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
def tune(linears: list[Linear], rows: tuple[int, ...] = (*TUNED_ROWS, MAX_TUNED_ROWS), repeats: int = 3) -> None:
    """Choose each linear's kernel per row count by timing the candidates on the linears of
    each shape in turn (all of them, as a forward streams them from memory)."""
    groups: dict[tuple, list[Linear]] = defaultdict(list)
    for linear in linears:
        groups[linear.shape_key].append(linear)
    for group in groups.values():
        names = _working(group[0])
        for count in rows:
            x = torch.randn(count, group[0].weight.shape[1], dtype=group[0].weight.dtype, device=group[0].weight.device)
            best = min(names, key=lambda name: _seconds(KERNELS[name], group, x, repeats))
            for linear in group:
                linear.choice[count] = best
        for linear in group:
            linear.drop_unused()


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


def _seconds(kernel, group: list[Linear], x: torch.Tensor, repeats: int) -> float:
    for linear in group[:2]:
        kernel(linear, x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for linear in group:
            kernel(linear, x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
