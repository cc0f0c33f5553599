"""Target wrapper: feature taps, shared modules, the cache crop helper across versions."""

import pytest
import torch
from torch import nn

from dflash.errors import ConfigError
from dflash.target import TargetModel, cache_length, crop_cache


def test_features_tap_layer_outputs_at_index_plus_one(qwen3_target):
    ids = torch.tensor([[5, 6, 7, 8]])
    out = qwen3_target.forward(ids, torch.arange(4).unsqueeze(0), layer_ids=[0, 2])
    hidden = qwen3_target.model(ids, output_hidden_states=True).hidden_states
    d = qwen3_target.hidden_size
    assert torch.equal(out.features[..., :d], hidden[1])
    assert torch.equal(out.features[..., d:], hidden[3])


def test_target_is_frozen_and_exposes_embedding_and_head(tiny_target):
    assert not any(p.requires_grad for p in tiny_target.model.parameters())
    assert not tiny_target.model.training
    assert tiny_target.embed_tokens is tiny_target.model.get_input_embeddings()
    assert tiny_target.lm_head is tiny_target.model.get_output_embeddings()


def test_unsupported_model_names_its_class():
    class Odd(nn.Module):
        config = None

    with pytest.raises(ConfigError, match="Odd"):
        TargetModel(Odd())


def test_crop_cache_on_the_installed_transformers(qwen3_target):
    cache = qwen3_target.new_cache()
    qwen3_target.forward(torch.tensor([[1, 2, 3, 4, 5, 6]]), torch.arange(6).unsqueeze(0), cache)
    crop_cache(cache, 6)
    assert cache_length(cache) == 6
    crop_cache(cache, 4)
    assert cache_length(cache) == 4
    # the cropped cache continues exactly like a fresh one
    nxt = qwen3_target.forward(torch.tensor([[9]]), torch.tensor([[4]]), cache).logits
    fresh = qwen3_target.forward(torch.tensor([[1, 2, 3, 4, 9]]), torch.arange(5).unsqueeze(0)).logits[:, -1:]
    torch.testing.assert_close(nxt, fresh, atol=1e-5, rtol=1e-5)


class V4Cache:
    """transformers 4.x semantics: crop(max_length); negative removes; crop(0) empties."""

    def __init__(self, n):
        self.n = n

    def get_seq_length(self):
        return self.n

    def crop(self, max_length):
        if max_length < 0:
            max_length = self.n - abs(max_length)
        self.n = min(self.n, max_length)


class V5Cache(V4Cache):
    """transformers 5.x semantics: crop(tokens_to_remove) accepts negative counts only."""

    def crop(self, tokens_to_remove):
        if tokens_to_remove > 0:
            raise ValueError("positive crop not supported")
        self.n += tokens_to_remove


@pytest.mark.parametrize("cache_cls", [V4Cache, V5Cache])
@pytest.mark.parametrize("keep", [0, 3, 10, 12])
def test_crop_cache_semantics_of_both_major_versions(cache_cls, keep):
    cache = cache_cls(10)
    crop_cache(cache, keep)
    assert cache.get_seq_length() == min(keep, 10)


def test_offline_random_target_is_built_once_and_loads(tmp_path):
    from dflash.specs import TargetSpec, load_target

    spec = TargetSpec(path=str(tmp_path / "t"), dtype="float32", build={"arch": "llama", "seed": 3})
    first = load_target(spec)
    assert first.num_layers == 6 and type(first.model).__name__ == "LlamaForCausalLM"
    mtime = (tmp_path / "t" / "config.json").stat().st_mtime_ns
    load_target(spec)
    assert (tmp_path / "t" / "config.json").stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == ["t"]  # no temp dirs left behind
