"""Training checkpoints: which one a run resumes from, whether it fits, and how it is written.

Invariants:
- A run's `checkpoints/` holds `last.ckpt` and `previous.ckpt` (the last.ckpt it
  replaced): every write is atomic (`dflash.fileio.atomic_write`, beside the destination),
  and last.ckpt becomes previous.ckpt just before it is replaced, so a kill or a full disk
  at any moment leaves at least one readable checkpoint.
- `resume="auto"` never trains from an unreadable file: a broken last.ckpt is renamed
  `last.ckpt.corrupt` (so it never becomes previous.ckpt) and the run resumes from
  previous.ckpt with a warning; with no readable checkpoint left, one line names the
  files to delete.
- A checkpoint of a drafter of another shape is a ConfigError naming the run, never a
  state_dict traceback.
- With validation and `checkpoint.select=best`, `best.ckpt` holds the best validation
  score so far (`best_checkpointer`); the exported drafter comes from it, and
  `drafter/checkpoint.json` names the checkpoint, its step and score.
"""

from __future__ import annotations

import errno
import logging
import os

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

from dflash.errors import ConfigError, require
from dflash.fileio import atomic_write, write_json
from dflash.layout import BEST_CHECKPOINT, DRAFTER_CONFIG_KEY, EXPORT_INFO_FILE, LAST_CHECKPOINT, PREVIOUS_CHECKPOINT

log = logging.getLogger(__name__)

CORRUPT_SUFFIX = ".corrupt"


def is_first_process() -> bool:
    """Rank 0 of node 0, known from the launcher's environment before any Trainer exists."""
    return rank_zero_only.rank == 0 and int(os.environ.get("NODE_RANK", "0")) == 0


def resume_checkpoint(resume: str, checkpoint_dir: str) -> str | None:
    """The checkpoint to resume from: None (fresh start) or a readable .ckpt path.

    With "auto": last.ckpt, or previous.ckpt (with a warning) when last.ckpt is missing or
    unreadable (then renamed `last.ckpt.corrupt` by the first process; module invariants).
    """
    if resume == "never":
        return None
    if resume != "auto":
        require(os.path.isfile(resume), "resume", f"expected auto, never or a checkpoint file; {resume!r} is none of these")
        problem = checkpoint_problem(resume)
        require(problem is None, "resume", f"cannot read {resume!r} ({problem}); pass another checkpoint, or auto or never")
        return os.path.abspath(resume)
    last = os.path.join(checkpoint_dir, LAST_CHECKPOINT)
    previous = os.path.join(checkpoint_dir, PREVIOUS_CHECKPOINT)
    last_problem = checkpoint_problem(last) if os.path.isfile(last) else "missing"
    if last_problem is None:
        return last
    if not os.path.isfile(previous):
        require(
            last_problem == "missing",
            "resume",
            f"{last} cannot be read ({last_problem}) and there is no {PREVIOUS_CHECKPOINT} to fall back to; "
            f"delete {last} to train this run from the start (or pass checkpoint.resume=never)",
        )
        return None
    previous_problem = checkpoint_problem(previous)
    require(
        previous_problem is None,
        "resume",
        f"neither {last} ({last_problem}) nor {previous} ({previous_problem}) can be read; "
        f"delete both to train this run from the start (or pass checkpoint.resume=never)",
    )
    if last_problem == "missing":
        log.warning("%s is missing (a run killed while replacing it?); resuming from %s", last, previous)
    else:
        if is_first_process():
            os.replace(last, last + CORRUPT_SUFFIX)
        log.warning(
            "%s cannot be read (%s); it is kept as %s and training resumes from %s",
            last,
            last_problem,
            last + CORRUPT_SUFFIX,
            previous,
        )
    return previous


def checkpoint_problem(path: str) -> str | None:
    """Why `path` cannot be resumed from (truncated, not a checkpoint, ...), or None if it can.

    Reads the file's structure only (tensors stay memory-mapped), so it is cheap.
    """
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 - whatever torch cannot read is not a checkpoint to resume from
        return " ".join(str(err).split()).split(". ")[0][:200] or type(err).__name__
    if not isinstance(checkpoint, dict) or not {"state_dict", "global_step"} <= set(checkpoint):
        return "not a Lightning training checkpoint"
    return None


