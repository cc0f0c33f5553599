"""Training doubles: the training module `python -m dflash.train` builds, a batch with
several loss-mask segments, random blocks and a softcapped head for the loss, and a
training job that can be killed after a checkpoint and resumed."""

from __future__ import annotations

import dataclasses

import torch
from lightning.pytorch.callbacks import Callback

from dflash.cli.train import job_from_config
from dflash.layout import CHECKPOINT_DIR
from dflash.methods import METHODS
from dflash.specs import DrafterSpec, TargetSpec, load_target
from dflash.training import DrafterTrainingModule, TrainingSettings
from dflash.training.blocks import Blocks
from dflash.training.checkpoints import LAST_CHECKPOINT
from helpers.apps import compose_train, write_conversations


def training_module(target: TargetSpec, method: str, settings, drafter: DrafterSpec, training: TrainingSettings):
    """The `DrafterTrainingModule` of `method` (`dflash.methods`), composed as `dflash.training.run` does."""
    loaded = load_target(target)
    return DrafterTrainingModule(loaded, METHODS[method].build_objective(loaded, settings, drafter, training), training, {})


def dflash_training_module(target: TargetSpec, drafter: DrafterSpec, training: TrainingSettings) -> DrafterTrainingModule:
    return training_module(target, "dflash", None, drafter, training)


def eagle3_training_module(target: TargetSpec, settings, training: TrainingSettings) -> DrafterTrainingModule:
    return training_module(target, "eagle3", settings, DrafterSpec(), training)


def module_for(artifacts, *overrides: str) -> DrafterTrainingModule:
    """The training module of `python -m dflash.train <overrides>` on the tiny target."""
    # data is read only by training runs; the module never opens it
    base = [f"paths.artifacts={artifacts}", "data.path=unused.jsonl", "drafter.num_layers=1"]
    job = job_from_config(compose_train([*base, *overrides]))
    return dflash_training_module(job.target, job.drafter, job.training)


def batch(seq_len=48, seed=0) -> dict:
    """Two right-padded sequences whose responses are broken into several loss-mask segments."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 256, (2, seq_len), generator=generator)
    attention_mask = torch.ones(2, seq_len, dtype=torch.bool)
    attention_mask[1, seq_len - 6 :] = False
    loss_mask = torch.zeros(2, seq_len, dtype=torch.bool)
    loss_mask[0, 6:20] = loss_mask[0, 24:27] = loss_mask[0, 30:45] = True
    loss_mask[1, 3:9] = loss_mask[1, 12:40] = True
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


# loss tests: batch, blocks per row, block size, hidden size, vocabulary, sequence length
BATCH, BLOCKS, B, D, V, S = 2, 5, 4, 8, 40, 30


def softcapped_head(seed=0, requires_grad=False):
    """A frozen head with a non-identity transform (Gemma-style final softcapping)."""
    head = torch.nn.Linear(D, V, bias=False).requires_grad_(requires_grad)
    torch.nn.init.normal_(head.weight, std=1.0, generator=torch.Generator().manual_seed(seed))
    return head, lambda hidden: torch.tanh(head(hidden) / 5.0) * 5.0


def random_blocks(seed=0) -> Blocks:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, V, (BATCH, BLOCKS * B), generator=generator)
    slots = torch.arange(B).repeat(BLOCKS)
    valid = (torch.rand(BATCH, BLOCKS * B, generator=generator) > 0.25) & (slots >= 1)
    anchors = torch.randint(0, S - B, (BATCH, BLOCKS), generator=generator)
    positions = (anchors[..., None] + torch.arange(B)).view(BATCH, -1)
    return Blocks(token_ids=labels, positions=positions, labels=labels, label_valid=valid, slots=slots)


# a short run of the tiny recipe, killed after a checkpoint and resumed
MAX_STEPS = 8
CHECKPOINT_EVERY = 3
LEARNING_RATE = 3e-3


class Killed(Exception):
    """Stands for SIGKILL: raised from inside training, after a checkpoint was written."""


class KillAtStep(Callback):
    """Raises `Killed` when `step` optimizer steps are done (before the next one)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise Killed


