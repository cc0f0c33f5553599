"""Training progress of a Lightning fit for logs that are not a terminal.

In a log file or a pipe a progress bar shows nothing readable; there `LineProgress`
writes one plain line at most every `interval_s` seconds instead:

    train: step 120/1600 (8%), loss 3.412, 2.71 steps/s, elapsed 0:00:44, ETA 0:09:06

Invariants:
- On a terminal Lightning's own bar shows progress and no lines are written; elsewhere
  no bar is drawn (`training_progress` decides both from one `isatty()`).
- Lines come from global rank 0 only, through the `dflash.progress` logger
  (so a Hydra app's console and its log file both get them).
- `loss` is the mean training loss of the optimizer steps since the previous line;
  rate and ETA count only the steps run by this process (a resumed run does not claim
  the steps of its predecessor).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from dflash.progress import PROGRESS_INTERVAL_S, budget_timer, format_duration, is_interactive

log = logging.getLogger("dflash.progress")  # the logger of the invariants above, not this module's name


def training_progress(enabled: bool, label: str = "train", interval_s: float = PROGRESS_INTERVAL_S) -> tuple[bool, list[Callback]]:
    """How to show training progress: (draw Lightning's progress bar?, extra callbacks): on a terminal the
    bar, else a `LineProgress`. enabled: `trainer.enable_progress_bar`; False shows neither."""
    if not enabled:
        return False, []
    if is_interactive():
        return True, []
    return False, [LineProgress(label, interval_s)]


class LineProgress(Callback):
    """Log `<label>: step N/M (P%), loss L, R steps/s, elapsed E, ETA T` at most every
    `interval_s` seconds of training, after validation (its metrics), and at the last step.

    clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(self, label: str = "train", interval_s: float = PROGRESS_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.interval_s = interval_s
        self.clock = clock
        self._started = self._last_line = 0.0
        self._start_step = 0
        self._loss_sum = 0.0
        self._loss_count = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self._started = self._last_line = self.clock()
        self._start_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._loss_sum += float(loss)
            self._loss_count += 1
        now = self.clock()
        total = _total_steps(trainer)
        last_step = total is not None and trainer.global_step >= total
        if now - self._last_line >= self.interval_s or last_step:
            self._write(trainer, now)

    def on_train_end(self, trainer, pl_module) -> None:
        # A time budget ends training at a step no one knew in advance: its line comes here.
        if self._loss_count:
            self._write(trainer, self.clock())

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return  # the sanity check, or trainer.validate() outside training
        metrics = trainer.callback_metrics
        values = [
            f"{name} {float(metrics[key]):.3f}"
            for name, key in (("loss", "val/loss"), ("tau_sim", "val/tau_sim"))
            if key in metrics
        ]
        if values and trainer.is_global_zero:
            log.info("%s: validation at step %d: %s", self.label, trainer.global_step, ", ".join(values))

    def _write(self, trainer, now: float) -> None:
        self._last_line = now
        step, total = trainer.global_step, _total_steps(trainer)
        elapsed = now - self._started
        done = step - self._start_step
        parts = [f"step {step}/{total} ({100 * step / max(1, total):.0f}%)" if total is not None else f"step {step}"]
        if self._loss_count:
            parts.append(f"loss {self._loss_sum / self._loss_count:.3f}")
        if done > 0 and elapsed > 0:
            rate = done / elapsed
            parts += [f"{rate:.2f} steps/s", f"elapsed {format_duration(elapsed)}"]
            eta = (total - step) / rate if total is not None else None
            remaining = _time_remaining(trainer)
            if remaining is not None:  # a time budget: it ends training unless the steps run out first
                eta = remaining if eta is None else min(eta, remaining)
            parts.append(f"ETA {format_duration(eta)}")
        self._loss_sum, self._loss_count = 0.0, 0
        if trainer.is_global_zero:
            log.info("%s: %s", self.label, ", ".join(parts))


def _total_steps(trainer) -> int | None:
    """The optimizer steps this fit will run in all (max_steps, else Lightning's estimate);
    None when only a time budget bounds it."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return trainer.max_steps
    estimate = trainer.estimated_stepping_batches
    return int(estimate) if math.isfinite(estimate) else None


def _time_remaining(trainer) -> float | None:
    """Seconds left of the time budget, if there is one."""
    timer = budget_timer(trainer)
    return None if timer is None else timer.time_remaining("train")