# Drafter config.json keys that must agree for a checkpoint to continue this run.
_DRAFTER_SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "block_size",
    "num_target_layers",
    "dflash_config",
)


def check_checkpoint_fits(path: str, module, key: str) -> None:
    """ConfigError(key) unless checkpoint `path` holds a drafter of the module's shape."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    stored, current = checkpoint.get(DRAFTER_CONFIG_KEY, {}), module.drafter.config.to_hf_dict()
    differences = [
        f"{name} {stored.get(name)} there, {current.get(name)} here"
        for name in _DRAFTER_SHAPE_KEYS
        if stored.get(name) != current.get(name)
    ]
    if not differences:  # same config, yet other weights: name the first tensors that differ
        shapes = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
        stored_shapes = {name: tuple(tensor.shape) for name, tensor in checkpoint["state_dict"].items()}
        names = sorted(set(shapes) | set(stored_shapes))
        differences = [
            f"{name} {stored_shapes.get(name)} there, {shapes.get(name)} here"
            for name in names
            if shapes.get(name) != stored_shapes.get(name)
        ]
    require(
        not differences,
        key,
        f"{path} holds a checkpoint of another drafter ({'; '.join(differences[:3])}); train under a new "
        "run_name=NAME, or pass checkpoint.resume=never to start this run over (its checkpoints get replaced)",
    )


def best_checkpointer(checkpoint_dir: str, monitor: str, mode: str) -> ModelCheckpoint:
    """The callback that keeps `best.ckpt`: the checkpoint of the best `monitor` value
    ("max" or "min" `mode`), written right after the validation that measured it."""
    return ModelCheckpoint(
        dirpath=checkpoint_dir,
        filename=BEST_CHECKPOINT.removesuffix(".ckpt"),
        monitor=monitor,
        mode=mode,
        save_top_k=1,
        save_last=False,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )


def selected_checkpoint(best: ModelCheckpoint | None, final_checkpoint: str, final_step: int) -> str:
    """best.ckpt when it was kept, else the final checkpoint; logs which and why."""
    if best is not None and best.best_model_path and os.path.isfile(best.best_model_path):
        log.info(
            "exporting the best checkpoint by %s = %.4f (%s, step %d of %d)",
            best.monitor, float(best.best_model_score), best.best_model_path, checkpoint_step(best.best_model_path), final_step,
        )  # fmt: skip
        return best.best_model_path
    if best is not None:
        log.info("no validation measured %s during training: exporting the last checkpoint (step %d)", best.monitor, final_step)
    return final_checkpoint


def checkpoint_step(path: str) -> int:
    """The global step stored in a Lightning checkpoint (read without loading tensors)."""
    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"])


def write_export_info(drafter_dir: str, checkpoint: str, best: ModelCheckpoint | None, final_step: int) -> None:
    """drafter/checkpoint.json: {checkpoint, global_step, final_step, monitor, score} of the export's source."""
    chose_best = best is not None and checkpoint == best.best_model_path
    write_json(
        os.path.join(drafter_dir, EXPORT_INFO_FILE),
        {
            "checkpoint": os.path.basename(checkpoint),
            "global_step": checkpoint_step(checkpoint),
            "final_step": final_step,
            "monitor": best.monitor if chose_best else None,
            "score": float(best.best_model_score) if chose_best else None,
        },
        indent=2,
    )


class KeepPreviousCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, made atomic (written beside its destination, then renamed:
    `dflash.fileio.atomic_write`); an existing last.ckpt first becomes previous.ckpt."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = str(path)
        if os.path.basename(path) == LAST_CHECKPOINT and os.path.isfile(path):
            os.replace(path, os.path.join(os.path.dirname(path), PREVIOUS_CHECKPOINT))
        try:
            atomic_write(path, lambda temporary: torch.save(checkpoint, temporary))
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise ConfigError(
                "paths.artifacts",
                f"no space left to write {path} ({err.strerror}); free some space or move paths.artifacts to a "
                "bigger disk, then re-run the same command: it resumes from the last complete checkpoint",
            ) from None
