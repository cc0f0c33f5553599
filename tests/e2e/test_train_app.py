"""`python -m dflash.train` and `python -m dflash.export`: configs compose, the tiny recipe
trains through the real CLI, a killed run resumes at its step, exports load in the
evaluator, bad inputs exit 2 with one line naming the key, wandb offline logs."""

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dflash.cli.train import job_from_config, run_name_for
from dflash.drafter import load_drafter, save_drafter
from dflash.specs import DrafterSpec, TargetSpec, build_drafter, load_target
from dflash.toy.tiny import save_tiny_target
from helpers import REPO
from helpers.apps import compose_train, write_conversations

EXPERIMENTS = sorted(p.stem for p in (REPO / "dflash" / "conf" / "experiment").glob("*.yaml"))
QUICK = ["eval.after_train=false", "logger=none", "trainer.enable_progress_bar=false"]


def test_experiments_exist_and_start_with_their_command():
    assert {"qwen3_4b", "qwen3_8b", "llama31_8b", "tiny_cpu"} <= set(EXPERIMENTS)
    for name in EXPERIMENTS:
        lines = (REPO / "dflash" / "conf" / "experiment" / f"{name}.yaml").read_text().splitlines()
        assert lines[0] == "# @package _global_"  # Hydra reads the package from the first lines only
        header = [line for line in lines[1:] if line.startswith("#")]
        assert any(line.strip("# ").startswith(f"python -m dflash.train experiment={name}") for line in header), name


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_into_valid_settings(name):
    job = job_from_config(compose_train([f"experiment={name}"]))
    assert job.config["run_name"].startswith(name)
    assert job.trainer.max_steps > 0 or job.trainer.max_epochs


@pytest.mark.parametrize("name", ["qwen3_4b", "qwen3_8b", "llama31_8b"])
def test_paper_recipes_use_the_published_hyperparameters(name):
    job = job_from_config(compose_train([f"experiment={name}"]))
    assert (job.drafter.block_size, job.drafter.num_layers) == (16, 5)
    training = job.training
    assert (training.learning_rate, training.warmup_ratio, training.num_anchors, training.loss_gamma) == (6e-4, 0.04, 512, 7)
    assert (training.anchor_sampling, training.min_lr_ratio) == ("random", 0.0)
    trainer = job.trainer
    assert (trainer.max_epochs, trainer.max_steps, trainer.gradient_clip_val, trainer.precision) == (6, -1, 1.0, "bf16-mixed")
    assert (trainer.accelerator, trainer.strategy) == ("gpu", "ddp")
    assert job.data.max_length == 3072 and job.data.require_chat_template
    assert 0 < job.data.val_fraction < 1  # a held-out split
    if name.startswith("qwen3"):
        assert job.target.path == f"Qwen/Qwen3-{name[6:].upper()}" and "nemotron_codealpaca" in job.data.path
    else:
        assert job.target.path == "meta-llama/Llama-3.1-8B-Instruct" and "ultrachat_sharegpt" in job.data.path
        assert job.drafter.mask_token == "<|reserved_special_token_0|>"


def test_the_converged_recipe_is_the_peers_and_is_exported_as_trained():
    job = job_from_config(compose_train(["experiment=converged_qwen3_8b"]))
    drafter, training = job.drafter, job.training
    assert (drafter.num_layers, drafter.block_size, drafter.attention_window, drafter.block_causal) == (5, 16, 2048, True)
    assert (training.draft_vocab_size, training.loss, training.position_weights, training.dpace_alpha) == (None, "ce", "dpace", 0.5)
    assert (training.optimizer, training.learning_rate, training.muon_lr) == ("muon", 1e-4, 1e-3)
    assert (job.trainer.strategy, job.target.path) == ("ddp", "Qwen/Qwen3-8B")


def test_trainer_and_logger_groups_compose():
    fsdp = job_from_config(compose_train(["experiment=qwen3_8b", "trainer=fsdp", "logger=wandb", "logger.tags=[a,b]"]))
    assert fsdp.trainer.strategy == "fsdp" and fsdp.trainer.fsdp["sharding_strategy"] == "FULL_SHARD"
    assert (fsdp.logger.kind, fsdp.logger.group, fsdp.logger.tags) == ("wandb", "qwen3_8b", ["a", "b"])
    assert fsdp.logger.name == fsdp.config["run_name"]
    cpu = job_from_config(compose_train(["trainer=cpu", "data.path=chats.jsonl"]))
    assert (cpu.trainer.accelerator, cpu.trainer.precision, cpu.logger.kind) == ("cpu", "32-true", "csv")


