"""The model card (README.md) of an exported drafter directory, as the Hugging Face hub
reads it: YAML front matter (`base_model`, `library_name`, `tags`, `datasets`) between two
`---` lines, then what the drafter is, its measured tau and speed-up when an evaluation
ran, the training recipe, and the commands that serve it with vLLM and SGLang.

Everything comes from files: the directory's config.json, the run's resolved config (or
None: `python -m dflash.export` of a checkpoint without its run directory) and the
evaluation's results.json (or None). Values not known are left out, never guessed:
`base_model` only for a hub id (the hub rejects any other).
"""

from __future__ import annotations

import json
import os
import re

import yaml

from dflash.drafter.io import load_draft_vocab
from dflash.fileio import write_text
from dflash.layout import DRAFTER_CONFIG, HYDRA_CONFIG, HYDRA_RUN_CONFIG, MODEL_CARD, RESULTS_FILE, Results

LIBRARY_NAME = "transformers"  # AutoModel.from_pretrained(dir, trust_remote_code=True) builds the drafter
TAGS = {
    "dflash": ["dflash", "speculative-decoding", "block-diffusion", "draft-model"],
    "eagle3": ["eagle3", "speculative-decoding", "draft-model"],
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_id(value) -> str | None:
    """`value` when it reads as a hub repository id (`owner/name`) and is no local path; else None."""
    if not isinstance(value, str) or "${" in value or not _HUB_ID.match(value) or os.path.exists(value):
        return None
    return value


def write_model_card(drafter_dir: str, run_config: dict | None = None, results: Results | None = None) -> str:
    """Write `drafter_dir`/README.md for the drafter directory; returns its path."""
    with open(os.path.join(drafter_dir, DRAFTER_CONFIG)) as f:
        drafter = json.load(f)
    vocab = load_draft_vocab(drafter_dir, drafter.get("vocab_size") or 0)
    card = model_card(drafter, run_config or {}, results, drafter_dir, None if vocab is None else vocab.numel())
    return write_text(os.path.join(drafter_dir, MODEL_CARD), card)


def read_results(path: str | None) -> Results | None:
    """results.json at `path`; None when there is none."""
    return Results.read(path) if path is not None and os.path.isfile(path) else None


def run_files(run_dir: str) -> tuple[dict | None, Results | None]:
    """(config, results.json) of the training run directory `run_dir`, each None when
    absent: the config is Hydra's `.hydra/config.yaml`, each interpolation resolved where
    it can be outside the app: `${hydra:...}` from the run's own `.hydra/hydra.yaml` (not
    from the Hydra app reading it), the others left as written when they do not resolve."""
    from omegaconf import OmegaConf

    path = os.path.join(run_dir, HYDRA_CONFIG)
    results = read_results(os.path.join(run_dir, RESULTS_FILE))
    if not os.path.isfile(path):
        return None, results
    with open(path) as f:
        node = OmegaConf.create(f.read().replace("${hydra:", "${hydra."))
    keys = list(node.keys())
    hydra_path = os.path.join(run_dir, HYDRA_RUN_CONFIG)
    if os.path.isfile(hydra_path):
        node = OmegaConf.merge(node, {"hydra": OmegaConf.load(hydra_path).get("hydra", {})})
    config = OmegaConf.to_container(node, resolve=False)
    _resolve_leaves(node, config, "")
    return {key: config[key] for key in keys}, results


def _resolve_leaves(node, data, prefix: str) -> None:
    """Replace each `${...}` string of `data` (the unresolved container of `node`) by its
    value where it resolves; the others stay as written."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    items = data.items() if isinstance(data, dict) else enumerate(data)
    for name, value in list(items):
        key = f"{prefix}[{name}]" if isinstance(data, list) else f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, (dict, list)):
            _resolve_leaves(node, value, key)
        elif isinstance(value, str) and "${" in value:
            try:
                data[name] = OmegaConf.select(node, key)
            except OmegaConfBaseException:
                pass


def model_card(drafter: dict, run: dict, results: Results | None, location: str, draft_vocab: int | None = None) -> str:
    """The card's text for drafter config.json `drafter`, resolved run config `run`, results.json
    `results` and the size of its draft vocabulary (draft_vocab.json; None: none)."""
    method = "eagle3" if "eagle_config" in drafter or any("Eagle3" in a for a in drafter.get("architectures", [])) else "dflash"
    target = run.get("target") or {}
    base_model = None if target.get("build") or target.get("gguf_file") else hub_id(target.get("path"))
    data = run.get("data") or {}
    datasets = sorted({name for source in data.get("sources") or [] if (name := hub_id((source or {}).get("path")))})
    front = {"library_name": LIBRARY_NAME, "tags": TAGS[method]}
    if base_model:
        front["base_model"] = base_model
    if datasets:
        front["datasets"] = datasets
    target_name = base_model or target.get("path") or "its target model"
    lines = ["---", yaml.safe_dump(front, sort_keys=True).strip(), "---", ""]
    lines += [f"# {method_label(method)} drafter for {target_name}", ""]
    lines += [
        f"A speculative-decoding drafter for `{target_name}`, trained with dflash. It drafts for that target only: "
        "it reads the target's hidden states and shares its embedding and output head.",
        "",
    ]
    lines += _shape(drafter, method, draft_vocab)
    lines += _measured(results)
    lines += _recipe(run)
    lines += _serving(method, drafter, base_model or target.get("path") or "TARGET", location)
    return "\n".join(lines).rstrip() + "\n"


def method_label(method: str) -> str:
    return {"dflash": "DFlash", "eagle3": "EAGLE-3"}[method]


def block_size(drafter: dict) -> int | None:
    return (drafter.get("dflash_config") or {}).get("block_size") or drafter.get("block_size")


def _shape(drafter: dict, method: str, draft_vocab: int | None) -> list[str]:
    rows = [("layers", drafter.get("num_hidden_layers")), ("hidden size", drafter.get("hidden_size"))]
    if method == "dflash":
        dflash = drafter.get("dflash_config") or {}
        rows += [
            ("block size", block_size(drafter)),
            ("target layers read", dflash.get("target_layer_ids")),
            ("mask token", dflash.get("mask_token") or dflash.get("mask_token_id")),
        ]
    rows.append(("weights dtype", drafter.get("dtype") or drafter.get("torch_dtype")))
    if draft_vocab is not None:
        rows.append(
            ("draft vocabulary", f"{draft_vocab} tokens (draft_vocab.json: dflash drafts over them; other engines ignore it)")
        )
    return ["## Drafter", "", *_table(rows), ""]


def _measured(results: Results | None) -> list[str]:
    lines = ["## Measured", ""]
    if results is None:
        return [
            *lines,
            "Not measured yet: `python -m dflash.evaluate drafter.path=THIS_DIRECTORY` measures tau and the speed-up.",
            "",
        ]
    rows = [
        ("benchmark", results.benchmark),
        ("prompts", results.num_prompts),
        ("tau (tokens per target forward, pooled)", _number(results.tau)),
        ("tau (mean over prompts)", _number(results.tau_per_prompt_mean)),
        ("speed-up vs autoregressive (end to end)", _times(results.speedup_vs_autoregressive)),
        ("speed-up vs autoregressive (decode only)", _times(results.speedup_decode_only_vs_autoregressive)),
        ("speed-up vs HF generate", _times((results.speedup or {}).get("vs_hf_generate"))),
        ("lossless", results.lossless),
        ("device", results.device),
    ]
    return [*lines, "Batch 1, dflash's own decoding loop (an engine's figures differ; compare tau first).", "", *_table(rows), ""]


def _recipe(run: dict) -> list[str]:
    if not run:
        return ["## Training", "", "The run's config was not found beside the checkpoint.", ""]
    training, trainer, data = run.get("training") or {}, run.get("trainer") or {}, run.get("data") or {}
    sources = [s.get("path") for s in data.get("sources") or [] if isinstance(s, dict)] or [data.get("path")]
    rows = [
        ("data", ", ".join(str(s) for s in sources if s)),
        ("learning rate", training.get("learning_rate")),
        ("warm-up ratio", training.get("warmup_ratio")),
        ("anchors per sequence", training.get("num_anchors")),
        ("loss gamma", training.get("loss_gamma")),
        ("max sequence length", data.get("max_length")),
        ("batch size per device", data.get("batch_size")),
        ("epochs / max steps", f"{trainer.get('max_epochs')} / {trainer.get('max_steps')}" if trainer else None),
        ("devices x nodes", f"{trainer.get('devices')} x {trainer.get('num_nodes')}" if trainer else None),
        ("precision", trainer.get("precision")),
        ("seed", run.get("seed")),
    ]
    return ["## Training", "", *_table(rows), ""]


def _serving(method: str, drafter: dict, target: str, location: str) -> list[str]:
    """vLLM and SGLang commands (flag names: docs/quickstart.md, "Serve")."""
    if method == "dflash":
        size = block_size(drafter) or 16
        spec = json.dumps({"method": "dflash", "model": location, "num_speculative_tokens": size - 1})
        sglang = f"--speculative-algorithm DFLASH --speculative-draft-model-path {location} --speculative-num-draft-tokens {size}"
    else:
        spec = json.dumps({"method": "eagle3", "model": location, "num_speculative_tokens": 3})
        sglang = (
            f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {location} "
            "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
        )
    return [
        "## Serve",
        "",
        "Replace the drafter path by its hub id once uploaded.",
        "",
        "```bash",
        f"vllm serve {target} --speculative-config '{spec}'",
        f"python -m sglang.launch_server --model-path {target} {sglang} --trust-remote-code",
        "```",
        "",
    ]


def _table(rows: list[tuple]) -> list[str]:
    kept = [(name, value) for name, value in rows if value not in (None, "", [])]
    return ["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in kept)]


def _number(value) -> str | None:
    return None if value is None else f"{value:.2f}"


def _times(value) -> str | None:
    return None if value is None else f"{value:.2f}x"
