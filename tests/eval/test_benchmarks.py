"""Benchmark loading, wording, subsampling, prompt rendering and stop ids (no models)."""

from __future__ import annotations

import json

import pytest

from dflash.errors import ConfigError
from dflash.eval.benchmarks import BENCHMARKS, MATH_SUFFIX, BenchmarkSpec, Sample, load_benchmark, subsample
from dflash.eval.prompts import PromptBuilder, stop_token_ids
from dflash.target.tiny import byte_tokenizer

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
    assert info.value.key == "benchmark.path"


def test_missing_file_unknown_benchmark_and_empty_selection():
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_benchmark(BenchmarkSpec("jsonl", path="/nonexistent/prompts.jsonl"))
    assert info.value.key == "benchmark.path"
    with pytest.raises(ConfigError, match="unknown benchmark") as info:
        load_benchmark(BenchmarkSpec("nope"))
    assert info.value.key == "benchmark.name"
    with pytest.raises(ConfigError, match="no prompts") as info:
        load_benchmark(BenchmarkSpec("humaneval", max_samples=0))
    assert info.value.key == "benchmark.max_samples"
    with pytest.raises(ConfigError) as info:
        load_benchmark(BenchmarkSpec("humaneval", prompt_format="fancy"))
    assert info.value.key == "benchmark.prompt_format"


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

    def fake_load_dataset(*args, split=None, **kwargs):
        calls.append((args, split))
        return [row, row]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    samples = load_benchmark(BenchmarkSpec(name))
    assert calls == [HUB_SOURCES[name]]
    assert [s.turns for s in samples] == [expected, expected]


def test_livecodebench_reads_the_public_jsonl_files_with_the_harness_wording(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(builder, data_files=None, split=None):
        calls.append((builder, data_files, split))
        return [
            {"question_content": "Sum two ints.", "starter_code": "class Solution:\n    pass"},
            {"question_content": "Q2", "starter_code": ""},
        ]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    samples = load_benchmark(BenchmarkSpec("livecodebench"))
    builder, files, _ = calls[0]
    assert builder == "json"
    assert files[0] == "hf://datasets/livecodebench/code_generation_lite/test.jsonl" and len(files) == 6
    assert files[-1].endswith("/test6.jsonl")
    with_starter, without = samples[0].turns[0], samples[1].turns[0]
    assert with_starter.startswith("You are an expert Python programmer.")
    assert "### Question:\nSum two ints." in with_starter
    assert "### Format: Use the following code structure:\n```python\nclass Solution:\n    pass\n```" in with_starter
    assert "```python\n# YOUR CODE HERE\n```" in without
    assert without.endswith("### Answer: (use the provided format with backticks)")
    raw = load_benchmark(BenchmarkSpec("livecodebench", prompt_format="raw"))
    assert raw[0].turns == ["Sum two ints."]


def test_unreachable_hub_is_a_one_line_config_error_suggesting_a_local_file(monkeypatch):
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(ConfigError) as info:
        load_benchmark(BenchmarkSpec("gsm8k"))
    message = str(info.value)
    assert info.value.key == "benchmark.path"
    assert "\n" not in message
    assert "unreachable" in message and "benchmark.path=local.jsonl" in message


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
