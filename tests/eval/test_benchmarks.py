"""Benchmark loading, wording, subsampling, prompt rendering and stop ids (no models)."""

from __future__ import annotations

import json

import pytest

from dflash.errors import ConfigError
from dflash.eval.benchmarks import (
    BENCHMARKS,
    LIVECODEBENCH_FILES,
    MATH_SUFFIX,
    BenchmarkSpec,
    Sample,
    benchmark_source,
    load_benchmark,
    subsample,
)
from dflash.eval.prompts import PromptBuilder, stop_token_ids
from dflash.toy.tiny import byte_tokenizer

BOXED = MATH_SUFFIX.format()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_humaneval_loads_all_164_prompts_offline():
    samples = load_benchmark(BenchmarkSpec("humaneval"))
    assert len(samples) == 164
    assert [s.index for s in samples] == list(range(164))
    assert all(len(s.turns) == 1 for s in samples)
    first = samples[0].turns[0]
    assert first.startswith("Write a solution to the following problem and make sure that it passes the tests:\n```python\n")
    assert "def has_close_elements" in first and first.endswith("\n```")


def test_humaneval_raw_format_is_the_code_prompt_itself():
    raw = load_benchmark(BenchmarkSpec("humaneval", prompt_format="raw"))[0].turns[0]
    assert raw.startswith("from typing import List\n\n\ndef has_close_elements")
    assert "Write a solution" not in raw


def test_the_smoke_preset_is_humaneval_under_its_own_name():
    """benchmark=smoke reads HumanEval's problems, and results.json (so the tables' header) names smoke."""
    from omegaconf import OmegaConf

    from dflash.cli.common import CONF_DIR

    spec = BenchmarkSpec(**OmegaConf.load(CONF_DIR / "benchmark" / "smoke.yaml").benchmark)
    assert spec.name == "smoke" and spec.max_samples == 4
    humaneval = load_benchmark(BenchmarkSpec("humaneval", prompt_format="raw", max_samples=4))
    assert [s.turns for s in load_benchmark(spec)] == [s.turns for s in humaneval]
    assert benchmark_source(spec) == benchmark_source(BenchmarkSpec("humaneval"))


def test_subsampling_is_deterministic_and_keeps_source_order():
    spec = BenchmarkSpec("humaneval", max_samples=10, seed=3)
    first, again = load_benchmark(spec), load_benchmark(spec)
    indices = [s.index for s in first]
    assert indices == [s.index for s in again]
    assert len(indices) == 10 and indices == sorted(indices)
    other_seed = [s.index for s in load_benchmark(BenchmarkSpec("humaneval", max_samples=10, seed=4))]
    assert other_seed != indices
    assert first[0].turns == load_benchmark(BenchmarkSpec("humaneval"))[indices[0]].turns


def test_subsample_larger_than_the_set_keeps_everything():
    samples = [Sample(turns=[str(i)], index=i) for i in range(5)]
    assert subsample(samples, 50, seed=0) == samples
    assert subsample(samples, None, seed=0) == samples


def test_local_jsonl_rows_with_turns_prompt_question_problem(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [{"turns": ["Hi", "And then?"]}, {"prompt": "P"}, {"question": "Q", "id": 7}, {"problem": "R"}],
    )
    samples = load_benchmark(BenchmarkSpec("jsonl", path=path))
    assert [s.turns for s in samples] == [["Hi", "And then?"], ["P"], ["Q"], ["R"]]


def test_local_rows_may_name_their_family(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl", [{"turns": ["A"], "family": "code"}, {"prompt": "B"}, {"turns": ["C"], "family": "chat"}]
    )
    samples = load_benchmark(BenchmarkSpec("mix", path=path, max_samples=2, seed=1))
    everything = load_benchmark(BenchmarkSpec("mix", path=path))
    assert [(s.index, s.family) for s in everything] == [(0, "code"), (1, None), (2, "chat")]
    assert all(s.family == everything[s.index].family for s in samples)  # subsampling keeps each row's family
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"turns": ["A"], "family": 3}])
    with pytest.raises(ConfigError, match="`family` must be a non-empty string"):
        load_benchmark(BenchmarkSpec("mix", path=bad))


