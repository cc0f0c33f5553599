"""The tiny code target built offline from the stdlib: tokenizer, build cache, prompts."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from dflash.errors import ConfigError
from dflash.structured import config_key
from dflash.target import TargetModel
from dflash.target.builds import BUILD_INFO
from dflash.toy.tiny_code import (
    SPECIAL_TOKENS,
    TinyCodeConfig,
    build_tiny_code_target,
    file_documents,
    is_current,
    source_functions,
    split_corpus,
    stdlib_source_files,
    train_tokenizer,
)
from dflash.toy.tiny_code_prompts import humaneval_prompts, stdlib_code_prompts
from helpers import REPO

# A build small enough for unit tests: ~150 KB of source, a 64-wide model, 3 steps.
MINI = TinyCodeConfig(
    vocab_size=600,
    num_layers=6,
    hidden_size=32,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    seq_len=32,
    batch_size=2,
    max_steps=3,
    warmup_steps=1,
    max_corpus_bytes=150_000,
    heldout_fraction=0.2,
    val_windows=2,
)

CODE = 'def add(a, b):\n    """Return a + b."""\n\treturn a + b  # ünïcode ✓\n\n\nclass C:\n    pass\n'


@pytest.fixture(scope="module")
def mini_texts() -> list[str]:
    return split_corpus(MINI).train_documents


@pytest.fixture(scope="module")
def mini_build(tmp_path_factory) -> str:
    return build_tiny_code_target(str(tmp_path_factory.mktemp("targets") / "tiny_code"), MINI, progress=False)


def test_tokenizer_has_special_tokens_and_round_trips_code(mini_texts, tmp_path):
    from transformers import AutoTokenizer

    train_tokenizer(mini_texts, MINI.vocab_size, progress=False).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == MINI.vocab_size
    assert [tokenizer.eos_token, tokenizer.pad_token, tokenizer.mask_token] == SPECIAL_TOKENS
    assert [tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.mask_token_id] == [0, 1, 2]
    assert tokenizer.bos_token is None and tokenizer.chat_template is None
    ids = tokenizer(CODE, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == CODE
    assert len(ids) < len(CODE.encode()) * 0.8, "BPE merges should compress code"
    # Special tokens in text stay atomic.
    assert tokenizer("x<|MASK|>y", add_special_tokens=False)["input_ids"][1] == tokenizer.mask_token_id


def test_tokenizer_training_is_deterministic(mini_texts):
    first = train_tokenizer(mini_texts, MINI.vocab_size, progress=False)
    second = train_tokenizer(mini_texts, MINI.vocab_size, progress=False)
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()


def test_corpus_is_seeded_disjoint_function_documents_without_tests():
    files = stdlib_source_files()
    assert not any(f"{os.sep}test{os.sep}" in path or "site-packages" in path for path in files)
    corpus = split_corpus(MINI)
    assert corpus.train_documents and corpus.heldout_documents
    assert not set(corpus.train_files) & set(corpus.heldout_files)
    starts = ("def ", "async def ", "import ", "from ")
    assert all(doc.startswith(starts) and "def " in doc for doc in corpus.train_documents + corpus.heldout_documents)
    assert split_corpus(MINI) == corpus
    assert split_corpus(dataclasses.replace(MINI, seed=1)).train_files != corpus.train_files


def test_mini_build_loads_with_hf_and_target_model(mini_build):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with open(os.path.join(mini_build, BUILD_INFO)) as handle:
        info = json.load(handle)
    assert info["config"] == dataclasses.asdict(MINI)
    assert info["tokens_seen"] == MINI.max_steps * MINI.batch_size * MINI.seq_len
    assert 0 < info["val_loss"] < 10 and 0 < info["train_loss"] < 10
    model = AutoModelForCausalLM.from_pretrained(mini_build)
    tokenizer = AutoTokenizer.from_pretrained(mini_build)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.num_hidden_layers == MINI.num_layers
    assert model.config.eos_token_id == tokenizer.eos_token_id
    target = TargetModel.load(mini_build, dtype="float32")
    assert target.tokenizer.mask_token_id < target.embedding_rows
    assert target.num_layers == MINI.num_layers
    ids = torch.tensor([tokenizer(CODE)["input_ids"]])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits).all()


def test_build_is_skipped_when_current(mini_build):
    stamp = os.path.getmtime(os.path.join(mini_build, "model.safetensors"))
    assert build_tiny_code_target(mini_build, dataclasses.asdict(MINI) | {"kind": "tiny_code"}, progress=False) == mini_build
    assert os.path.getmtime(os.path.join(mini_build, "model.safetensors")) == stamp
    assert not [name for name in os.listdir(os.path.dirname(mini_build)) if name.startswith(".")], "no temp dirs left"


def test_changed_config_rebuilds_and_same_seed_reproduces_weights(mini_build, tmp_path):
    from safetensors.torch import load_file

    changed = dataclasses.replace(MINI, seed=1)
    assert not is_current(mini_build, changed)
    copy = str(tmp_path / "copy")
    build_tiny_code_target(copy, MINI, progress=False)
    reference = load_file(os.path.join(mini_build, "model.safetensors"))
    assert all(torch.equal(reference[name], weight) for name, weight in load_file(os.path.join(copy, "model.safetensors")).items())
    build_tiny_code_target(copy, changed, progress=False)
    assert is_current(copy, changed) and not is_current(copy, MINI)
    rebuilt = load_file(os.path.join(copy, "model.safetensors"))
    assert not torch.equal(reference["model.embed_tokens.weight"], rebuilt["model.embed_tokens.weight"])


def test_interrupted_build_leaves_no_finished_looking_directory(tmp_path, monkeypatch):
    import dflash.target.builds as builds

    def crash_while_writing_build_info(*args, **kwargs):
        raise KeyboardInterrupt

    # Weights and tokenizer are already in the staging directory when this fires.
    monkeypatch.setattr(builds, "write_json", crash_while_writing_build_info)
    out_dir = tmp_path / "tiny_code"
    with pytest.raises(KeyboardInterrupt):
        build_tiny_code_target(str(out_dir), MINI, progress=False)
    left = [name for name in os.listdir(tmp_path) if name != "tiny_code.build.lock"]  # the build lock stays, by design
    assert left == [], "neither the target nor a staging directory may remain"


def test_bad_config_names_the_key():
    with pytest.raises(ConfigError, match="target.build.num_kv_heads"), config_key("target.build"):  # as the apps add the group
        TinyCodeConfig(hidden_size=96, num_heads=6, num_kv_heads=4)
    with pytest.raises(ConfigError, match="target.build.hidden_sise"), config_key("target.build"):
        TinyCodeConfig.from_dict({"kind": "tiny_code", "hidden_sise": 64})


def test_source_functions_cut_methods_and_headers():
    source = (
        "import os\n\nclass A:\n    @property\n    def method(self, x,\n               y):\n        '''Doc\n\n        more.'''\n"
        "        def inner():\n            return 2\n        return x\n\ndef no_doc():\n    return 1\n\n"
        "def only_doc():\n    '''Nothing else.'''\n"
    )
    functions = source_functions(source)
    assert [f.text.split("(")[0] for f in functions] == ["def method", "def no_doc", "def only_doc"]
    assert functions[0].text == (
        "def method(self, x,\n           y):\n    '''Doc\n\n    more.'''\n    def inner():\n        return 2\n    return x\n"
    )
    assert functions[0].header == "def method(self, x,\n           y):\n    '''Doc\n\n    more.'''\n"
    assert functions[1].header is None and functions[2].header is None
    assert [f.has_body for f in functions] == [True, True, False]
    assert source_functions("def broken(:\n") == []
    # Training documents: stubs dropped, the file's imports in front of its first function.
    assert file_documents(source) == ["import os\n\n\n" + functions[0].text, functions[1].text]


def test_stdlib_prompts_are_deterministic_bounded_and_not_humaneval():
    prompts = stdlib_code_prompts(40, seed=3, max_chars=400)
    assert prompts == stdlib_code_prompts(40, seed=3, max_chars=400)
    assert prompts != stdlib_code_prompts(40, seed=4, max_chars=400)
    assert len(set(prompts)) == 40
    assert all(len(p) <= 400 and p.startswith(("def ", "async def ")) and p.endswith("\n") for p in prompts)
    humaneval = [p.strip() for p in humaneval_prompts()]
    assert len(humaneval) == 164
    assert not any(p.strip() in h or h in p for p in prompts for h in humaneval)


def test_stdlib_prompts_take_doctest_headers_first():
    with_doctests = stdlib_code_prompts(300, seed=0)
    without = stdlib_code_prompts(300, seed=0, doctest_first=False)
    num_doctests = sum(">>>" in p for p in with_doctests)
    # CPython's stdlib has a couple of hundred such headers; a plain spread finds few.
    assert num_doctests >= 150
    assert sum(">>>" in p for p in without) < num_doctests / 4
    assert len(set(with_doctests)) == 300


def test_shipped_config_is_the_default_config():
    import yaml

    root = str(REPO)
    with open(os.path.join(root, "dflash", "conf", "target", "tiny_code.yaml")) as handle:
        conf = yaml.safe_load(handle)
    assert conf["build"]["kind"] == "tiny_code"
    assert conf["path"] == "${paths.artifacts}/targets/tiny_code"
    assert TinyCodeConfig.from_dict(conf["build"]) == TinyCodeConfig()
    assert TinyCodeConfig().num_layers >= 6, "the DFlash tap rule (layers 1..L-3) needs depth"


def test_a_second_build_waits_for_the_first_and_reuses_it(tmp_path, monkeypatch, capfd):
    """Sweep jobs started side by side on a fresh machine build the target once: the
    others wait on its lock, then load what the first one built."""
    import fcntl
    import threading

    from dflash.toy import tiny_code

    out = tmp_path / "targets" / "tiny_code"
    config = tiny_code.TinyCodeConfig()
    builds = []
    monkeypatch.setattr(tiny_code, "_build", lambda *args: builds.append(args))
    out.parent.mkdir(parents=True)
    holder = open(f"{out}.build.lock", "a")  # another process is building
    fcntl.flock(holder, fcntl.LOCK_EX)
    returned = []
    waiter = threading.Thread(target=lambda: returned.append(tiny_code.build_tiny_code_target(str(out), config)))
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive() and not builds  # waiting, not building
    out.mkdir()  # the holder's build lands
    (out / "config.json").write_text("{}")
    (out / BUILD_INFO).write_text(json.dumps({"build_hash": config.build_hash()}))
    fcntl.flock(holder, fcntl.LOCK_UN)
    holder.close()
    waiter.join(10.0)
    assert returned == [str(out)] and not builds
    assert "waiting for it" in capfd.readouterr().err
