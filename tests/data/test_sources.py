"""Sources: every layout normalises to chat messages; bad inputs name their config key."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from dflash.data import DataSpec, SourceSpec, iter_conversations, load_conversations, split_prompt
from dflash.data.sources import describe_source
from dflash.errors import ConfigError


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_messages_layout(tmp_path):
    path = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello"},
                ]
            }
        ],
    )
    rows = load_conversations(SourceSpec(path=path))
    assert rows == [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
            ]
        }
    ]


def test_regenerated_rows_keep_their_token_ids_and_stream(tmp_path):
    ids = {"tokenizer": "0123456789abcdef", "prompt": [1, 2], "response": [300, 256]}
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\ufffd"}]
    path = write_jsonl(tmp_path / "rows.jsonl", [{"messages": chat, "token_ids": ids}, {"messages": chat[:1], "token_ids": ids}])
    assert load_conversations(SourceSpec(path=path), require_response=True) == [{"messages": chat, "token_ids": ids}]
    stream = iter_conversations(SourceSpec(path=path))
    assert next(stream) == {"messages": chat, "token_ids": ids}
    assert next(stream) == {"messages": chat[:1], "token_ids": ids}
    with pytest.raises(ConfigError) as err:
        next(iter_conversations(SourceSpec(path=str(tmp_path / "missing.jsonl"))))
    assert err.value.key == "data.path"


def test_sharegpt_layout_maps_roles_and_drops_leading_assistant(tmp_path):
    conversation = [
        {"from": "gpt", "value": "Welcome!"},
        {"from": "human", "value": "2+2?"},
        {"from": "gpt", "value": "4"},
        {"from": "human", "value": "and 3+3?"},
        {"from": "gpt", "value": "6"},
    ]
    path = write_jsonl(tmp_path / "sharegpt.jsonl", [{"id": "a", "conversations": conversation}])
    (row,) = load_conversations(SourceSpec(path=path, format="sharegpt"))
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant"]
    assert [m["content"] for m in row["messages"]] == ["2+2?", "4", "and 3+3?", "6"]


def test_prompt_response_layout_with_alpaca_input_from_parquet(tmp_path):
    import pandas as pd

    path = tmp_path / "alpaca.parquet"
    pd.DataFrame({"instruction": ["Sum a list", "Say hi"], "input": ["[1, 2]", ""], "output": ["3", "hi"]}).to_parquet(path)
    spec = SourceSpec(path=str(path), prompt_column="instruction", input_column="input", response_column="output")
    rows = load_conversations(spec)
    assert rows[0]["messages"] == [{"role": "user", "content": "Sum a list\n\n[1, 2]"}, {"role": "assistant", "content": "3"}]
    assert rows[1]["messages"] == [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]


def test_prompt_only_rows_are_prompts_for_regeneration(tmp_path):
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Write a haiku"}])
    (row,) = load_conversations(SourceSpec(path=path, response_column=None))
    assert row["messages"] == [{"role": "user", "content": "Write a haiku"}]
    assert split_prompt(row["messages"]) == (row["messages"], None)


def test_directory_of_shards_is_read_in_order_and_skips_manifest(tmp_path):
    for start in (0, 2):
        write_jsonl(
            tmp_path / f"rows-{start:08d}-{start + 2:08d}.jsonl",
            [{"messages": [{"role": "user", "content": f"q{start + i}"}, {"role": "assistant", "content": "a"}]} for i in range(2)],
        )
    (tmp_path / "manifest.json").write_text("{}")
    rows = load_conversations(SourceSpec(path=str(tmp_path)))
    assert [row["messages"][0]["content"] for row in rows] == ["q0", "q1", "q2", "q3"]


def test_unusable_rows_are_skipped_and_empty_system_prompts_dropped(tmp_path):
    rows = [
        {"messages": [{"role": "assistant", "content": "no question"}]},
        {"messages": [{"role": "user", "content": "ok"}, {"role": "robot", "content": "?"}]},
        {"messages": [{"role": "user", "content": ["not", "text"]}]},
        {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "kept"}]},
    ]
    loaded = load_conversations(SourceSpec(path=write_jsonl(tmp_path / "mixed.jsonl", rows)))
    assert loaded == [{"messages": [{"role": "user", "content": "kept"}]}]


def test_limit_keeps_the_first_rows(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(5)])
    rows = load_conversations(SourceSpec(path=path, limit=2, response_column=None))
    assert [row["messages"][0]["content"] for row in rows] == ["p0", "p1"]


@pytest.mark.parametrize("missing", ["does/not/exist.jsonl", "/nonexistent/dir", "./missing.parquet"])
def test_missing_path_names_data_path(missing):
    with pytest.raises(ConfigError) as err:
        load_conversations(SourceSpec(path=missing))
    assert err.value.key == "data.path"


def test_training_without_responses_names_the_response_column(tmp_path):
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Write a haiku"}])
    with pytest.raises(ConfigError) as err:
        load_conversations(SourceSpec(path=path, response_column=None), require_response=True)
    assert err.value.key == "data.response_column"
    with pytest.raises(ConfigError) as err:  # the default column name is absent from the file
        load_conversations(SourceSpec(path=path), key="data.sources[1]", require_response=True)
    assert err.value.key == "data.sources[1].response_column"


def test_chat_rows_without_any_response_name_data_path(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(ConfigError) as err:
        load_conversations(SourceSpec(path=path), require_response=True)
    assert err.value.key == "data.path"


def test_bad_layout_settings_name_their_keys(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(ConfigError) as err:
        load_conversations(SourceSpec(path=path))
    assert err.value.key == "data.format"
    with pytest.raises(ConfigError) as err:
        load_conversations(SourceSpec(path=path, format="chatml"))
    assert err.value.key == "data.format"
    with pytest.raises(ConfigError) as err:
        load_conversations(SourceSpec(path=path, format="sharegpt"))
    assert err.value.key == "data.conversations_column"
    with pytest.raises(ConfigError) as err:
        load_conversations(SourceSpec(path=path, prompt_column="question", input_column="context"))
    assert err.value.key == "data.input_column"
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(ConfigError) as err:
        load_conversations(SourceSpec(path=str(broken)))
    assert err.value.key == "data.path"
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ConfigError) as err:
        load_conversations(SourceSpec(path=str(text)))
    assert err.value.key == "data.path"


def test_data_schema_checks_keys_and_builds_sources():
    from dflash.structured import typed

    spec = typed(
        DataSpec,
        {"path": "out", "sources": [{"path": "org/a", "split": "chat"}, {"path": "b.jsonl", "response_column": None}]},
        "data",
    )
    assert [(s.path, s.split) for s in spec.sources] == [("org/a", "chat"), ("b.jsonl", "train")]
    assert [key for _, key in spec.prompt_sources()] == ["data.sources[0]", "data.sources[1]"]
    assert DataSpec(path="x.jsonl").prompt_sources()[0][1] == "data"
    with pytest.raises(ConfigError) as err:
        typed(DataSpec, {"path": "out", "max_len": 5}, "data")
    assert err.value.key == "data.max_len"
    with pytest.raises(ConfigError) as err:
        typed(DataSpec, {"path": "out", "sources": [{"path": "org/a", "colum": "x"}]}, "data")
    assert err.value.key == "data.sources[0].colum"


def _prompts(path: str, limit: int | None, key: str = "data") -> list[str]:
    rows = load_conversations(SourceSpec(path=path, limit=limit, response_column=None), key)
    assert all(len(row["messages"]) == 1 and row["messages"][0]["role"] == "user" for row in rows)
    return [row["messages"][0]["content"] for row in rows]


def test_builtin_prompt_families_are_seeded_samples_in_the_benchmarks_wording():
    from dflash.eval.benchmarks import HUMANEVAL_TEMPLATE, MATH_SUFFIX
    from dflash.toy.tiny_code_prompts import humaneval_prompts

    code = _prompts("builtin:code", 40)
    assert len(code) == len(set(code)) == 40 and code == _prompts("builtin:code", 40)
    assert any(p.startswith(HUMANEVAL_TEMPLATE.split("{")[0]) for p in code)  # the harness's wording among others
    assert all("```python\ndef " in p or "```python\nasync def " in p for p in code)
    evaluation = [p.strip() for p in humaneval_prompts()]
    assert not any(e in p for p in code for e in evaluation)
    math = _prompts("builtin:math", 300)
    assert len(set(math)) == 300 and all(p.endswith(MATH_SUFFIX.format()) for p in math)
    assert _prompts("builtin:math", 10) == math[:10]  # a limit takes the first of one seeded order
    chat = _prompts("builtin:chat", 300)
    assert len(set(chat)) == 300 and not set(chat) & set(math)


@pytest.mark.parametrize(
    "path, limit, key, message",
    [
        ("builtin:poetry", 5, "data.sources[1].path", "choose one of ['builtin:code', 'builtin:math', 'builtin:chat']"),
        ("builtin:chat", 100_000, "data.sources[1].limit", "distinct prompts"),
        ("builtin:code", 100_000, "data.sources[1].limit", "builtin:code: asked for 100000 prompts but the stdlib has only"),
    ],
)
def test_a_bad_builtin_source_is_one_config_error(path, limit, key, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        _prompts(path, limit, "data.sources[1]")
    assert err.value.key == key


# Hub sources, served from local directories laid out as the real repos (tests/helpers/hub.py).
NEMOTRON = "nvidia/Nemotron-Post-Training-Dataset-v2"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    from helpers.hub import LocalHub

    return LocalHub(monkeypatch, tmp_path / "hf-cache")


def _nemotron(tmp_path, hub, chat_shards: int = 4, rows_per_shard: int = 50):
    """A Nemotron v2 layout: `chat` in shards ordered by source (shard i holds source i only),
    `code` readable, and `math` plus a multilingual split that fail if read at all."""
    from helpers.hub import chat_row, write_parquet_shards, write_unreadable_split

    root = tmp_path / "nemotron"
    shards = [[chat_row(f"chat {i}-{j}", f"source{i}") for j in range(rows_per_shard)] for i in range(chat_shards)]
    write_parquet_shards(root, "chat", shards)
    write_parquet_shards(root, "code", [[chat_row(f"code 0-{j}", "code") for j in range(20)]] * 2)
    write_unreadable_split(root, "math")
    write_unreadable_split(root, "multilingual_ja")
    hub.repos[NEMOTRON] = str(root)
    return root


def _source_of(row) -> int:
    return int(row["messages"][0]["content"].split()[1].split("-")[0])


def test_a_limited_hub_source_is_a_seeded_sample_not_the_first_rows(tmp_path, hub):
    _nemotron(tmp_path, hub)
    spec = SourceSpec(path=NEMOTRON, split="chat", data_files="data/chat-*.parquet", format="messages", limit=40)
    rows = load_conversations(spec)
    assert len(rows) == 40
    # the first 40 rows in file order all come from shard 0 (source 0); a sample spans the shards
    assert {_source_of(r) for r in rows} == {0, 1, 2, 3}
    assert hub.calls[-1]["streaming"] is True
    assert load_conversations(spec) == rows  # seeded: the same draw again
    assert load_conversations(dataclasses.replace(spec, seed=1)) != rows
    summary = describe_source(spec, len(rows))
    assert "seed 0" in summary and "shuffle" in summary and "first 40 kept" in summary
    assert f"{NEMOTRON}@main (no revision pinned)" in summary


def test_a_small_shuffle_buffer_still_draws_the_shards_in_a_seeded_order(tmp_path, hub):
    _nemotron(tmp_path, hub, chat_shards=8, rows_per_shard=10)
    spec = SourceSpec(path=NEMOTRON, split="chat", data_files="data/chat-*.parquet", limit=5, shuffle_buffer=1)
    first_shards = {_source_of(load_conversations(dataclasses.replace(spec, seed=seed))[0]) for seed in range(3)}
    assert len(first_shards) > 1  # not always shard 0


@pytest.mark.parametrize("limit", [None, 15])
def test_a_hub_source_reads_only_the_files_of_its_split(tmp_path, hub, limit):
    _nemotron(tmp_path, hub)
    spec = SourceSpec(path=NEMOTRON, split="code", data_files="data/code-*.parquet", format="messages", limit=limit)
    rows = load_conversations(spec)  # math and multilingual_ja are unreadable: reading them would fail
    assert len(rows) == (limit or 40)
    assert all(r["messages"][0]["content"].startswith("code ") for r in rows)
    assert hub.calls[-1]["data_files"] == {"code": "data/code-*.parquet"}
    # the control: without data_files, `datasets` prepares every split and trips on the unreadable ones
    if limit is None:
        with pytest.raises(ConfigError) as err:
            load_conversations(SourceSpec(path=NEMOTRON, split="code", format="messages"), "data.sources[2]")
        assert err.value.key == "data.sources[2].path" and "\n" not in str(err.value)


def test_a_revision_reaches_the_hub_and_only_hub_sources_take_one(tmp_path, hub):
    _nemotron(tmp_path, hub)
    spec = SourceSpec(path=NEMOTRON, split="code", data_files="data/code-*.parquet", revision="0123abc", limit=3)
    load_conversations(spec)
    assert hub.calls[-1]["revision"] == "0123abc"
    assert describe_source(spec).startswith(f"{NEMOTRON}@0123abc (split code, files data/code-*.parquet)")
    local = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "p"}])
    for path in (local, "builtin:math"):
        with pytest.raises(ConfigError) as err:
            load_conversations(SourceSpec(path=path, revision="0123abc", response_column=None), "data.sources[0]")
        assert err.value.key == "data.sources[0].revision"


def test_a_script_based_hub_dataset_is_one_config_error(tmp_path, hub):
    scripted = tmp_path / "scripted"
    scripted.mkdir()
    (scripted / "scripted.py").write_text("import datasets\n")  # a loading script, as old hub datasets have
    hub.repos["someone/scripted"] = str(scripted)
    for limit in (None, 10):
        with pytest.raises(ConfigError) as err:
            load_conversations(SourceSpec(path="someone/scripted", limit=limit), "data.sources[1]")
        message = str(err.value)
        assert err.value.key == "data.sources[1].path" and "\n" not in message
        assert "script-based dataset" in message and "refs/convert/parquet" in message


@pytest.mark.slow
def test_regenerate_exits_2_with_one_line_for_a_script_based_source(tmp_path):
    import subprocess
    import sys

    scripted = tmp_path / "scripted"
    scripted.mkdir()
    (scripted / "scripted.py").write_text("import datasets\n")
    program = (
        "import sys, datasets\n"
        "real = datasets.load_dataset\n"
        f"datasets.load_dataset = lambda path, *a, revision=None, **k: real({str(scripted)!r} if path == 'someone/scripted' else path, *a, **k)\n"
        "from dflash.cli.regenerate import main\n"
        "main()\n"
    )
    args = [
        "target=tiny_qwen3",
        "data=local_jsonl",
        f"data.path={tmp_path / 'out'}",
        "data.sources=[{path: someone/scripted, response_column: null}]",
        f"regenerate.output_dir={tmp_path / 'out'}",
        f"paths.artifacts={tmp_path / 'artifacts'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: data.sources[0].path: cannot load dataset 'someone/scripted'")
    assert "Traceback" not in done.stderr
