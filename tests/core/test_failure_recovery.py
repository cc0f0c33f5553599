"""Nothing silently wrong, nothing stuck (issue 11, runtime half): a truncated last.ckpt
falls back to the previous checkpoint, a checkpoint of another drafter shape is one line,
unfinished regenerated data is refused unless `data.allow_partial`, empty data names
`data.path`, a second job on a run or output directory fails naming the first (a killed
one is taken over), and output files get the user's umask permissions. Each case is
followed by the next good run, which must succeed."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from dflash.data import DataSpec, RegenerateSettings, shard_paths
from dflash.data.datamodule import DFlashDataModule
from dflash.data.generators import Generated
from dflash.data.regenerate import regenerate
from dflash.drafter import save_drafter
from dflash.errors import ConfigError
from dflash.fileio import atomic_write, write_text
from dflash.layout import Results
from dflash.locks import LOCK_FILE, DirectoryLock
from dflash.methods import METHODS
from dflash.specs import DrafterSpec, TargetSpec, build_drafter
from dflash.toy.tiny import byte_tokenizer, save_tiny_target
from dflash.training.checkpoints import KeepPreviousCheckpointIO, resume_checkpoint
from dflash.training.config import TrainingSettings
from dflash.training.run import TrainJob, run_training
from dflash.training.settings import CheckpointSettings, LoggerSettings, TrainerSettings
from helpers import REPO
from helpers.apps import write_conversations

HOLDER_SCRIPT = (
    "import sys, time\n"
    "from dflash.locks import DirectoryLock\n"
    "DirectoryLock(sys.argv[1], 'key', 'remedy').acquire()\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


@contextmanager
def held_by_another_process(directory: Path):
    """A separate process holding `directory`'s lock; yields it (the caller may kill it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-c", HOLDER_SCRIPT, str(directory)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def holder_named(process) -> str:
    return f"process {process.pid} on host {socket.gethostname()}"


# --- locks -------------------------------------------------------------------------------


def test_a_lock_file_this_user_cannot_open_is_one_line(tmp_path, monkeypatch):
    """Another user's killed job leaves its lock file (mode 0644): opening it is refused. Tests
    run as root, where modes do not bite, so the refusal is injected at `os.open`."""
    import dflash.locks

    (tmp_path / dflash.locks.LOCK_FILE).write_text(json.dumps({"pid": 4242, "host": "node17", "since": "then"}))

    def refuse(path, *args):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(dflash.locks.os, "open", refuse)
    with pytest.raises(ConfigError) as caught:
        DirectoryLock(str(tmp_path), "run_name", "pick another run_name=NAME").acquire()
    message = str(caught.value)
    assert message.startswith("run_name: cannot open the lock file") and "process 4242 on host node17" in message
    assert "delete the file, or pick another run_name=NAME" in message


def test_a_locked_directory_names_its_holder_and_a_killed_holder_is_taken_over(tmp_path, caplog):
    with held_by_another_process(tmp_path) as holder:
        with pytest.raises(ConfigError) as err:
            DirectoryLock(str(tmp_path), "run_name", "pick another run_name=NAME").acquire()
        assert err.value.key == "run_name"
        assert f"{tmp_path} is in use by {holder_named(holder)}" in str(err.value) and "pick another run_name=NAME" in str(
            err.value
        )
        holder.send_signal(signal.SIGKILL)  # a killed job leaves its lock file, not its lock
        holder.wait()
        assert (tmp_path / LOCK_FILE).is_file()
        with caplog.at_level(logging.WARNING, logger="dflash.locks"):
            with DirectoryLock(str(tmp_path), "run_name", "pick another run_name=NAME"):
                with DirectoryLock(str(tmp_path), "run_name", "..."):  # the same process may nest
                    pass
                assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert f"taking over the lock of {holder_named(holder)}" in caplog.text
    assert not (tmp_path / LOCK_FILE).exists()  # released by the outermost holder


class FakeGenerator:
    """Answers every prompt with a fixed text; counts the prompts it answered."""

    name = "fake"

    def __init__(self):
        self.prompts = 0

    def __call__(self, prompts):
        self.prompts += len(prompts)
        return [Generated(text=f"answer {i}", num_tokens=2) for i in range(len(prompts))]


