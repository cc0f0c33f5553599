"""Data-parallel training with 2 CPU processes (DDP over gloo): ranks see different
data, metrics are summed over ranks before dividing, the loss is normalised over the
global batch of ranks and accumulation steps, and Hydra launches stay in one run
directory per job (plain runs and multiruns)."""

import json
import textwrap
from pathlib import Path

import pytest
import torch

from dflash.drafter import load_drafter
from dflash.specs import DrafterSpec, TargetSpec
from dflash.toy.tiny import save_tiny_target
from dflash.training import TrainingSettings
from helpers.apps import run_python, write_conversations
from helpers.training import (
    UNEVEN_ANCHORS,
    concatenated,
    dflash_training_module,
    max_relative_difference,
    mean_of_means_gradients,
    uneven_rank_batches,
    whole_batch_gradients,
)

pytestmark = pytest.mark.slow


SCRIPT_HEAD = """
import json, sys
import torch
from lightning.pytorch.callbacks import Callback
from dflash.data.config import DataSpec
from dflash.methods import METHODS
from dflash.specs import DrafterSpec, TargetSpec
from dflash.training.config import TrainingSettings
from dflash.training.run import TrainJob, run_training
from dflash.training.settings import CheckpointSettings, LoggerSettings, TrainerSettings

torch.set_num_threads(1)
target_dir, data_path, out_dir = sys.argv[1:4]
"""

SCRIPT_JOB = """
job = TrainJob(
    target=TargetSpec(path=target_dir),
    drafter=DrafterSpec(num_layers=1, block_size=4, num_target_features=2),
    data=DataSpec(path=data_path, max_length=128, batch_size=2, val_fraction=0.25, num_workers=0),
    training=TrainingSettings(num_anchors=8),
    trainer=TrainerSettings(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=None, max_steps=MAX_STEPS, log_every_n_steps=1,
        val_check_interval=VAL_EVERY, check_val_every_n_epoch=None, enable_progress_bar=False,
    ),
    output_dir=out_dir,
    method=METHODS["dflash"],
    JOB_FIELDS
)
outcome = run_training(job, callbacks=[Recorder()])
print("global_step", outcome.global_step)
"""


def _run_ddp_script(tmp_path: Path, body: str, max_steps: int, val_every: int, job_fields: str) -> tuple[Path, str]:
    """Train the tiny target on 2 CPU ranks (DDP) with a job script: the shared imports, `body`
    (which defines the callback `Recorder`), the shared TrainJob with `job_fields` (source of
    keyword arguments) added; (its output directory, its stdout)."""
    target_dir = tmp_path / "target"
    save_tiny_target(str(target_dir), arch="qwen3", seed=0)  # built once, before the ranks start
    write_conversations(tmp_path / "chats.jsonl", 16)
    job = SCRIPT_JOB.replace("MAX_STEPS", str(max_steps)).replace("VAL_EVERY", str(val_every))
    script = tmp_path / "train_ddp.py"
    script.write_text(SCRIPT_HEAD + textwrap.dedent(body) + job.replace("JOB_FIELDS", job_fields.strip()))
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    result = run_python([str(script), str(target_dir), str(tmp_path / "chats.jsonl"), str(out_dir)], cwd=tmp_path)
    return out_dir, result.stdout


RECORDER_OF_ROWS_AND_SUMS = """
    class Recorder(Callback):
        '''Writes, per rank, the training sequences it saw and its LOCAL validation sums.'''

        def __init__(self):
            self.rows, self.val = [], None

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            for ids, real in zip(batch["input_ids"], batch["attention_mask"]):
                self.rows.append(ids[real].tolist())

        def on_validation_epoch_end(self, trainer, module):
            # Callbacks run before the module's hook, which syncs, logs and resets.
            metrics = module.val_metrics
            self.val = {name: getattr(metrics, name).tolist() for name in ("correct", "total", "weighted_loss", "weight")}

        def on_train_end(self, trainer, module):
            logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
            record = {"rank": trainer.global_rank, "world": trainer.world_size, "rows": self.rows, "val": self.val, "logged": logged}
            with open(f"{out_dir}/rank{trainer.global_rank}.json", "w") as f:
                json.dump(record, f)
    """