def test_run_name_follows_the_command_line():
    assert run_name_for("tiny_cpu", "") == "tiny_cpu"
    assert run_name_for(None, "") == "train"
    a = run_name_for("tiny_cpu", "trainer.max_steps=4")
    assert a == run_name_for("tiny_cpu", "trainer.max_steps=4") and a.startswith("tiny_cpu-")
    assert a != run_name_for("tiny_cpu", "trainer.max_steps=5")
    # Keys that do not change what is trained keep the directory, so a re-run resumes.
    plain = compose_train(["experiment=tiny_cpu", "trainer.max_steps=4"]).run_name
    assert plain.startswith("tiny_cpu-")
    cosmetic = ["checkpoint.resume=never", "logger=wandb", "eval.after_train=true", "trainer.enable_progress_bar=false"]
    cosmetic += ["eval.tau_real.every_n_validations=1", "eval.tau_real.num_prompts=4", "eval.tau_real.max_new_tokens=16"]
    assert compose_train(["experiment=tiny_cpu", "trainer.max_steps=4", *cosmetic]).run_name == plain
    assert compose_train(["experiment=tiny_cpu", "trainer.max_steps=4", "training.num_anchors=8"]).run_name != plain


# --- the real CLI ---------------------------------------------------------------------


def _env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WANDB_API_KEY", None)
    return env