def test_second_regeneration_into_a_directory_fails_before_generating(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"question {i}?"}]} for i in range(5)]
    settings = RegenerateSettings(batch_size=2, shard_size=2)
    out = tmp_path / "regenerated"
    generator = FakeGenerator()
    with held_by_another_process(out) as holder:
        with pytest.raises(ConfigError) as err:
            regenerate(None, rows, str(out), settings, generator=generator, progress=False)
        assert err.value.key == "regenerate.output_dir" and holder_named(holder) in str(err.value)
    assert generator.prompts == 0 and not shard_paths(str(out))

    partial = out / ".rows-00000000-00000002.jsonl.otherhost-123-abcdef01.tmp"  # a killed writer's shard
    partial.write_text('{"messages": [')
    regenerate(None, rows, str(out), settings, generator=generator, progress=False)
    assert generator.prompts == 5 and len(shard_paths(str(out))) == 3
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *(os.path.basename(p) for p in shard_paths(str(out)))]


def test_second_evaluation_into_a_run_directory_exits_2_naming_the_first(tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    from dflash.cli.common import CONF_DIR
    from dflash.cli.evaluate import _hydra_main

    run_dir = tmp_path / "eval"
    overrides = [
        f"paths.root={tmp_path}",
        f"paths.artifacts={tmp_path / 'artifacts'}",
        f"paths.output_dir={run_dir}",
        "benchmark.max_samples=1",
        "decoding.max_new_tokens=4",
        "hf_generate=false",
        "warmup_tokens=0",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=overrides)
    with held_by_another_process(run_dir) as holder:
        with pytest.raises(SystemExit) as exit_info:
            _hydra_main(cfg)
        assert exit_info.value.code == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith(f"error: hydra.run.dir: {run_dir} is in use by {holder_named(holder)}") and "\n" not in error
    assert not (run_dir / "results.json").exists()
    _hydra_main(cfg)  # the first job is gone: the next evaluation runs
    assert json.loads((run_dir / "results.json").read_text())["num_prompts"] == 1
    assert not (run_dir / LOCK_FILE).exists()


# --- permissions and atomic writes ------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_output_files_get_the_users_umask_permissions(umask, mode, tmp_path, qwen3_target):
    saved = os.umask(umask)
    try:
        Results(tau=1.0).write(str(tmp_path / "results.json"))
        save_drafter(build_drafter(DrafterSpec(num_layers=1, block_size=4), qwen3_target), str(tmp_path / "drafter"))
        KeepPreviousCheckpointIO().save_checkpoint({"global_step": 1}, str(tmp_path / "checkpoints" / "last.ckpt"))
        regenerate(
            None,
            [{"messages": [{"role": "user", "content": "hi"}]}],
            str(tmp_path / "data"),
            generator=FakeGenerator(),
            progress=False,
        )
    finally:
        os.umask(saved)
    written = [tmp_path / "results.json", tmp_path / "drafter" / "config.json", tmp_path / "drafter" / "model.safetensors"]
    written += [
        tmp_path / "checkpoints" / "last.ckpt",
        tmp_path / "data" / "manifest.json",
        Path(shard_paths(str(tmp_path / "data"))[0]),
    ]
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in written} == {path.name: mode for path in written}


def test_atomic_writes_keep_the_old_file_on_failure_and_never_share_a_temporary(tmp_path):
    path = tmp_path / "out.txt"
    write_text(str(path), "old")

    def fails(temporary):
        Path(temporary).write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(str(path), fails)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]

    temporaries = []

    def outer(temporary):
        temporaries.append(temporary)
        Path(temporary).write_text("outer")
        atomic_write(str(path), inner)  # a second writer of the same file meanwhile

    def inner(temporary):
        temporaries.append(temporary)
        Path(temporary).write_text("inner")

    atomic_write(str(path), outer)
    assert temporaries[0] != temporaries[1] and path.read_text() == "outer"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


# --- data ---------------------------------------------------------------------------------


