"""Synthetic sweep results on disk (and as fake wandb runs) for the tables tests."""

from __future__ import annotations

import csv
import json
import os

DEPTH_AXES = [{"label": "drafter layers", "key": "config.drafter.num_layers"}]
BLOCK_AXES = [
    {"label": "train B", "key": ["results.drafter_block_size", "config.train_block_size"]},
    {"label": "inference B", "key": "results.block_size"},
]
LOSS_AXES = [{"label": "loss weights", "key": "config.training.loss_gamma", "names": {"auto": "decay", "None": "uniform"}}]


def train_config(
    sweep: str,
    ablation: str,
    axes: list,
    *,
    seed: int = 0,
    benchmark: str = "humaneval",
    temperature: float = 0.0,
    target: str = "/art/targets/tiny_code",
    **groups,
) -> dict:
    """A resolved train-app config with a `sweep` node (as results.json's `config` holds it)."""
    config = {
        "sweep": {"name": sweep, "ablation": ablation, "axes": axes, "app": "train"},
        "seed": seed,
        "target": {"path": target},
        "drafter": {"path": None, "num_layers": 1, "block_size": 8},
        "training": {"loss_gamma": "auto", "anchor_sampling": "random"},
        "eval": {"benchmark": {"name": benchmark}, "decoding": {"block_size": None, "temperature": temperature}},
    }
    for group, values in groups.items():
        config.setdefault(group, {}).update(values)
    return config


def results_for(
    config: dict,
    tau: float,
    speedup: float,
    *,
    block_size: int | None = None,
    drafter_block_size: int | None = None,
    timestamp: str = "2026-11-21T10:00:00+00:00",
) -> dict:
    """results.json content (the fields the tables read) for a run of `config`."""
    evaluation = config.get("eval", config)
    trained = drafter_block_size or config["drafter"]["block_size"]
    block = block_size or trained
    accepted = [0] * block
    accepted[0], accepted[min(block - 1, 2)] = 10, 20  # some steps of 1 token, more of 3
    return {
        "benchmark": evaluation["benchmark"]["name"],
        "method": "dflash",
        "target": config["target"]["path"],
        "drafter": "somewhere",
        "block_size": block,
        "drafter_block_size": trained,
        "temperature": evaluation["decoding"]["temperature"],
        "tau": tau,
        "acceptance_histogram": accepted,
        "speedup": {"vs_autoregressive": speedup, "vs_hf_generate": None},
        "tokens_per_s": {"dflash": 100.0 * speedup, "autoregressive": 100.0, "hf_generate": None},
        "timestamp": timestamp,
        "config": config,
    }


def write_run(
    run_dir: str, config: dict, results: dict | None = None, error: str | None = None, accuracies: list[float] | None = None
) -> str:
    """A run directory: .hydra/config.yaml always; results.json, error.json, metrics.csv if given."""
    import yaml

    os.makedirs(os.path.join(run_dir, ".hydra"), exist_ok=True)
    with open(os.path.join(run_dir, ".hydra", "config.yaml"), "w") as f:
        yaml.safe_dump(config, f)
    if results is not None:
        with open(os.path.join(run_dir, "results.json"), "w") as f:
            json.dump(results, f)
    if error is not None:
        with open(os.path.join(run_dir, "error.json"), "w") as f:
            json.dump({"status": "failed", "exception": error, "traceback": "Traceback ...\n" + error}, f)
    if accuracies is not None:
        # Two logger versions (a resumed run): the later one's last row wins.
        for version, scale in ((0, 0.5), (1, 1.0)):
            path = os.path.join(run_dir, "csv", f"version_{version}", "metrics.csv")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            keys = [f"val/acc_{k:02d}" for k in range(1, len(accuracies) + 1)]
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=["step", "train/loss", *keys])
                writer.writeheader()
                writer.writerow({"step": 10, "train/loss": 2.0})
                writer.writerow({"step": 20, **{k: a * scale for k, a in zip(keys, accuracies)}})
    return run_dir


def depth_tau(layers: int, seed: int) -> float:
    return 1.5 + 0.3 * layers + 0.1 * seed


def depth_speedup(layers: int, seed: int) -> float:
    return 2.0 - 0.05 * (layers - 3) ** 2 + 0.1 * seed


def make_depth_sweep(root: str) -> None:
    """depth_cpu: layers 1, 3, 5, 8 x seeds 0, 1 on HumanEval; layers 8 seed 1 failed;
    GSM8K only for layers 1 and 3 (so layers 5 and 8 have no GSM8K cell)."""
    for layers in (1, 3, 5, 8):
        for seed in (0, 1):
            config = train_config("depth_cpu", "depth", DEPTH_AXES, seed=seed, drafter={"num_layers": layers})
            run_dir = os.path.join(root, "depth_cpu", f"drafter.num_layers={layers},seed={seed}")
            if (layers, seed) == (8, 1):
                write_run(run_dir, config, error="torch.OutOfMemoryError: CUDA out of memory")
                continue
            accuracies = [0.9 - 0.1 * k + 0.01 * layers for k in range(7)]
            write_run(
                run_dir, config, results_for(config, depth_tau(layers, seed), depth_speedup(layers, seed)), accuracies=accuracies
            )
        if layers <= 3:
            config = train_config("depth_gsm8k", "depth", DEPTH_AXES, benchmark="gsm8k", drafter={"num_layers": layers})
            run_dir = os.path.join(root, "depth_gsm8k", f"drafter.num_layers={layers},seed=0")
            write_run(run_dir, config, results_for(config, 2.0 + layers * 0.1, 1.5))


