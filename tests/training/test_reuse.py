"""A sweep job reuses a finished job with the same training and evaluation config, and nothing else."""

from __future__ import annotations

import json
import os

from dflash.training.reuse import REUSED_FILE, cell_config, fingerprint, reuse_finished_cell


def config(**changes) -> dict:
    """A resolved train config of a sweep job, as `job.config` holds it."""
    base = {
        "sweep": {"name": "depth_smollm2", "ablation": "depth", "axes": [{"label": "layers"}]},
        "logger": {"kind": "csv", "group": "depth_smollm2", "tags": ["depth"]},
        "run_name": "depth_smollm2/drafter.num_layers=3,seed=0",
        "paths": {"artifacts": "/art", "output_dir": "/art/sweeps/depth_smollm2/drafter.num_layers=3,seed=0"},
        "cpu_threads": 1,
        "seed": 0,
        "drafter": {"num_layers": 3, "block_size": 8, "num_target_features": 3},
        "training": {"learning_rate": 1e-3, "position_weights": "gamma"},
        "trainer": {"max_steps": 300, "enable_progress_bar": True},
        "checkpoint": {"resume": "auto", "every_n_train_steps": 100},
        "eval": {"benchmark": {"name": "smollm2_mix"}, "decoding": {"max_new_tokens": 64}},
    }
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = base
        for part in parents:
            node = node[part]
        node[leaf] = value
    return base


def finished_job(root, sweep: str, name: str, cfg: dict, tau: float = 1.5) -> str:
    """A job directory as a finished training job leaves it (cell.json, drafter, csv logs, results.json)."""
    job = os.path.join(root, sweep, name)
    assert reuse_finished_cell(str(root), job, cfg) is None  # nothing to reuse yet: it trains
    os.makedirs(os.path.join(job, "drafter"))
    with open(os.path.join(job, "drafter", "model.safetensors"), "wb") as f:
        f.write(b"weights")
    os.makedirs(os.path.join(job, "csv", "version_0"))
    with open(os.path.join(job, "csv", "version_0", "metrics.csv"), "w") as f:
        f.write("step,val/tau_sim\n300,1.4\n")
    with open(os.path.join(job, "results.json"), "w") as f:
        json.dump({"tau": tau, "config": cfg}, f)
    return job


def test_bookkeeping_keys_do_not_change_the_fingerprint_and_training_keys_do():
    other_sweep = config(
        sweep={"name": "target_features_smollm2", "ablation": "target_features"},
        logger__tags=["taps"],
        run_name="x",
        paths__output_dir="/elsewhere",
        cpu_threads=2,
        checkpoint__resume="never",
        trainer__enable_progress_bar=False,
    )
    assert fingerprint(other_sweep) == fingerprint(config())
    for change in ({"seed": 1}, {"drafter__num_layers": 5}, {"training__position_weights": "uniform"},
                   {"trainer__max_steps": 200}, {"checkpoint__every_n_train_steps": 50},
                   {"eval__decoding": {"max_new_tokens": 128}}):  # fmt: skip
        assert fingerprint(config(**change)) != fingerprint(config()), change
    assert "sweep" not in cell_config(config()) and "resume" not in cell_config(config())["checkpoint"]


def test_a_job_copies_its_finished_twin_from_another_sweep_and_keeps_its_own_config(tmp_path):
    twin = finished_job(tmp_path, "block_size_smollm2", "drafter.block_size=8,seed=0", config(sweep={"name": "block_size"}))
    mine = os.path.join(tmp_path, "depth_smollm2", "drafter.num_layers=3,seed=0")
    cfg = config()
    assert reuse_finished_cell(str(tmp_path), mine, cfg) == twin
    with open(os.path.join(mine, "results.json")) as f:
        results = json.load(f)
    assert results["tau"] == 1.5 and results["config"] == cfg  # its own sweep node: the depth table sees it
    with open(os.path.join(mine, "drafter", "model.safetensors"), "rb") as f:
        assert f.read() == b"weights"
    assert os.path.isfile(os.path.join(mine, "csv", "version_0", "metrics.csv"))
    with open(os.path.join(mine, REUSED_FILE)) as f:
        assert json.load(f)["job"] == twin
    # a later job with the same cell copies the job that trained, not the copy
    third = os.path.join(tmp_path, "loss_smollm2", "training.position_weights=gamma,seed=0")
    assert reuse_finished_cell(str(tmp_path), third, config(sweep={"name": "loss"})) == twin


def test_unfinished_different_or_own_jobs_are_not_reused(tmp_path):
    # a twin that has not finished (no results.json): this job trains
    running = os.path.join(tmp_path, "block_size_smollm2", "drafter.block_size=8,seed=0")
    assert reuse_finished_cell(str(tmp_path), running, config()) is None
    mine = os.path.join(tmp_path, "depth_smollm2", "drafter.num_layers=3,seed=0")
    assert reuse_finished_cell(str(tmp_path), mine, config()) is None
    assert not os.path.exists(os.path.join(mine, "results.json"))
    # a finished job with another seed is another cell
    finished_job(tmp_path, "anchors_smollm2", "training.anchor_sampling=random,seed=1", config(seed=1))
    assert reuse_finished_cell(str(tmp_path), mine, config()) is None
    # a job that finished itself is left as it is when re-run
    own = finished_job(tmp_path, "loss_smollm2", "x", config(seed=2))
    assert reuse_finished_cell(str(tmp_path), own, config(seed=2)) is None
    assert not os.path.exists(os.path.join(own, REUSED_FILE))