def _write_shard(directory: Path, start: int, stop: int) -> None:
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}?"}, {"role": "assistant", "content": f"answer {i}!"}]}
        for i in range(start, stop)
    ]
    (directory / f"rows-{start:08d}-{stop:08d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_unfinished_regenerated_data_is_refused_unless_allow_partial(tmp_path, caplog):
    data = tmp_path / "regenerated"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"num_rows": 8, "settings": {"enable_thinking": False}}))
    _write_shard(data, 0, 4)
    tokenizer = byte_tokenizer(chat_template=True)
    spec = DataSpec(path=str(data), val_fraction=0.0, num_workers=0)
    with pytest.raises(ConfigError) as err:
        DFlashDataModule.from_spec(spec, tokenizer)
    assert err.value.key == "data.path" and "4 of the 8 rows" in str(err.value) and "data.allow_partial=true" in str(err.value)

    with caplog.at_level(logging.WARNING, logger="dflash.data.datamodule"):
        partial = DFlashDataModule.from_spec(
            DataSpec(path=str(data), val_fraction=0.0, num_workers=0, allow_partial=True), tokenizer
        )
    partial.setup("fit")
    assert len(partial.train_set) == 4 and "4 of the 8 rows its manifest.json lists are missing" in caplog.text

    _write_shard(data, 4, 8)  # regeneration finished: no flag needed
    complete = DFlashDataModule.from_spec(spec, tokenizer)
    complete.setup("fit")
    assert len(complete.train_set) == 8

    (data / "manifest.json").write_text('{"num_rows": 8, "sett')  # a manifest cut short
    with pytest.raises(ConfigError) as err:
        DFlashDataModule.from_spec(spec, tokenizer)
    assert err.value.key == "data.path" and "manifest.json is not valid JSON" in str(err.value)


# --- training: checkpoints, shapes, locks -------------------------------------------------


@pytest.fixture(scope="module")
def train_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("robust_train")
    save_tiny_target(str(root / "target"), arch="qwen3", seed=0)
    write_conversations(root / "chats.jsonl", 8)
    return root


def tiny_job(
    inputs: Path, run_dir: Path, max_steps: int, num_layers: int = 1, resume: str = "auto", data: Path | None = None
) -> TrainJob:
    return TrainJob(
        target=TargetSpec(path=str(inputs / "target")),
        drafter=DrafterSpec(num_layers=num_layers, block_size=4, num_target_features=2),
        data=DataSpec(path=str(data or inputs / "chats.jsonl"), max_length=128, batch_size=2, val_fraction=0.0, num_workers=0),
        training=TrainingSettings(num_anchors=4),
        trainer=TrainerSettings(
            max_epochs=None, max_steps=max_steps, log_every_n_steps=1, limit_val_batches=0, enable_progress_bar=False
        ),
        output_dir=str(run_dir),
        method=METHODS["dflash"],
        checkpoint=CheckpointSettings(every_n_train_steps=2, resume=resume),
        logger=LoggerSettings(kind="none"),
    )


def _global_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


