"""The real loop's acceptance length while training (`eval.tau_real`): the drafter as it
is at a validation, decoded greedily by the real speculative loop on a fixed set of
held-out prompts and checked against the target's own greedy output, logged as
`val/tau_real` beside the simulated `val/tau_sim`.

`TauRealCallback` schedules and logs; what decodes is a probe built above this layer
(`dflash.eval.tau_real.TauRealProbe`), so every trained method is measured through its own
evaluation (`Method.evaluation`).

Invariants:
- Prompts: chosen once, at the first evaluation: `num_prompts` rows of the validation
  split (`data.val_fraction`, never trained on) spread evenly over it, each cut before its
  first response token (the prompt the target answered; `held_out_prompts`). The same
  prompts at every evaluation, resumed runs included.
- Weights: the ones the export would write at that step: the module's full state dict
  (gathered onto rank 0 under any strategy) written by the method's `Method.export`
  (in `checkpoint.export_dtype`) into a temporary directory and read back by the method's
  evaluation in the target's dtype, as the evaluation after training reads `drafter/`.
- tau is results.json's `tau`: tokens emitted per verify step, bonus token counted, pooled
  over all verify steps of all prompts (docs/design.md invariants 11 and 16).
- Ranks: every rank takes part in the state dict and in one broadcast; global rank 0 alone
  decodes while the others wait in the broadcast (keep it under the process group's
  timeout). Every rank logs rank 0's values, so `val/tau_real` can rank checkpoints
  (`checkpoint.monitor`); loggers write them once.
- The evaluation leaves torch's RNG as it found it: a run trains the same weights with it
  on or off.
- Schedule: at every `every_n_validations`-th validation of the fit (counted across
  resumes) and at the end of training, unless the last validation measured the final step.
- Steps: the loggers get the values in the rows of the validation that measured them (at the
  end: logged directly). Lightning numbers a validation's rows (metrics.csv `step`, wandb
  `trainer/global_step`) one less than the optimizer steps done, and the end's rows follow
  suit; the plot and `history` count optimizer steps done (`trainer.global_step`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from dflash.errors import require
from dflash.layout import DRAFTER_DIR, TAU_CURVES
from dflash.training.settings import KEY, TauRealSettings, check_tau_real  # noqa: F401 - read from here too

log = logging.getLogger(__name__)

METRICS = ("tau_real", "tau_real_lossless", "tau_real_seconds")  # logged under val/


def held_out_prompts(rows, indices, count: int) -> list[torch.Tensor]:
    """Up to `count` prompts (1, P) long, from tokenised `rows` (`dflash.data.tokenize.TokenizedRows`)
    at row `indices` (the validation split), spread evenly over them: each row's tokens
    before its first response token (loss_mask 1). Rows with no prompt token are skipped."""
    indices = np.asarray(indices)
    picks = np.unique(np.linspace(0, len(indices) - 1, num=min(count, len(indices))).round().astype(int)) if len(indices) else []
    prompts = []
    for row in indices[picks]:
        start, stop = int(rows.offsets[row]), int(rows.offsets[row + 1])
        first_response = int(np.argmax(rows.loss_mask[start:stop] > 0))
        if first_response > 0:
            prompts.append(torch.as_tensor(rows.input_ids[start : start + first_response], dtype=torch.long)[None])
    return prompts


class TauRealCallback(Callback):
    """Logs `val/tau_real`, `val/tau_real_lossless` (1.0: every output equals the target's
    greedy one) and `val/tau_real_seconds` (the call's wall time on rank 0, the stall of
    training) on the schedule of the module invariants, then writes `tau_curves.png` into `output_dir`.

    probe: `.settings` (`TauRealSettings`) and `.measure(target, drafter_dir, prompts)` ->
        {"tau", "lossless", "first_mismatch", "num_tokens", "baseline_seconds"}.
    export: the method's `Method.export`; export_dtype: `checkpoint.export_dtype` as a
        torch dtype (None: the training dtype).
    """

    def __init__(self, probe, export: Callable, export_dtype: torch.dtype | None, output_dir: str):
        self.probe = probe
        self.settings: TauRealSettings = probe.settings
        self.export = export
        self.export_dtype = export_dtype
        self.output_dir = output_dir
        self.validations = 0
        self.history: list[dict] = []  # {"step", "tau_sim", "tau_real"} per validation and at the end
        self.last_step: int | None = None  # the step of the latest evaluation
        self.prompts: list[torch.Tensor] | None = None
        self._measured: float | None = None  # tau_real of the running validation, for its history entry

    @property
    def state_key(self) -> str:
        return "RealTauCallback"  # its name before the rename: older checkpoints resume with their history

    # --- schedule -----------------------------------------------------------------------

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self.validations += 1
        if self.validations % self.settings.every_n_validations:
            return
        values = self.evaluate(trainer, pl_module)
        self._measured = values["tau_real"]
        # Rank 0's values on every rank (broadcast): checkpoint callbacks on all ranks agree.
        # float64 tensors: Lightning would round a Python float to float32.
        metrics = {f"val/{name}": torch.tensor(float(values[name]), dtype=torch.float64) for name in METRICS}
        pl_module.log_dict(metrics, sync_dist=False)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        tau_sim = trainer.callback_metrics.get("val/tau_sim")  # the module logs it after this callback's epoch end
        self.history.append(
            {"step": trainer.global_step, "tau_sim": None if tau_sim is None else float(tau_sim), "tau_real": self._measured}
        )
        self._measured = None

    def on_train_end(self, trainer, pl_module) -> None:
        if self.last_step != trainer.global_step:
            values = self.evaluate(trainer, pl_module)
            self.history.append({"step": trainer.global_step, "tau_sim": None, "tau_real": values["tau_real"]})
            if trainer.is_global_zero:
                step = max(0, trainer.global_step - 1)  # Lightning's step of validation rows (module docstring)
                for logger in trainer.loggers:
                    logger.log_metrics({f"val/{name}": float(values[name]) for name in METRICS}, step=step)
        if trainer.is_global_zero:
            path = plot_tau_curves(self.history, os.path.join(self.output_dir, TAU_CURVES))
            if path is not None:
                log.info("tau_sim and tau_real against the step: %s", path)

    # --- one evaluation -----------------------------------------------------------------

    def evaluate(self, trainer, pl_module) -> dict:
        """Measure the current weights (rank 0) and give every rank the values."""
        state = trainer.strategy.lightning_module_state_dict()  # every rank: FSDP gathers onto rank 0
        values = self.measure(trainer, pl_module, state) if trainer.is_global_zero else None
        values = trainer.strategy.broadcast(values, src=0)
        self.last_step = trainer.global_step
        return values

    def measure(self, trainer, pl_module, state: dict) -> dict:
        """Export `state` (the module's state dict) as the method's drafter directory and
        decode the held-out prompts with it; the values to log, with the call's seconds."""
        start = time.perf_counter()
        if self.prompts is None:
            self.prompts = self._choose_prompts(trainer)
        checkpoint = {"state_dict": state}
        pl_module.on_save_checkpoint(checkpoint)  # the drafter's config, as every checkpoint holds it
        device = pl_module.target.device
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=[device] if device.type == "cuda" else []))
            stack.enter_context(torch.inference_mode(False))
            stack.enter_context(torch.autocast(device.type, enabled=False))
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="dflash-tau-real-"))
            drafter_dir = self.export(checkpoint, os.path.join(directory, DRAFTER_DIR), self.export_dtype)
            result = self.probe.measure(pl_module.target, drafter_dir, self.prompts)
        seconds = time.perf_counter() - start
        step = trainer.global_step
        log.info(
            "tau_real at step %d: %.3f on %d held-out prompts (%d tokens, %s), %.1f s%s",
            step, result["tau"], len(self.prompts), result["num_tokens"],
            "lossless" if result["lossless"] else "NOT lossless", seconds,
            f" ({result['baseline_seconds']:.1f} s of it the target's greedy outputs, computed once)"
            if result["baseline_seconds"] else "",
        )  # fmt: skip
        if not result["lossless"]:
            log.warning(
                "tau_real at step %d: the real loop's output differs from the target's greedy output (%s); in float32 "
                "this is a bug, in bf16/fp16 it may be a near-tie: python -m dflash.evaluate on the exported drafter "
                "diagnoses it (docs/design.md invariant 18)",
                step, result["first_mismatch"],
            )  # fmt: skip
        return {"tau_real": result["tau"], "tau_real_lossless": float(result["lossless"]), "tau_real_seconds": seconds}

    def _choose_prompts(self, trainer) -> list[torch.Tensor]:
        datamodule = getattr(trainer, "datamodule", None)
        rows, val_set = getattr(datamodule, "rows", None), getattr(datamodule, "val_set", None)
        require(
            rows is not None and val_set is not None,
            KEY,
            "decodes held-out rows of a DFlashDataModule; train through python -m dflash.train or pass one",
        )
        prompts = held_out_prompts(rows, val_set.indices, self.settings.num_prompts)
        require(len(prompts) > 0, KEY, "no held-out row has a prompt to decode; raise data.val_fraction")
        if len(prompts) < self.settings.num_prompts:
            log.info("tau_real: %d held-out prompts (%s.num_prompts=%d)", len(prompts), KEY, self.settings.num_prompts)
        return prompts

    # --- resume -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"validations": self.validations, "history": list(self.history), "last_step": self.last_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.validations = state_dict.get("validations", 0)
        self.history = list(state_dict.get("history", []))
        self.last_step = state_dict.get("last_step")


def plot_tau_curves(history: list[dict], path: str) -> str | None:
    """val/tau_sim and val/tau_real of `history` ({"step", "tau_sim", "tau_real"} entries,
    None where not measured) against the optimizer step, as a PNG at `path`; None when
    there is nothing to draw."""
    sim = [(h["step"], h["tau_sim"]) for h in history if h.get("tau_sim") is not None]
    real = [(h["step"], h["tau_real"]) for h in history if h.get("tau_real") is not None]
    if not sim and not real:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    from dflash.fileio import atomic_write

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for points, label, marker in ((sim, "val/tau_sim (simulated)", "o"), (real, "val/tau_real (real loop)", "s")):
        if points:
            ax.plot(*zip(*points), marker=marker, label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("tau (tokens per verify step)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, lambda temporary: fig.savefig(temporary, dpi=120, format="png"))
    plt.close(fig)
    return path