def test_two_ranks_see_different_data_and_metrics_are_summed_over_ranks(tmp_path):
    out_dir, _ = _run_ddp_script(tmp_path, RECORDER_OF_ROWS_AND_SUMS, 3, 3, "logger=LoggerSettings(kind='none'),")

    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    seen = [{tuple(row) for row in r["rows"]} for r in ranks]
    assert len(seen[0]) == len(seen[1]) == 3 * 2  # 3 steps of 2 sequences each
    assert not seen[0] & seen[1], "both ranks trained on the same sequences"

    # The logged validation metrics are global sums divided last (docs/design.md invariant 11), and
    # every rank logs the same value.
    correct = torch.tensor([r["val"]["correct"] for r in ranks]).sum(0)
    total = torch.tensor([r["val"]["total"] for r in ranks]).sum(0)
    assert all(torch.tensor(r["val"]["total"]).sum() > 0 for r in ranks)
    for k in range(1, 4):
        assert ranks[0]["logged"][f"val/acc_{k:02d}"] == pytest.approx(float(correct[k] / total[k]), abs=1e-6)
    loss = sum(r["val"]["weighted_loss"] for r in ranks) / sum(r["val"]["weight"] for r in ranks)
    assert ranks[0]["logged"]["val/loss"] == pytest.approx(loss, rel=1e-5)
    assert ranks[0]["logged"] == ranks[1]["logged"]
    assert load_drafter(str(out_dir / "drafter")).config.block_size == 4


GLOBAL_BATCH_SCRIPT = textwrap.dedent(
    """
    import sys
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import DataLoader, Dataset
    from dflash.specs import DrafterSpec, TargetSpec
    from dflash.training import TrainingSettings
    from helpers.training import dflash_training_module
    from helpers.training import UNEVEN_ANCHORS, uneven_rank_batches

    torch.set_num_threads(1)
    target_dir, out_dir = sys.argv[1:3]


    class ThisRanksBatches(Dataset):
        '''This rank's micro-batches of `uneven_rank_batches` (read once fit has made the process group).'''

        def __len__(self):
            return 2

        def __getitem__(self, index):
            return uneven_rank_batches()[torch.distributed.get_rank()][index]


    class Recorder(Callback):
        '''Writes, per rank, the gradients of the first optimizer step and the logged metrics.'''

        gradients = None

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 1 and self.gradients is None:
                self.gradients = {n: p.grad.clone() for n, p in module.drafter.named_parameters() if p.grad is not None}

        def on_train_end(self, trainer, module):
            logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
            record = {"world": trainer.world_size, "gradients": self.gradients, "logged": logged}
            torch.save(record, f"{out_dir}/rank{trainer.global_rank}.pt")


    module = dflash_training_module(
        TargetSpec(path=target_dir),
        DrafterSpec(num_layers=1, block_size=4, num_target_features=2),
        TrainingSettings(num_anchors=UNEVEN_ANCHORS, learning_rate=1e-3),
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=1, accumulate_grad_batches=2, log_every_n_steps=1,
        use_distributed_sampler=False, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[Recorder()],
    )
    trainer.fit(module, DataLoader(ThisRanksBatches(), batch_size=None))
    """
)


def test_two_ranks_with_accumulation_train_on_the_global_batch_mean(tmp_path):
    # Rank 0's micro-batches hold a few valid anchors, rank 1's many (docs/design.md invariant 10).
    target_dir = tmp_path / "target"
    save_tiny_target(str(target_dir), arch="qwen3", seed=0)
    script = tmp_path / "global_batch.py"
    script.write_text(GLOBAL_BATCH_SCRIPT)
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    run_python([str(script), str(target_dir), str(out_dir)], cwd=tmp_path)
    ranks = [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]

    # The same drafter (seed 0, as on both ranks) in one process, on the whole global batch.
    module = dflash_training_module(
        TargetSpec(path=str(target_dir)),
        DrafterSpec(num_layers=1, block_size=4, num_target_features=2),
        TrainingSettings(num_anchors=UNEVEN_ANCHORS, learning_rate=1e-3),
    )
    micro_batches = [b for rank in uneven_rank_batches() for b in rank]
    expected = whole_batch_gradients(module, micro_batches)
    assert max_relative_difference(mean_of_means_gradients(module, micro_batches), expected) > 0.2  # the test can fail
    for rank in ranks:
        assert max_relative_difference(rank["gradients"], expected) < 1e-5
    # The logged training loss is the same global ratio, on every rank.
    whole_loss = float(module.compute_loss(concatenated(micro_batches)).loss.detach())
    assert ranks[0]["logged"]["train/loss"] == pytest.approx(whole_loss, rel=1e-5)
    # every logged value is global, but each rank's own throughput and memory
    per_rank = ("train/tokens_per_s", "train/peak_mem_gib")
    assert {k: v for k, v in ranks[0]["logged"].items() if k not in per_rank} == {
        k: v for k, v in ranks[1]["logged"].items() if k not in per_rank
    }