def test_local_copy_of_a_named_benchmark_gets_its_paper_wording(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": "1+1?"}, {"turns": ["already worded"]}])
    paper = load_benchmark(BenchmarkSpec("gsm8k", path=path))
    assert paper[0].turns == ["1+1?" + BOXED]
    assert paper[1].turns == ["already worded"]  # `turns` rows are used verbatim
    raw = load_benchmark(BenchmarkSpec("gsm8k", path=path, prompt_format="raw"))
    assert raw[0].turns == ["1+1?"]


def test_local_jsonl_skips_blank_lines_and_subsamples(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"p{i}"}) for i in range(20)) + "\n\n")
    samples = load_benchmark(BenchmarkSpec("jsonl", path=str(path), max_samples=5, seed=1))
    assert len(samples) == 5
    assert all(s.turns == [f"p{s.index}"] for s in samples)


@pytest.mark.parametrize(
    "content, expected",
    [
        ("", "has no rows"),
        ('{"text": "no known field"}\n', "has none of the fields"),
        ('{"turns": []}\n', "non-empty list"),
        ("not json\n", "not valid JSON"),
        ("[1, 2]\n", "not a JSON object"),
    ],
)
def test_bad_local_files_are_config_errors(tmp_path, content, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=expected) as info:
        load_benchmark(BenchmarkSpec("jsonl", path=str(path)))
    assert info.value.key == "path"  # the field; the apps add the group (benchmark.path)


def test_missing_file_unknown_benchmark_and_empty_selection():
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_benchmark(BenchmarkSpec("jsonl", path="/nonexistent/prompts.jsonl"))
    assert info.value.key == "path"
    with pytest.raises(ConfigError, match="unknown benchmark") as info:
        load_benchmark(BenchmarkSpec("nope"))
    assert info.value.key == "name"
    with pytest.raises(ConfigError, match="no prompts") as info:
        load_benchmark(BenchmarkSpec("humaneval", max_samples=0))
    assert info.value.key == "max_samples"
    with pytest.raises(ConfigError) as info:
        load_benchmark(BenchmarkSpec("humaneval", prompt_format="fancy"))
    assert info.value.key == "prompt_format"


# One representative hub row per benchmark, as `datasets` returns it.
HUB_ROWS = {
    "gsm8k": ({"question": "Q", "answer": "A"}, ["Q" + BOXED]),
    "math500": ({"problem": "P"}, ["P" + BOXED]),
    "aime24": ({"problem": "P"}, ["P" + BOXED]),
    "aime25": ({"problem": "P", "answer": 3}, ["P" + BOXED]),
    "mbpp": ({"prompt": "Write f."}, ["Write f."]),
    "swe_bench_lite": ({"problem_statement": "Bug"}, ["Problem Statement:\nBug\nPlease fix the issue described above."]),
    "mt_bench": ({"prompt": ["T1", "T2"]}, ["T1", "T2"]),
    "alpaca": ({"instruction": "Do", "input": "x"}, ["Do\n\nInput:\nx"]),
}
HUB_SOURCES = {
    "gsm8k": (("openai/gsm8k", "main"), "test"),
    "math500": (("HuggingFaceH4/MATH-500", None), "test"),
    "aime24": (("HuggingFaceH4/aime_2024", None), "train"),
    "aime25": (("MathArena/aime_2025", None), "train"),
    "mbpp": (("google-research-datasets/mbpp", "sanitized"), "test"),
    "swe_bench_lite": (("princeton-nlp/SWE-bench_Lite", None), "test"),
    "mt_bench": (("HuggingFaceH4/mt_bench_prompts", None), "train"),
    "alpaca": (("tatsu-lab/alpaca", None), "train"),
}


@pytest.mark.parametrize("name", sorted(HUB_ROWS))
def test_hub_benchmarks_load_by_hub_name_with_paper_wording(monkeypatch, name):
    import datasets

    calls = []
    row, expected = HUB_ROWS[name]
    row = {**row, "unused": "x" * 100}  # a column the wording does not read

    def fake_load_dataset(*args, split=None, revision=None, **kwargs):
        calls.append((args, split))
        assert revision == "abc123"
        return datasets.Dataset.from_list([row, row])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    samples = load_benchmark(BenchmarkSpec(name, revision="abc123"))
    assert calls == [HUB_SOURCES[name]]
    assert [s.turns for s in samples] == [expected, expected]
    source = benchmark_source(BenchmarkSpec(name, revision="abc123"))
    assert source == {
        "kind": "hub",
        "dataset": HUB_SOURCES[name][0][0],
        "config": HUB_SOURCES[name][0][1],
        "split": HUB_SOURCES[name][1],
        "files": None,
        "revision": "abc123",
    }


