"""The model card of an exported drafter (dflash.training.model_card), read as the hub reads it."""

from __future__ import annotations

import pytest
import yaml

from dflash.drafter import save_drafter
from dflash.layout import Results
from dflash.specs import DrafterSpec, build_drafter
from dflash.training.model_card import hub_id, write_model_card

RUN = {
    "target": {"path": "Qwen/Qwen3-8B", "build": None},
    "data": {
        "path": "/data/regenerated",
        "max_length": 3072,
        "sources": [{"path": "HuggingFaceH4/ultrachat_200k"}, {"path": "/home/me/prompts.jsonl"}],
    },
    "training": {"learning_rate": 6e-4, "num_anchors": 512, "loss_gamma": 7.0},
    "trainer": {"max_epochs": 6, "max_steps": -1, "devices": 8, "num_nodes": 1, "precision": "bf16-mixed"},
    "seed": 0,
}
RESULTS = {
    "benchmark": "gsm8k",
    "num_prompts": 16,
    "tau": 6.4321,
    "speedup": {"vs_autoregressive": 3.5},
    "speedup_decode_only": {"vs_autoregressive": 4.25},
}


@pytest.fixture(scope="module")
def drafter_dir(qwen3_target, tmp_path_factory):
    directory = tmp_path_factory.mktemp("card") / "drafter"
    save_drafter(build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=8), qwen3_target), str(directory))
    return directory


def front_matter(path) -> dict:
    """The card's metadata as the hub parses it: YAML between the first two `---` lines."""
    text = path.read_text()
    assert text.startswith("---\n")
    block, _, _ = text[4:].partition("\n---\n")
    return yaml.safe_load(block)


def test_card_front_matter_names_base_model_datasets_and_tags(drafter_dir):
    card = write_model_card(str(drafter_dir), RUN, Results(**RESULTS))
    meta = front_matter(drafter_dir / "README.md")
    assert card == str(drafter_dir / "README.md")
    assert meta == {
        "base_model": "Qwen/Qwen3-8B",
        "library_name": "transformers",
        "tags": ["dflash", "speculative-decoding", "block-diffusion", "draft-model"],
        "datasets": ["HuggingFaceH4/ultrachat_200k"],  # the local prompt file is no hub dataset
    }


def test_card_gives_measured_figures_recipe_and_serve_commands(drafter_dir):
    write_model_card(str(drafter_dir), RUN, Results(**RESULTS))
    text = (drafter_dir / "README.md").read_text()
    assert "| tau (tokens per target forward, pooled) | 6.43 |" in text
    assert "| speed-up vs autoregressive (decode only) | 4.25x |" in text
    assert "| learning rate | 0.0006 |" in text and "| devices x nodes | 8 x 1 |" in text
    # block 8: vLLM proposes 7 tokens per step, SGLang counts the anchor in its 8 draft tokens
    vllm = f'vllm serve Qwen/Qwen3-8B --speculative-config \'{{"method": "dflash", "model": "{drafter_dir}", "num_speculative_tokens": 7}}\''
    assert vllm in text
    assert f"--speculative-algorithm DFLASH --speculative-draft-model-path {drafter_dir} --speculative-num-draft-tokens 8" in text


def test_card_of_an_unmeasured_drafter_of_a_local_target_leaves_unknowns_out(drafter_dir, tmp_path):
    run = {**RUN, "target": {"path": str(tmp_path)}, "data": {"path": str(tmp_path / "chats.jsonl")}}
    write_model_card(str(drafter_dir), run, None)
    meta = front_matter(drafter_dir / "README.md")
    assert "base_model" not in meta and "datasets" not in meta
    text = (drafter_dir / "README.md").read_text()
    assert "Not measured yet" in text and "tau (tokens" not in text


def test_card_names_the_draft_vocabulary_where_the_directory_has_one(drafter_dir):
    write_model_card(str(drafter_dir), RUN, None)
    assert "draft vocabulary" not in (drafter_dir / "README.md").read_text()
    (drafter_dir / "draft_vocab.json").write_text('{"token_ids": [3, 7, 11]}')
    try:
        write_model_card(str(drafter_dir), RUN, None)
        assert "| draft vocabulary | 3 tokens (draft_vocab.json" in (drafter_dir / "README.md").read_text()
    finally:
        (drafter_dir / "draft_vocab.json").unlink()


def test_card_without_a_run_config_still_has_its_metadata(drafter_dir):
    write_model_card(str(drafter_dir))
    assert front_matter(drafter_dir / "README.md")["library_name"] == "transformers"
    assert "The run's config was not found" in (drafter_dir / "README.md").read_text()


@pytest.mark.parametrize(
    "value, expected",
    [("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"), ("/models/Qwen3-8B", None), ("${paths.artifacts}/t", None), ("gpt2", None), (None, None)],
)
def test_hub_ids_are_owner_slash_name(value, expected):
    assert hub_id(value) == expected


def test_run_files_resolve_what_resolves_outside_the_app(tmp_path):
    from dflash.training.model_card import run_files

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(
        "paths: {artifacts: /a, root: '${hydra:runtime.cwd}'}\ntarget: {path: '${paths.artifacts}/targets/t'}\n"
    )
    (tmp_path / "results.json").write_text('{"tau": 2.5}')
    config, results = run_files(str(tmp_path))
    assert config["target"]["path"] == "/a/targets/t" and config["paths"]["root"] == "${hydra.runtime.cwd}"
    assert results == Results(tau=2.5)
    # ${hydra:...} is the run's own, from its .hydra/hydra.yaml, whatever app reads it
    (tmp_path / ".hydra" / "hydra.yaml").write_text("hydra: {runtime: {cwd: /where/it/ran}}\n")
    assert run_files(str(tmp_path))[0]["paths"] == {"artifacts": "/a", "root": "/where/it/ran"}
    assert run_files(str(tmp_path / "elsewhere")) == (None, None)