def _hydra_ddp_args(tmp_path: Path, data: Path) -> list[str]:
    return [
        "experiment=tiny_cpu",
        f"paths.artifacts={tmp_path / 'artifacts'}",
        f"data.path={data}",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        "trainer.max_steps=2",
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false",
        "eval.after_train=false",
        "logger=none",
    ]


def _run_dirs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "artifacts" / "runs").iterdir())


def _prebuild_tiny_target(tmp_path: Path) -> None:
    save_tiny_target(str(tmp_path / "artifacts" / "targets" / "tiny_qwen3_random"), arch="qwen3", seed=0)


def test_ddp_launched_from_hydra_stays_in_one_run_directory(tmp_path):
    _prebuild_tiny_target(tmp_path)
    write_conversations(tmp_path / "chats.jsonl", 16)
    result = run_python(["-m", "dflash.train", *_hydra_ddp_args(tmp_path, tmp_path / "chats.jsonl")], cwd=tmp_path)
    assert "trained to global step 2" in result.stdout
    (run_dir,) = _run_dirs(tmp_path)  # rank 1 re-ran the command but made no directory of its own
    assert (run_dir / "train_ddp_process_1.log").is_file()  # ... it ran in this one
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2
    assert load_drafter(str(run_dir / "drafter")).config.num_hidden_layers == 1
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_hydra_multirun_with_ddp_runs_each_job_once(tmp_path):
    _prebuild_tiny_target(tmp_path)
    write_conversations(tmp_path / "chats.jsonl", 16)
    args = [*_hydra_ddp_args(tmp_path, tmp_path / "chats.jsonl"), "training.learning_rate=1e-3,2e-3"]
    result = run_python(["-m", "dflash.train", "-m", *args], cwd=tmp_path)
    # Each job trained once (a rank re-launching the sweep would run more jobs or hang).
    assert result.stdout.count("trained to global step 2") == 2
    run_dirs = _run_dirs(tmp_path)
    assert len(run_dirs) == 2
    rates = set()
    for run_dir in run_dirs:
        assert (run_dir / "train_ddp_process_1.log").is_file()
        checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
        assert checkpoint["global_step"] == 2
        rates.add(checkpoint["hyper_parameters"]["training"]["learning_rate"])
    assert rates == {1e-3, 2e-3}


TAU_REAL_RECORDER = """
    from dflash.eval.tau_real import TauRealProbe
    from dflash.methods import METHODS
    from dflash.training.tau_real import TauRealSettings


    class Recorder(Callback):
        '''Writes, per rank, the val/tau_real it logged (what its checkpoint callback compared).'''

        def on_train_end(self, trainer, module):
            logged = float(trainer.callback_metrics["val/tau_real"])
            with open(f"{out_dir}/rank{trainer.global_rank}.json", "w") as f:
                json.dump({"world": trainer.world_size, "tau_real": logged}, f)
    """
TAU_REAL_JOB_FIELDS = """
    checkpoint=CheckpointSettings(monitor="val/tau_real"),
    logger=LoggerSettings(kind="csv"),
    tau_real=TauRealProbe(TauRealSettings(every_n_validations=1, max_new_tokens=16), METHODS["dflash"], None),"""


def test_tau_real_under_two_ranks_is_logged_once_and_ranks_agree(tmp_path):
    import csv

    out_dir, stdout = _run_ddp_script(tmp_path, TAU_REAL_RECORDER, 4, 2, TAU_REAL_JOB_FIELDS)
    assert "global_step 4" in stdout

    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert ranks[0]["tau_real"] == ranks[1]["tau_real"]  # rank 0's value, broadcast
    (metrics,) = out_dir.glob("csv/version_*/metrics.csv")  # one logger, on rank 0
    with open(metrics, newline="") as f:
        logged = [(row["step"], float(row["val/tau_real"])) for row in csv.DictReader(f) if row.get("val/tau_real")]
    assert [step for step, _ in logged] == ["1", "3"]  # validations after 2 and 4 steps, once each
    assert logged[-1][1] == ranks[0]["tau_real"]
    assert json.loads((out_dir / "drafter" / "checkpoint.json").read_text())["monitor"] == "val/tau_real"
    assert (out_dir / "tau_curves.png").is_file()