def test_only_the_columns_the_wording_reads_are_materialised(monkeypatch):
    import datasets

    from dflash.eval.benchmarks import _hub_rows

    monkeypatch.setattr(
        datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list([{"question": "Q", "answer": "A" * 1000}])
    )
    assert _hub_rows(BENCHMARKS["gsm8k"]) == [{"question": "Q"}]


def test_a_renamed_column_at_a_revision_is_one_config_error(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list([{"query": "Q"}]))
    with pytest.raises(ConfigError) as info:
        load_benchmark(BenchmarkSpec("gsm8k", revision="abc123"))
    assert info.value.key == "revision"
    assert "has no column 'question'" in str(info.value) and "\n" not in str(info.value)


def _livecodebench_row(i: int, private_bytes: int) -> dict:
    """A row of livecodebench/code_generation_lite's test*.jsonl, with every column it has."""
    return {
        "question_title": f"T{i}",
        "question_content": f"Problem {i}.",
        "platform": "leetcode",
        "question_id": str(i),
        "contest_id": "weekly-1",
        "contest_date": "2024-01-01T00:00:00",
        "starter_code": "class Solution:\n    pass" if i % 2 else "",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "1", "output": "1", "testtype": "stdin"}]),
        "private_test_cases": "z" * private_bytes,  # base64 blobs on the hub: gigabytes in all
        "metadata": "{}",
    }