def test_truncated_last_checkpoint_falls_back_to_the_previous_one(train_inputs, tmp_path, caplog):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    assert run_training(tiny_job(train_inputs, run_dir, max_steps=4)).global_step == 4
    assert _global_step(checkpoints / "previous.ckpt") == 4 and _global_step(checkpoints / "last.ckpt") == 4
    raw = (checkpoints / "last.ckpt").read_bytes()
    (checkpoints / "last.ckpt").write_bytes(raw[: len(raw) // 2])  # a disk that filled up mid-write
    (checkpoints / ".last.ckpt.otherhost-99-0badc0de.tmp").write_bytes(raw[:100])  # a killed atomic write

    with caplog.at_level(logging.WARNING, logger="dflash.training.run"):
        resumed = run_training(tiny_job(train_inputs, run_dir, max_steps=6))
    assert resumed.resumed_from == str(checkpoints / "previous.ckpt") and resumed.global_step == 6
    assert f"{checkpoints / 'last.ckpt'} cannot be read" in caplog.text
    assert (checkpoints / "last.ckpt.corrupt").read_bytes() == raw[: len(raw) // 2]  # kept aside, never kept as previous
    assert _global_step(checkpoints / "last.ckpt") == 6 and _global_step(checkpoints / "previous.ckpt") == 6
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "last.ckpt.corrupt", "previous.ckpt"]

    again = run_training(tiny_job(train_inputs, run_dir, max_steps=8))  # the next run resumes as usual
    assert again.resumed_from == str(checkpoints / "last.ckpt") and again.global_step == 8

    # A checkpoint of another drafter shape in the run directory: one line, nothing changed.
    before = (checkpoints / "last.ckpt").read_bytes()
    with pytest.raises(ConfigError) as err:
        run_training(tiny_job(train_inputs, run_dir, max_steps=10, num_layers=2))
    assert err.value.key == "run_name"
    assert "holds a checkpoint of another drafter (num_hidden_layers 1 there, 2 here" in str(err.value)
    assert "checkpoint.resume=never" in str(err.value)
    assert (checkpoints / "last.ckpt").read_bytes() == before and not (run_dir / LOCK_FILE).exists()
    fresh = run_training(tiny_job(train_inputs, run_dir, max_steps=2, num_layers=2, resume="never"))
    assert fresh.resumed_from is None and fresh.global_step == 2


def test_unreadable_checkpoints_without_a_fallback_name_the_files_to_delete(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "last.ckpt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ConfigError) as err:
        resume_checkpoint("auto", str(checkpoints))
    assert err.value.key == "resume" and f"delete {checkpoints / 'last.ckpt'}" in str(err.value)

    (checkpoints / "previous.ckpt").write_bytes(b"")
    with pytest.raises(ConfigError) as err:
        resume_checkpoint("auto", str(checkpoints))
    assert "neither" in str(err.value) and "delete both" in str(err.value)

    with pytest.raises(ConfigError) as err:
        resume_checkpoint(str(checkpoints / "previous.ckpt"), str(checkpoints))
    assert err.value.key == "resume" and "cannot read" in str(err.value)

    (checkpoints / "previous.ckpt").unlink()  # killed between keeping previous.ckpt and writing last.ckpt
    torch.save({"state_dict": {}, "global_step": 3}, checkpoints / "previous.ckpt")
    (checkpoints / "last.ckpt").unlink()
    assert resume_checkpoint("auto", str(checkpoints)) == str(checkpoints / "previous.ckpt")


def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    last = tmp_path / "last.ckpt"
    writer = KeepPreviousCheckpointIO()
    writer.save_checkpoint({"state_dict": {}, "global_step": 2}, str(last))

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(ConfigError) as err:
        writer.save_checkpoint({"state_dict": {}, "global_step": 4}, str(last))
    assert err.value.key == "paths.artifacts" and "re-run the same command" in str(err.value)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["previous.ckpt"]
    assert resume_checkpoint("auto", str(tmp_path)) == str(tmp_path / "previous.ckpt")


def test_second_training_on_a_run_directory_fails_naming_the_first(train_inputs, tmp_path):
    run_dir = tmp_path / "run"
    with held_by_another_process(run_dir) as holder:
        with pytest.raises(ConfigError) as err:
            run_training(tiny_job(train_inputs, run_dir, max_steps=2))
        assert err.value.key == "run_name" and holder_named(holder) in str(err.value)
    assert [p.name for p in run_dir.iterdir()] == [LOCK_FILE]  # the killed holder's; nothing else written


def test_training_on_an_empty_file_names_data_path(train_inputs, tmp_path, monkeypatch, capsys):
    from dflash.cli import train

    empty = tmp_path / "empty.jsonl"
    empty.touch()
    argv = [
        "experiment=tiny_cpu",
        f"paths.artifacts={tmp_path / 'artifacts'}",
        f"target.path={train_inputs / 'target'}",
        f"data.path={empty}",
        "run_name=empty",
        "eval.after_train=false",
        "logger=none",
        "trainer.max_steps=2",
        "trainer.enable_progress_bar=false",
    ]
    monkeypatch.setattr(sys, "argv", ["dflash.train", *argv])
    with pytest.raises(SystemExit) as exit_info:
        train.main()
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == f"error: data.path: {str(empty)!r} is empty; point data.path at a file with rows"
    )

    write_conversations(empty, 8)  # the next run, with data, trains
    monkeypatch.setattr(sys, "argv", ["dflash.train", *argv])
    train.main()
    assert "trained to global step 2" in capsys.readouterr().out