def training_job(tmp_path, run_name: str, conversations: int, *overrides: str):
    """The tiny recipe's job (composed config -> `job_from_config`), on `conversations` chats."""
    data = tmp_path / f"chats_{conversations}.jsonl"
    write_conversations(data, conversations)
    job = job_from_config(
        compose_train(
            [
                "experiment=tiny_cpu",
                f"paths.artifacts={tmp_path / 'artifacts'}",
                f"data.path={data}",
                "drafter.num_layers=1",
                "logger=none",
                "eval.after_train=false",
                "trainer.enable_progress_bar=false",
                f"trainer.max_steps={MAX_STEPS}",
                f"checkpoint.every_n_train_steps={CHECKPOINT_EVERY}",
                f"training.learning_rate={LEARNING_RATE}",
                *overrides,
            ]
        )
    )
    return dataclasses.replace(job, output_dir=str(tmp_path / run_name))


def checkpoint(job) -> dict:
    return torch.load(f"{job.output_dir}/{CHECKPOINT_DIR}/{LAST_CHECKPOINT}", map_location="cpu", weights_only=False)


# global normalisation: micro-batches with very different numbers of valid anchors
UNEVEN_SEQ_LEN = 24
UNEVEN_ANCHORS = UNEVEN_SEQ_LEN  # >= every row's valid anchors: all of them are taken, in order


def micro_batch(response: tuple[int, int], seed: int, rows: int = 2) -> dict:
    """`rows` full-length sequences of `UNEVEN_SEQ_LEN` random tokens, the loss mask on
    positions [response[0], response[1]) of each: (20, 22) opens one block per row with one
    valid slot (B = 4), (4, 24) 19 blocks and 54 valid slots per row."""
    input_ids = torch.randint(0, 256, (rows, UNEVEN_SEQ_LEN), generator=torch.Generator().manual_seed(seed))
    loss_mask = torch.zeros(rows, UNEVEN_SEQ_LEN, dtype=torch.bool)
    loss_mask[:, response[0] : response[1]] = True
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(loss_mask), "loss_mask": loss_mask}


def concatenated(batches: list[dict]) -> dict:
    """The micro-batches as one batch (rows stacked in order)."""
    return {key: torch.cat([b[key] for b in batches]) for key in batches[0]}


def drafter_gradients(module, loss_of) -> dict[str, torch.Tensor]:
    """{name: grad} of the drafter's parameters after `loss_of(module).backward()`; grads cleared after."""
    module.drafter.zero_grad(set_to_none=True)
    loss_of(module).backward()
    gradients = {name: p.grad.clone() for name, p in module.drafter.named_parameters() if p.grad is not None}
    module.drafter.zero_grad(set_to_none=True)
    return gradients


def whole_batch_gradients(module, batches: list[dict]) -> dict[str, torch.Tensor]:
    """The single-process gradient of the loss of all `batches` as one batch: sum w l / sum w over them all."""
    return drafter_gradients(module, lambda m: m.compute_loss(concatenated(batches)).loss)


def mean_of_means_gradients(module, batches: list[dict]) -> dict[str, torch.Tensor]:
    """The gradient of the mean over `batches` of each one's own ratio (per-batch normalisation)."""
    return drafter_gradients(module, lambda m: sum(m.compute_loss(b).loss for b in batches) / len(batches))


def max_relative_difference(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> float:
    """max over parameters of |left - right| / max |right| (the same names on both sides)."""
    assert left.keys() == right.keys() and left
    return max(float((left[n] - right[n]).abs().max() / right[n].abs().max().clamp_min(1e-30)) for n in right)


def uneven_rank_batches() -> list[list[dict]]:
    """Two micro-batches for each of two ranks: rank 0's hold 2 and 6 valid slots in all,
    rank 1's 108 and 120."""
    return [
        [micro_batch((20, 22), seed=1), micro_batch((17, 20), seed=2)],
        [micro_batch((4, 24), seed=3), micro_batch((2, 24), seed=4)],
    ]