def _livecodebench_hub(monkeypatch, tmp_path, rows_per_file: int, private_bytes: int) -> list:
    """LiveCodeBench's six JSONL files under tmp_path; hf:// addresses of the repo read them."""
    import datasets

    for f, name in enumerate(LIVECODEBENCH_FILES):
        with open(tmp_path / name, "w") as out:
            for i in range(rows_per_file):
                out.write(json.dumps(_livecodebench_row(f * rows_per_file + i, private_bytes)) + "\n")
    calls = []
    real = datasets.load_dataset

    def load_dataset(builder, data_files=None, split=None, **kwargs):
        calls.append((builder, list(data_files), split))
        prefix = "hf://datasets/livecodebench/code_generation_lite@rev1/"
        assert all(f.startswith(prefix) for f in data_files)
        return real(builder, data_files=[str(tmp_path / f.removeprefix(prefix)) for f in data_files], split=split, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    return calls


def test_livecodebench_reads_the_public_jsonl_files_with_the_harness_wording(monkeypatch, tmp_path):
    calls = _livecodebench_hub(monkeypatch, tmp_path, rows_per_file=1, private_bytes=10)
    samples = load_benchmark(BenchmarkSpec("livecodebench", revision="rev1"))
    builder, files, _ = calls[0]
    assert builder == "json"
    assert files[0] == "hf://datasets/livecodebench/code_generation_lite@rev1/test.jsonl" and len(files) == 6
    assert files[-1].endswith("/test6.jsonl")
    with_starter, without = samples[1].turns[0], samples[0].turns[0]
    assert with_starter.startswith("You are an expert Python programmer.")
    assert "### Question:\nProblem 1." in with_starter
    assert "### Format: Use the following code structure:\n```python\nclass Solution:\n    pass\n```" in with_starter
    assert "```python\n# YOUR CODE HERE\n```" in without
    assert without.endswith("### Answer: (use the provided format with backticks)")
    raw = load_benchmark(BenchmarkSpec("livecodebench", prompt_format="raw", revision="rev1"))
    assert raw[0].turns == ["Problem 0."]
    assert benchmark_source(BenchmarkSpec("livecodebench", revision="rev1"))["files"] == list(LIVECODEBENCH_FILES)


def test_livecodebench_memory_stays_bounded_when_the_private_test_cases_are_large(monkeypatch, tmp_path):
    import tracemalloc

    rows, private_bytes = 24, 1_000_000  # 6 files x 24 rows x 1 MB = 144 MB of private test cases
    _livecodebench_hub(monkeypatch, tmp_path, rows_per_file=rows, private_bytes=private_bytes)
    tracemalloc.start()
    try:
        samples = load_benchmark(BenchmarkSpec("livecodebench", revision="rev1"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(samples) == 6 * rows
    unused = 6 * rows * private_bytes
    # list(dataset) of every column held all 144 MB as Python strings at once; what remains is
    # `datasets` reading each file in 10 MiB chunks while it prepares the Arrow cache
    assert peak < unused / 2, f"peak {peak / 1e6:.0f} MB of Python objects for {unused / 1e6:.0f} MB of unused columns"


def test_unreachable_hub_is_a_one_line_config_error_suggesting_a_local_file(monkeypatch):
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(ConfigError) as info:
        load_benchmark(BenchmarkSpec("gsm8k"))
    message = str(info.value)
    assert info.value.key == "path"
    assert "\n" not in message
    assert "unreachable" in message and "benchmark.path=local.jsonl" in message


@pytest.mark.parametrize(
    "error, key, expected",
    [
        (RuntimeError("Dataset scripts are no longer supported, but found gsm8k.py"), "path", "script-based dataset"),
        (ValueError("Unknown split \"test\". Should be one of ['train']."), "path", "Unknown split"),
        (FileNotFoundError("Revision 'abc123' doesn't exist for dataset 'openai/gsm8k'."), "revision", "abc123"),
    ],
)
def test_an_unloadable_hub_dataset_is_one_config_error(monkeypatch, error, key, expected):
    import datasets

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(datasets, "load_dataset", broken)
    with pytest.raises(ConfigError) as info:
        load_benchmark(BenchmarkSpec("gsm8k", revision="abc123"))
    assert info.value.key == key
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_local_and_bundled_benchmarks_record_no_revision(tmp_path):
    assert benchmark_source(BenchmarkSpec("humaneval", revision="abc"))["kind"] == "bundled"
    local = benchmark_source(BenchmarkSpec("gsm8k", path="g.jsonl", revision="abc"))
    assert local == {"kind": "local", "dataset": "g.jsonl", "config": None, "split": None, "files": None, "revision": None}


def test_every_hub_benchmark_config_names_its_revision():
    """The shipped configs pin a revision (a full commit) or say null on purpose; never a branch name."""
    import re

    from omegaconf import OmegaConf

    from dflash.cli.common import CONF_DIR

    pinned = {}
    for name, benchmark in BENCHMARKS.items():
        if benchmark.hub_name is None:
            continue
        config = OmegaConf.load(CONF_DIR / "benchmark" / f"{name}.yaml")
        assert "revision" in config, name
        assert config.revision is None or re.fullmatch(r"[0-9a-f]{40}", config.revision), (name, config.revision)
        pinned[name] = config.revision
    assert {name for name, rev in pinned.items() if rev} >= {"gsm8k", "math500", "aime24", "mbpp", "swe_bench_lite"}


def test_every_named_benchmark_has_a_config_file():
    from dflash.cli.common import CONF_DIR

    for name in BENCHMARKS:
        assert (CONF_DIR / "benchmark" / f"{name}.yaml").is_file(), name


def test_chat_template_is_applied_when_the_tokenizer_has_one():
    tokenizer = byte_tokenizer(chat_template=True)
    builder = PromptBuilder(tokenizer)
    text = builder.text(["Hello", "Hi there", "Bye"])
    assert text == (
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = builder.encode(["Hello"])
    assert ids.shape[0] == 1
    assert ids[0, 0].item() == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.decode(ids[0]) == builder.text(["Hello"])


def test_plain_text_without_a_chat_template_or_when_disabled():
    plain = PromptBuilder(byte_tokenizer(chat_template=False))
    assert plain.text(["Hello", "Hi", "Bye"]) == "Hello\n\nHi\n\nBye"
    disabled = PromptBuilder(byte_tokenizer(chat_template=True), use_chat_template=False)
    assert disabled.text(["Hello"]) == "Hello"
    assert plain.encode(["ab"]).tolist() == [plain.tokenizer("ab")["input_ids"]]


def test_enable_thinking_reaches_the_chat_template():
    tokenizer = byte_tokenizer(chat_template=True)
    tokenizer.chat_template = "{{ messages[0]['content'] }}{% if enable_thinking %}<think>{% else %}<no_think>{% endif %}"
    assert PromptBuilder(tokenizer, enable_thinking=True).text(["x"]) == "x<think>"
    assert PromptBuilder(tokenizer, enable_thinking=False).text(["x"]) == "x<no_think>"


def test_stop_ids_hold_eos_end_of_turn_markers_and_extras():
    chat = byte_tokenizer(chat_template=True)
    eos, im_end = chat.eos_token_id, chat.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(chat) == sorted({eos, im_end})
    plain = byte_tokenizer()
    assert stop_token_ids(plain) == [plain.eos_token_id]

    class GenerationConfig:
        eos_token_id = [plain.eos_token_id, 10]

    assert stop_token_ids(plain, GenerationConfig(), extra=["<|pad|>", 42]) == sorted(
        {plain.eos_token_id, 10, plain.pad_token_id, 42}
    )
    with pytest.raises(ConfigError) as info:
        stop_token_ids(plain, extra=["<|not_a_token|>"])
    assert info.value.key == "decoding.stop_tokens"
