"""Drafter directories as other programs read them.

- Under transformers 4.57 (the DFlash reference's pin; a side environment in .tf4 that
  `make test` builds) and under the main venv's transformers 5, config.json gives the
  rotary embedding our drafter uses, for every rope type, and
  `AutoModel.from_pretrained(dir, trust_remote_code=True)` builds our drafter with the
  same outputs; its `spec_generate` is lossless.
- config.json carries every key the reference, SGLang, vLLM and speculators read (the
  table in docs/drafters.md).
- We read directories laid out the way published drafters are, and train from one
  (`drafter.init_from`).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dflash.drafter import DFlashDrafter, DrafterConfig, load_drafter, save_drafter
from dflash.errors import ConfigError
from dflash.toy.tiny import save_tiny_target, tiny_config
from helpers import REPO
from helpers.loader_probe import probe
from helpers.tf4 import probe_under_transformers_4

CONTEXT, BLOCK = 6, 4

# The rope settings of the targets tried: (architecture, rope_parameters or None for the
# tiny config's own: Llama-3.1's llama3 scaling, Gemma3's per-layer-type rope, GPT-2's
# none at all).
ROPE_VARIANTS = {
    "qwen3_theta_1e6": ("qwen3", {"rope_type": "default", "rope_theta": 1e6}),
    "llama31_llama3": ("llama", None),
    "gemma3_per_layer_type": ("gemma3", None),
    "gpt2_no_rope": ("gpt2", None),
    "yarn": ("qwen3", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 512}),
    "linear": ("qwen3", {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
    "dynamic": ("qwen3", {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}),
    "longrope": (
        "qwen3",
        {
            "rope_type": "longrope",
            "rope_theta": 1e4,
            "short_factor": [1.0 + 0.1 * i for i in range(8)],
            "long_factor": [2.0 + 0.2 * i for i in range(8)],
            "original_max_position_embeddings": 512,
        },
    ),
}
SPEC_GENERATE = ["qwen3_theta_1e6"]  # drafters whose spec_generate runs against the tiny Qwen3 target
V5_KEYS_ONLY = "qwen3_theta_1e6_v5_keys_only"  # a directory as main wrote it before: the control


def target_config(arch: str, rope: dict | None):
    config = tiny_config(arch)
    if rope is not None:
        config.rope_parameters = dict(rope)
        config.standardize_rope_params()
    return config


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Drafters of every rope variant saved by us; their inputs and our own outputs; the
    probe request for the other loaders."""
    root = tmp_path_factory.mktemp("export")
    request, ours = {"drafters": {}}, {}
    for name, (arch, rope) in ROPE_VARIANTS.items():
        torch.manual_seed(0)
        drafter = DFlashDrafter(
            DrafterConfig.from_target(target_config(arch, rope), num_layers=2, block_size=BLOCK, mask_token_id=258)
        )
        save_drafter(drafter.eval(), str(root / name))
        ours[name] = _write_inputs_and_run(drafter, root / f"{name}.inputs.pt")
        request["drafters"][name] = {"dir": str(root / name), "inputs": str(root / f"{name}.inputs.pt")}
    control = root / V5_KEYS_ONLY
    shutil.copytree(root / "qwen3_theta_1e6", control)
    config = json.loads((control / "config.json").read_text())
    for key in ("rope_theta", "rope_scaling"):
        del config[key]
    (control / "config.json").write_text(json.dumps(config))
    request["drafters"][V5_KEYS_ONLY] = dict(request["drafters"]["qwen3_theta_1e6"], dir=str(control))
    save_tiny_target(str(root / "target"), arch="qwen3")
    request.update(target=str(root / "target"), spec_generate=SPEC_GENERATE, prompt=[5, 6, 7, 8, 9], new_tokens=24)
    (root / "request.json").write_text(json.dumps(request))
    return root, request, ours


def drafter_inputs(drafter: DFlashDrafter) -> dict:
    g = torch.Generator().manual_seed(1)
    d = drafter.config.hidden_size
    return dict(
        position_ids=torch.arange(100, 100 + CONTEXT + BLOCK)[None],
        noise_embedding=torch.randn(1, BLOCK, d, generator=g),
        target_hidden=torch.randn(1, CONTEXT, drafter.config.num_target_features * d, generator=g),
        # past the pretraining length too: dynamic and longrope switch frequencies there
        rope_positions=[torch.arange(0, 24)[None], torch.arange(3000, 3008)[None]],
    )