def make_block_size_sweep(root: str) -> None:
    """block_size_cpu training stage (diagonal, with metrics) and the 3 x 3 inference stage;
    the diagonal is measured by both stages (same drafter, same seed: counted once)."""
    for train_b in (8, 10, 16):
        config = train_config("block_size_cpu", "block_size", BLOCK_AXES, drafter={"block_size": train_b})
        run_dir = os.path.join(root, "block_size_cpu", f"drafter.block_size={train_b},seed=0")
        write_run(
            run_dir,
            config,
            results_for(config, 9.0, 9.0, timestamp="2026-11-21T09:00:00+00:00"),
            accuracies=[0.8 - 0.04 * k for k in range(train_b - 1)],
        )
        for infer_b in (8, 10, 16):
            eval_config = {
                "sweep": {"name": "block_size_infer_cpu", "ablation": "block_size", "axes": BLOCK_AXES, "app": "evaluate"},
                "train_seed": 0,
                "train_block_size": train_b,
                "target": {"path": "/art/targets/tiny_code"},
                "drafter": {"path": f"/art/sweeps/block_size_cpu/drafter.block_size={train_b},seed=0/drafter"},
                "benchmark": {"name": "humaneval"},
                "decoding": {"block_size": infer_b, "temperature": 0.0},
            }
            run_dir = os.path.join(
                root, "block_size_infer_cpu", f"decoding.block_size={infer_b},train_block_size={train_b},train_seed=0"
            )
            if (train_b, infer_b) == (16, 8):  # still running: config only
                write_run(run_dir, eval_config)
                continue
            tau = 2.0 + 0.1 * train_b + 0.05 * infer_b
            write_run(run_dir, eval_config, results_for(eval_config, tau, tau / 2, block_size=infer_b, drafter_block_size=train_b))


def make_main_sweep(root: str) -> None:
    """main: two targets x HumanEval, GSM8K x T = 0, 1; tiny_llama's GSM8K at T = 1 is still running."""
    for target in ("/art/targets/tiny_code", "Qwen/Qwen3-8B"):
        for benchmark in ("humaneval", "gsm8k"):
            for temperature in (0.0, 1.0):
                config = train_config("main_eval", "main", [], benchmark=benchmark, temperature=temperature, target=target)
                run_dir = os.path.join(root, "main_eval", f"{os.path.basename(target)}-{benchmark}-{temperature}")
                if (target, benchmark, temperature) == ("Qwen/Qwen3-8B", "gsm8k", 1.0):
                    write_run(run_dir, config)
                    continue
                tau = 6.5 - temperature - (0.5 if benchmark == "gsm8k" else 0)
                write_run(run_dir, config, results_for(config, tau, tau * 0.75))


def make_loss_sweep(root: str) -> None:
    for gamma in ("auto", None):
        config = train_config("loss_decay_cpu", "loss_decay", LOSS_AXES, training={"loss_gamma": gamma})
        write_run(os.path.join(root, "loss_decay_cpu", f"gamma={gamma}"), config, results_for(config, 3.0 if gamma else 2.5, 1.4))


class FakeFile:
    def __init__(self, name: str, content: dict | None = None):
        self.name, self.content = name, content

    def download(self, root: str, replace: bool = False):
        with open(os.path.join(root, self.name), "w") as f:
            json.dump(self.content, f)


class FakeRun:
    """The attributes of a `wandb.apis.public.Run` that dflash.reports reads."""

    def __init__(self, run_id, config, summary, state="finished", group=None, files=()):
        self.path = ["team", "dflash", run_id]
        self.config, self.summary, self.state, self.group = config, summary, state, group
        self.created_at = "2026-11-21T10:00:00"
        self._files = {f.name: f for f in files}

    def files(self):
        return list(self._files.values())

    def file(self, name):
        return self._files[name]


class FakeApi:
    """`wandb.Api()` stand-in: `runs(path, filters)` with the group filter applied."""

    def __init__(self, runs):
        self._runs = runs
        self.queries = []

    def runs(self, path, filters=None):
        self.queries.append((path, filters))
        groups = (filters or {}).get("group", {}).get("$in")
        return [r for r in self._runs if groups is None or r.group in groups]


def wandb_config(config: dict) -> dict:
    """A config as wandb's Api returns it: nested, with top-level values wrapped in {"value": ...}."""
    return {key: {"value": value, "desc": None} for key, value in config.items()}


class FakeWandbRun:
    """What `wandb.init()` returns, for writers: records the config, every logged value and
    every saved file, and hands them to readers as a `FakeRun` (as the wandb Api would).

    `save` names files the way wandb does: relative to `base_path`, else the file's own
    directory plus its name; with `glob=True` the path is a glob pattern, matched now.
    """

    class Config(dict):
        def update(self, values, allow_val_change=False):
            super().update(values)

    def __init__(self):
        self.init_kwargs: dict = {}
        self.config = self.Config()
        self.summary: dict = {}
        self.files: dict[str, dict] = {}
        self.finished = False

    def started(self, **init_kwargs) -> FakeWandbRun:
        self.init_kwargs = init_kwargs
        return self

    def log(self, values: dict, step=None, commit=None):
        self.summary.update(values)

    def save(self, glob_str, base_path=None, policy="live", glob=True):
        import glob as globbing

        paths = globbing.glob(str(glob_str)) if glob else [str(glob_str)]
        for path in paths:
            base = base_path or os.path.dirname(os.path.dirname(path))
            with open(path) as f:
                self.files[os.path.relpath(path, base)] = json.load(f)
        return paths

    def finish(self, exit_code=None):
        self.finished = True

    def as_api_run(self) -> FakeRun:
        files = [FakeFile(name, content) for name, content in self.files.items()]
        state = "finished" if self.finished else "running"
        return FakeRun(
            self.init_kwargs.get("id"),
            wandb_config(dict(self.config)),
            dict(self.summary),
            state,
            group=self.init_kwargs.get("group"),
            files=files,
        )