def _cli(args: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """An artifacts dir with the tiny target built, and a small conversation file."""
    root = tmp_path_factory.mktemp("train_app")
    save_tiny_target(str(root / "artifacts" / "targets" / "tiny_qwen3_random"), arch="qwen3", seed=0)
    write_conversations(root / "chats.jsonl", 16)
    return root


def _base(workspace: Path) -> list[str]:
    return [
        "dflash.train",
        "experiment=tiny_cpu",
        f"paths.artifacts={workspace / 'artifacts'}",
        f"data.path={workspace / 'chats.jsonl'}",
    ]


def _metrics_rows(run_dir: Path, version: int) -> list[dict]:
    import csv

    with open(run_dir / "csv" / f"version_{version}" / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def resumed_run(workspace):
    """The tiny recipe killed after its first checkpoint, then the same command again."""
    args = [
        *_base(workspace),
        "trainer.max_steps=60",
        "checkpoint.every_n_train_steps=5",
        "trainer.log_every_n_steps=1",
        "trainer.val_check_interval=30",
        "trainer.enable_progress_bar=false",
        "eval.benchmark.max_samples=1",
        "eval.decoding.max_new_tokens=8",
        "eval.warmup_tokens=0",
    ]
    runs = workspace / "artifacts" / "runs"
    process = subprocess.Popen(
        [sys.executable, "-m", *args], cwd=workspace, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 180
    while not list(runs.glob("*/checkpoints/last.ckpt")):
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.time() < deadline, "no checkpoint was written"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    (run_dir,) = runs.iterdir()
    killed_at = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    second = _cli(args, cwd=workspace)
    assert second.returncode == 0, second.stderr[-3000:]
    return run_dir, killed_at, second.stdout


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint(resumed_run):
    run_dir, killed_at, stdout = resumed_run
    assert 5 <= killed_at < 60 and killed_at % 5 == 0
    assert "resumed from" in stdout and "trained to global step 60" in stdout
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 60
    # The second process logged its first training step at the checkpoint's step, not 0.
    steps = [int(row["step"]) for row in _metrics_rows(run_dir, 1) if row.get("train/loss")]
    assert steps[0] == killed_at and steps[-1] == 59


@pytest.mark.slow
def test_tiny_recipe_exports_a_drafter_and_evaluates_it(resumed_run):
    run_dir, _, stdout = resumed_run
    drafter = load_drafter(str(run_dir / "drafter"))
    assert (drafter.config.block_size, drafter.config.num_hidden_layers) == (8, 1)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["tau"] >= 1.0 and results["lossless"] is True
    eval_rows = [row for row in _metrics_rows(run_dir, 1) if row.get("eval/tau")]
    assert float(eval_rows[-1]["eval/tau"]) == pytest.approx(results["tau"])
    assert "eval/speedup_vs_autoregressive" in eval_rows[-1]
    card = (run_dir / "drafter" / "README.md").read_text()  # rewritten with the evaluation's figures
    assert f"| tau (tokens per target forward, pooled) | {results['tau']:.2f} |" in card


@pytest.mark.slow
def test_export_takes_the_best_checkpoint_by_validation_tau_sim(resumed_run):
    """Validations at steps 30 and 60 (after resume): the exported drafter is the best one's."""
    run_dir, _, stdout = resumed_run
    # the logger's step is the optimizer step count minus one; checkpoints store the count
    validations = [(float(row["val/tau_sim"]), int(row["step"]) + 1) for row in _metrics_rows(run_dir, 1) if row.get("val/tau_sim")]
    assert [step for _, step in validations] == [30, 60]
    best_score, best_step = max(validations, key=lambda v: (v[0], -v[1]))  # ties: the first stays best
    info = json.loads((run_dir / "drafter" / "checkpoint.json").read_text())
    assert info == {
        "checkpoint": "best.ckpt",
        "global_step": best_step,
        "final_step": 60,
        "monitor": "val/tau_sim",
        "score": pytest.approx(best_score),
    }
    assert f"exporting the best checkpoint by val/tau_sim = {best_score:.4f}" in stdout
    best = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=False)
    assert best["global_step"] == best_step
    exported = load_drafter(str(run_dir / "drafter")).state_dict()
    assert all(torch.equal(best["state_dict"][f"drafter.{name}"], tensor) for name, tensor in exported.items())
    if best_step != 60:  # then the last checkpoint's weights are another drafter's
        last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
        assert not all(torch.equal(last[f"drafter.{name}"], tensor) for name, tensor in exported.items())


@pytest.mark.slow
def test_export_cli_writes_a_drafter_the_evaluator_loads(resumed_run, workspace, tmp_path):
    run_dir, _, _ = resumed_run
    source = json.loads((run_dir / "drafter" / "checkpoint.json").read_text())["checkpoint"]
    exported = _cli(["dflash.export", f"ckpt={run_dir / 'checkpoints' / source}", f"out={tmp_path / 'drafter'}"], cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    trained = load_drafter(str(run_dir / "drafter")).state_dict()
    assert all(torch.equal(trained[k], v) for k, v in load_drafter(str(tmp_path / "drafter")).state_dict().items())
    # the card of a checkpoint in its run directory reads the run's config and results.json
    assert (tmp_path / "drafter" / "README.md").read_text() == (run_dir / "drafter" / "README.md").read_text().replace(
        str(run_dir / "drafter"), str(tmp_path / "drafter")
    )
    evaluated = _cli(
        [
            "dflash.evaluate",
            f"drafter.path={tmp_path / 'drafter'}",
            f"paths.artifacts={workspace / 'artifacts'}",
            "benchmark.max_samples=1",
            "decoding.max_new_tokens=8",
            "hf_generate=false",
            "warmup_tokens=0",
            f"hydra.run.dir={tmp_path / 'eval'}",
        ],
        cwd=tmp_path,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["drafter_block_size"] == 8


def test_export_cli_errors_name_the_key(tmp_path):
    missing = _cli(["dflash.export", f"ckpt={tmp_path / 'nothing.ckpt'}", f"out={tmp_path / 'out'}"], cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.strip().startswith("error: ckpt:")
    assert len(missing.stderr.strip().splitlines()) == 1


# --- bad inputs: exit status 2, one line naming the key --------------------------------


@pytest.fixture(scope="module")
def bad_inputs(workspace):
    """Files for the bad-input cases: prompts without responses, a drafter for a narrower target."""
    with open(workspace / "prompts_only.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"question {i}?"}]}) + "\n")
    narrow = load_target(TargetSpec(path=str(workspace / "narrow_target"), build={"arch": "qwen3", "hidden_size": 32}))
    save_drafter(build_drafter(DrafterSpec(num_layers=1, block_size=4), narrow), str(workspace / "narrow_drafter"))
    return workspace


BAD_INPUTS = {
    "no_response": (["data.path={ws}/prompts_only.jsonl"], "data.path"),
    "drafter_width": (["drafter.path={ws}/narrow_drafter"], "drafter.path"),
    "num_anchors": (["training.num_anchors=0"], "training.num_anchors"),
    "block_size": (["drafter.block_size=1"], "drafter.block_size"),
    "missing_data": (["data.path={ws}/does_not_exist.jsonl"], "data.path"),
    "chat_template": (["data.require_chat_template=true"], "data.require_chat_template"),
    "unknown_key": (["trainer.bogus=1"], "trainer.bogus"),
    "bad_type": (["trainer.max_steps=many"], "trainer.max_steps"),
    "select": (["checkpoint.select=worst"], "checkpoint.select"),
    "monitor": (["checkpoint.monitor=train/loss"], "checkpoint.monitor"),
    "max_minutes": (["trainer.max_minutes=0"], "trainer.max_minutes"),
    "tau_real_monitor_off": (["checkpoint.monitor=val/tau_real"], "checkpoint.monitor"),
    "tau_real_monitor_interval": (
        ["checkpoint.monitor=val/tau_real", "eval.tau_real.every_n_validations=2"],
        "checkpoint.monitor",
    ),
    "tau_real_no_validation": (["eval.tau_real.every_n_validations=1", "data.val_fraction=0"], "eval.tau_real.every_n_validations"),
    "tau_real_prompts": (["eval.tau_real.num_prompts=0"], "eval.tau_real.num_prompts"),
    "init_from_target": (["drafter.init_from_target=true", "drafter.intermediate_size=24"], "drafter.init_from_target"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line_naming_the_key(case, bad_inputs, monkeypatch, capsys):
    from dflash.cli import train

    overrides, key = BAD_INPUTS[case]
    argv = [*_base(bad_inputs)[1:], *QUICK, f"run_name=bad_{case}", *(o.format(ws=bad_inputs) for o in overrides)]
    monkeypatch.setattr(sys, "argv", ["dflash.train", *argv])
    with pytest.raises(SystemExit) as exit_info:
        train.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {key}:"), err
    assert "Traceback" not in "\n".join(err)


def test_bad_input_from_the_real_entry_point(workspace):
    result = _cli([*_base(workspace), *QUICK, "training.num_anchors=0"], cwd=workspace)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: training.num_anchors: must be >= 1")


# --- wandb, offline ------------------------------------------------------------------


def read_wandb_records(path: Path) -> list:
    """Protobuf records of an offline run file (run-*.wandb): a LevelDB-style log of
    32 KiB blocks, each record chunk prefixed by crc32 (4 bytes), length (2), type (1)."""
    from wandb.proto import wandb_internal_pb2

    raw, block, position, chunks, records = path.read_bytes(), 32768, 7, b"", []
    while position + 7 <= len(raw):
        room = block - position % block
        if room < 7:
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", raw[position : position + 7])
        position += 7
        if kind == 0 and length == 0:  # zero padding up to the end of the block
            position += room - 7
            continue
        chunks += raw[position : position + length]
        position += length
        if kind in (1, 4):  # FULL or LAST chunk: the record is complete
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


@pytest.mark.slow
def test_wandb_offline_run_holds_the_config_and_per_position_metrics(workspace):
    args = [
        *_base(workspace),
        "logger=wandb",
        "logger.offline=true",
        "run_name=wandb_offline",
        "trainer.max_steps=4",
        "trainer.log_every_n_steps=2",
        "trainer.val_check_interval=4",
        "trainer.enable_progress_bar=false",
        "eval.after_train=false",
        "eval.tau_real.every_n_validations=1",
        "eval.tau_real.max_new_tokens=8",
    ]
    result = _cli(args, cwd=workspace)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = workspace / "artifacts" / "runs" / "wandb_offline"
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    records = read_wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.run_id) == (
        "wandb_offline",
        "tiny_cpu",
        (run_dir / "wandb_run_id.txt").read_text(),
    )
    config = {
        item.key: json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") == "config"
        for item in r.config.update
    }
    assert config["training"]["learning_rate"] == 3e-3 and config["trainer"]["max_steps"] == 4
    history = [item for r in records if r.WhichOneof("record_type") == "history" for item in r.history.item]
    logged = {item.key or "/".join(item.nested_key) for item in history}
    assert {f"{split}/acc_{k:02d}" for split in ("train", "val") for k in range(1, 8)} <= logged
    assert {"train/loss", "train/tau_sim", "val/tau_sim"} <= logged
    assert {"val/tau_real", "val/tau_real_lossless", "val/tau_real_seconds"} <= logged  # eval.tau_real
    assert {"train/grad_norm", "train/tokens_per_s", "train/lr/matrices"} <= logged
    (artifact,) = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]  # logger.log_drafter
    assert (artifact.name, artifact.type) == ("drafter-wandb_offline", "model")
    files = {entry.path for entry in artifact.manifest.contents}
    assert {"config.json", "model.safetensors", "dflash.py", "README.md", "checkpoint.json"} <= files