@torch.no_grad()
def run_ours(drafter: DFlashDrafter, inputs: dict) -> dict:
    """Our drafter's block hidden states and cos/sin on `inputs` (as the probe computes them)."""
    positions = inputs["position_ids"]
    hidden = drafter(inputs["noise_embedding"], positions[:, CONTEXT:], inputs["target_hidden"], positions[:, :CONTEXT])
    return {"hidden": hidden, "rope": [drafter.rotary_emb(torch.zeros(1), p) for p in inputs["rope_positions"]]}


def _write_inputs_and_run(drafter: DFlashDrafter, path: Path) -> dict:
    inputs = drafter_inputs(drafter)
    torch.save(inputs, path)
    return run_ours(drafter, inputs)


@pytest.fixture(scope="module")
def under_transformers_5(exported):
    return probe(exported[1])


@pytest.fixture(scope="module")
def under_transformers_4(exported):
    """The probe run in a subprocess whose transformers is 4.57 (from .tf4)."""
    root = exported[0]
    return probe_under_transformers_4(root / "request.json", root / "tf4.pt")


@pytest.fixture(params=["transformers_4", "transformers_5"])
def loaded(request):
    return request.getfixturevalue(f"under_{request.param}")


def _max_diff(a, b) -> float:
    if isinstance(a, torch.Tensor):
        return (a - b).abs().max().item()
    return max(_max_diff(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
def test_config_json_gives_our_rotary_embedding(loaded, exported, variant):
    assert _max_diff(loaded[variant]["rope"], exported[2][variant]["rope"]) < 1e-5


def test_rope_parameters_alone_are_misread_by_transformers_4(under_transformers_4, under_transformers_5, exported):
    """The control: without the v4 keys, 4.57 falls back to theta 10000 (5 reads it right)."""
    ours = exported[2]["qwen3_theta_1e6"]
    assert _max_diff(under_transformers_5[V5_KEYS_ONLY]["rope"], ours["rope"]) < 1e-5
    assert _max_diff(under_transformers_4[V5_KEYS_ONLY]["rope"], ours["rope"]) > 0.1
    assert _max_diff(under_transformers_4[V5_KEYS_ONLY]["hidden"], ours["hidden"]) > 1e-3  # vs < 1e-5 when read right


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
def test_auto_model_with_remote_code_builds_our_drafter(loaded, exported, variant):
    result = loaded[variant]
    assert result["class"] == "DFlashDraftModel" and result["block_size"] == BLOCK
    assert _max_diff(result["hidden"], exported[2][variant]["hidden"]) < 1e-5


def test_shipped_spec_generate_equals_the_targets_greedy_decoding(loaded):
    for name in SPEC_GENERATE:
        assert loaded[name]["spec_generate"] == loaded["greedy"]
    assert len(loaded["greedy"]) == 5 + 24


def test_shipped_modeling_file_imports_only_torch_transformers_and_the_standard_library(exported):
    # remote-code loaders install nothing: every import must already be there
    tree = ast.parse((exported[0] / "qwen3_theta_1e6" / "dflash.py").read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    third_party = {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names)
    assert third_party == {"torch", "transformers"}


def test_rope_keys_from_a_transformers_4_config():
    """Under transformers 4 (which pyproject allows) the drafter's rope config carries
    `rope_theta` and a `rope_scaling` that may still say `type`: the same keys come out."""
    from types import SimpleNamespace

    from dflash.target.rope_keys import rope_config_keys

    scaling = {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    v4_config = {"rope_theta": 5e5, "rope_scaling": scaling}
    keys = rope_config_keys(SimpleNamespace(to_dict=lambda: v4_config, max_position_embeddings=2048))
    expected = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    assert keys["rope_parameters"] == {**expected, "rope_theta": 5e5} and keys["rope_scaling"] == expected
    assert (keys["rope_theta"], keys["max_position_embeddings"]) == (5e5, 2048)
    plain_config = {"rope_theta": 1e6, "rope_scaling": None}
    plain = rope_config_keys(SimpleNamespace(to_dict=lambda: plain_config, max_position_embeddings=4096))
    assert plain["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6} and plain["rope_scaling"] is None


# --- keys other loaders read ----------------------------------------------------------


def drafters_doc_key_table() -> dict[str, list[str]]:
    """Rows of docs/drafters.md's table of config.json keys: key -> the loaders marked as reading it."""
    text = (REPO / "docs" / "drafters.md").read_text()
    section = text.split("## Drafter directories and other loaders", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    header = next(line for line in section.splitlines() if line.startswith("| key"))
    loaders = [cell.strip() for cell in header.strip("|").split("|")][1:]
    table = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        table[cells[0].strip("`")] = [loader for loader, mark in zip(loaders, cells[1:]) if mark == "yes"]
    return table


def _lookup(config: dict, dotted: str):
    value = config
    for part in dotted.split("."):
        value = value[part]
    return value


def test_config_json_has_every_key_the_drafters_doc_table_lists(qwen3_target, tmp_path):
    from dflash.specs import DrafterSpec, build_drafter

    table = drafters_doc_key_table()
    loaders = {loader for readers in table.values() for loader in readers}
    assert {"reference", "SGLang", "vLLM", "speculators"} <= loaders
    assert {"dflash_config.target_layer_ids", "dflash_config.mask_token_id", "rope_theta", "rope_parameters", "auto_map"} <= set(
        table
    )
    save_drafter(build_drafter(DrafterSpec(num_layers=1, block_size=4), qwen3_target), str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    missing = [key for key in table if not _has(config, key)]
    assert not missing


def _has(config: dict, dotted: str) -> bool:
    try:
        _lookup(config, dotted)
    except KeyError:
        return False
    return True


def test_config_json_values_follow_the_published_layout(exported):
    config = json.loads((exported[0] / "llama31_llama3" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    assert config["hidden_act"] == "silu" and config["is_causal"] is False
    assert config["layer_types"] == ["full_attention"] * config["num_hidden_layers"]
    assert config["rope_scaling"]["rope_type"] == "llama3" and config["rope_theta"] == 500000.0
    assert config["dflash_config"]["block_size"] == config["block_size"] == BLOCK


def test_mask_token_string_is_written_beside_its_id(qwen3_target, tmp_path):
    from dflash.specs import DrafterSpec, build_drafter

    drafter = build_drafter(DrafterSpec(num_layers=1, block_size=4), qwen3_target)
    save_drafter(drafter, str(tmp_path))
    dflash = json.loads((tmp_path / "config.json").read_text())["dflash_config"]
    assert dflash["mask_token"] == "<|MASK|>"
    assert qwen3_target.tokenizer.convert_tokens_to_ids(dflash["mask_token"]) == dflash["mask_token_id"]
    assert load_drafter(str(tmp_path)).config.mask_token == "<|MASK|>"


# --- reading published directories ----------------------------------------------------


def write_published_directory(directory: Path, drafter: DFlashDrafter, rope: dict, block_size_inside: bool) -> None:
    """A drafter directory laid out as published ones are (transformers-4 era): rope only
    as `rope_theta`/`rope_scaling`, `auto_map`, the target's token ids, bf16 weights;
    `block_size` at the top level (Qwen3/Llama drafters) or in `dflash_config` (later ones)."""
    c = drafter.config
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "dtype": "bfloat16",
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": 40960,
        "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": c.num_hidden_layers,
        "num_key_value_heads": c.num_key_value_heads,
        "num_target_layers": c.num_target_layers,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": rope["rope_theta"],
        "rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"} if rope["rope_type"] != "default" else None,
        "tie_word_embeddings": False,
        "vocab_size": c.vocab_size,
        "dflash_config": {"mask_token_id": c.mask_token_id, "target_layer_ids": c.target_layer_ids},
    }
    if block_size_inside:
        config["dflash_config"]["block_size"] = c.block_size
    else:
        config["block_size"] = c.block_size
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    state = {name: t.detach().to(torch.bfloat16).contiguous() for name, t in drafter.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("variant, block_size_inside", [("qwen3_theta_1e6", False), ("llama31_llama3", True)])
def test_load_drafter_reads_the_published_layout(tmp_path, variant, block_size_inside):
    arch, rope = ROPE_VARIANTS[variant]
    config = target_config(arch, rope)
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterConfig.from_target(config, num_layers=2, block_size=BLOCK, mask_token_id=258)).eval()
    write_published_directory(tmp_path / "published", drafter, dict(config.rope_parameters), block_size_inside)
    as_stored = load_drafter(str(tmp_path / "published"))
    assert next(as_stored.parameters()).dtype == torch.bfloat16
    # bf16 weights, float32 rotary frequencies: a bf16 inv_freq is off by radians at long positions
    assert torch.equal(as_stored.rotary_emb.inv_freq, drafter.rotary_emb.inv_freq)
    loaded = load_drafter(str(tmp_path / "published"), dtype=torch.float32)
    assert (loaded.config.block_size, loaded.config.target_layer_ids) == (BLOCK, drafter.config.target_layer_ids)
    # Same frequencies as the drafter built from the target, and the same network.
    assert torch.equal(loaded.rotary_emb.inv_freq, drafter.rotary_emb.inv_freq)
    assert loaded.rotary_emb.attention_scaling == drafter.rotary_emb.attention_scaling
    inputs = drafter_inputs(drafter)
    with torch.no_grad():
        for parameter in drafter.parameters():  # the weights as stored
            parameter.copy_(parameter.to(torch.bfloat16).float())
    assert _max_diff(run_ours(loaded, inputs)["hidden"], run_ours(drafter, inputs)["hidden"]) < 1e-5


@pytest.mark.parametrize(
    "change, message",
    [
        ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding_attention"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"dflash_config": {"mask_token_id": 258, "target_layer_ids": [1, 3]}}, "block_size"),
    ],
)
def test_published_variants_we_cannot_compute_are_one_line_errors(tmp_path, change, message):
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterConfig.from_target(tiny_config("qwen3"), num_layers=2, block_size=BLOCK, mask_token_id=258))
    write_published_directory(tmp_path / "published", drafter, {"rope_type": "default", "rope_theta": 1e4}, False)
    config = json.loads((tmp_path / "published" / "config.json").read_text())
    config.update(change)
    if "dflash_config" in change:  # no block size anywhere
        del config["block_size"]
    (tmp_path / "published" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message) as err:
        load_drafter(str(tmp_path / "published"))
    assert err.value.key == "path" and "\n" not in str(err.value)  # the field; build_drafter adds the group


# --- training from a drafter directory ------------------------------------------------


@pytest.fixture(scope="module")
def train_workspace(tmp_path_factory):
    from dflash.specs import DrafterSpec, TargetSpec, build_drafter, load_target
    from helpers.apps import write_conversations

    root = tmp_path_factory.mktemp("init_from")
    target_dir = root / "artifacts" / "targets" / "tiny_qwen3_random"
    save_tiny_target(str(target_dir), arch="qwen3", seed=0)
    write_conversations(root / "chats.jsonl", 8)
    target = load_target(TargetSpec(path=str(target_dir)))
    # The tiny recipe's drafter shape (dflash/conf/drafter/tiny.yaml, block 8), other weights than
    # the run's own random init (seed 0), saved in bf16 as published drafters are.
    start = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=8, seed=123), target)
    save_drafter(start, str(root / "start"), dtype=torch.bfloat16)
    deeper = build_drafter(DrafterSpec(num_layers=2, num_target_features=2, block_size=8), target)
    save_drafter(deeper, str(root / "deeper"))
    return root


def _train(workspace: Path, run_name: str, overrides: list[str], monkeypatch):
    from dflash.cli import train

    argv = [
        "dflash.train",
        "experiment=tiny_cpu",
        f"paths.artifacts={workspace / 'artifacts'}",
        f"data.path={workspace / 'chats.jsonl'}",
        "eval.after_train=false",
        "logger=none",
        "trainer.enable_progress_bar=false",
        "trainer.max_steps=2",
        f"run_name={run_name}",
        *overrides,
    ]
    monkeypatch.setattr(sys, "argv", argv)
    train.main()


@pytest.mark.slow
def test_training_starts_from_the_directory_weights(train_workspace, monkeypatch):
    _train(train_workspace, "from_start", [f"drafter.init_from={train_workspace / 'start'}"], monkeypatch)
    start = load_drafter(str(train_workspace / "start")).float().state_dict()
    trained = load_drafter(str(train_workspace / "artifacts" / "runs" / "from_start" / "drafter")).state_dict()
    # Two AdamW steps at lr 3e-3 (warm-up) move each weight by at most about 2 * 3e-3;
    # a fresh random init would be a whole weight scale away.
    assert max((trained[k] - v).abs().max().item() for k, v in start.items()) < 1e-2
    assert max((trained[k] - v).abs().max().item() for k, v in start.items() if k.endswith("proj.weight")) > 0


def test_a_directory_of_another_shape_is_a_one_line_error(train_workspace, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _train(train_workspace, "from_deeper", [f"drafter.init_from={train_workspace / 'deeper'}"], monkeypatch)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert re.match(r"error: drafter\.init_from: num_hidden_layers is 2 in .* but 1 here; set drafter\.num_layers=2$", err[-1]), err
    assert "Traceback" not in "\n".join(err)
