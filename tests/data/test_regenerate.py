"""Regeneration: shards from a tiny target, resumption without regenerating, the
OpenAI-compatible server generator against a loopback server, and the CLI."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dflash.data import HFGenerator, RegenerateSettings, ServerGenerator, shard_paths
from dflash.data.regenerate import regenerate
from dflash.errors import ConfigError
from dflash.structured import config_key
from dflash.target import TargetModel
from dflash.toy.tiny import build_tiny_target

PROMPTS = ["Hi", "What is the capital of France?", "Write a long poem about the sea, please.", "2+2?", "Bye"]


def rows_of(prompts):
    return [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": "old answer"}]} for p in prompts]


class Counting:
    """Wraps a generator and counts its calls and the prompts it answered."""

    def __init__(self, inner):
        self.inner, self.name, self.calls, self.prompts = inner, inner.name, 0, 0
        self.tokenizer = inner.tokenizer  # names the vocabulary of the token ids it returns

    def __call__(self, prompts):
        self.calls += 1
        self.prompts += len(prompts)
        return self.inner(prompts)


def read_rows(out_dir):
    rows = []
    for path in shard_paths(out_dir):
        with open(path) as handle:
            rows += [json.loads(line) for line in handle]
    return rows


@pytest.fixture(scope="module")
def chat_target():
    model, tokenizer = build_tiny_target("qwen3", seed=0, chat_template=True)
    return TargetModel(model, tokenizer)


def test_shards_resume_without_generating_again(chat_target, tmp_path):
    settings = RegenerateSettings(batch_size=2, shard_size=2, max_new_tokens=6)
    generator = Counting(HFGenerator(chat_target, max_new_tokens=6))
    out = regenerate(chat_target, rows_of(PROMPTS), str(tmp_path), settings, generator=generator, progress=False)
    assert [os.path.basename(p) for p in shard_paths(out)] == [
        "rows-00000000-00000002.jsonl",
        "rows-00000002-00000004.jsonl",
        "rows-00000004-00000005.jsonl",
    ]
    assert generator.prompts == 5
    rows = read_rows(out)
    assert [r["messages"][0] for r in rows] == [{"role": "user", "content": p} for p in PROMPTS]
    assert all(r["messages"][1]["role"] == "assistant" and r["messages"][1]["content"] != "old answer" for r in rows)
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]

    again = Counting(HFGenerator(chat_target, max_new_tokens=6))
    regenerate(chat_target, rows_of(PROMPTS), out, settings, generator=again, progress=False)
    assert again.calls == 0
    assert read_rows(out) == rows

    os.remove(shard_paths(out)[1])  # as if the job had died while writing rows 2..3
    resumed = Counting(HFGenerator(chat_target, max_new_tokens=6))
    regenerate(chat_target, rows_of(PROMPTS), out, settings, generator=resumed, progress=False)
    assert resumed.prompts == 2
    assert read_rows(out) == rows  # greedy: the same answers


def test_resuming_with_other_settings_or_prompts_is_an_error(chat_target, tmp_path):
    regenerate(chat_target, rows_of(PROMPTS[:2]), str(tmp_path), RegenerateSettings(max_new_tokens=4), progress=False)
    with pytest.raises(ConfigError) as err:
        regenerate(chat_target, rows_of(PROMPTS[:2]), str(tmp_path), RegenerateSettings(max_new_tokens=5), progress=False)
    assert err.value.key == "regenerate.output_dir" and "settings.max_new_tokens" in str(err.value)
    with pytest.raises(ConfigError) as err:
        regenerate(chat_target, rows_of(PROMPTS[2:4]), str(tmp_path), RegenerateSettings(max_new_tokens=4), progress=False)
    assert "prompts_sha256" in str(err.value)


def test_directory_without_token_ids_is_not_extended_with_them(chat_target, tmp_path):
    settings = RegenerateSettings(shard_size=2, max_new_tokens=4)
    out = regenerate(chat_target, rows_of(PROMPTS[:3]), str(tmp_path), settings, progress=False)
    # As written by the text-only version: no fingerprint in the manifest, a shard missing.
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    del manifest["tokenizer"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    os.remove(shard_paths(out)[1])
    with pytest.raises(ConfigError) as err:
        regenerate(chat_target, rows_of(PROMPTS[:3]), out, settings, progress=False)
    assert err.value.key == "regenerate.output_dir" and "without token ids" in str(err.value)


def test_generator_returning_ids_must_name_its_tokenizer(chat_target, tmp_path):
    class Anonymous:
        name = "anonymous"

        def __call__(self, prompts):
            return HFGenerator(chat_target, max_new_tokens=2)(prompts)

    with pytest.raises(ValueError, match="tokenizer"):
        regenerate(chat_target, rows_of(PROMPTS[:1]), str(tmp_path), generator=Anonymous(), progress=False)


def test_left_padded_batches_generate_what_single_prompts_do(chat_target):
    generator = HFGenerator(chat_target, max_new_tokens=8)
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS[:3]]
    batched = generator(prompts)
    single = [generator([p])[0] for p in prompts]
    assert [g.text for g in batched] == [g.text for g in single]
    assert [g.response_ids for g in batched] == [g.response_ids for g in single]
    assert [g.prompt_ids for g in batched] == [g.prompt_ids for g in single]
    assert all(g.num_tokens <= 8 for g in batched)


def test_sampling_is_reproducible_per_shard(chat_target, tmp_path):
    settings = RegenerateSettings(batch_size=2, shard_size=2, max_new_tokens=6, temperature=1.0, top_p=0.9)
    first = regenerate(chat_target, rows_of(PROMPTS[:4]), str(tmp_path / "a"), settings, progress=False)
    os.remove(shard_paths(first)[0])
    regenerate(chat_target, rows_of(PROMPTS[:4]), first, settings, progress=False)
    second = regenerate(chat_target, rows_of(PROMPTS[:4]), str(tmp_path / "b"), settings, progress=False)
    assert read_rows(first) == read_rows(second)


def test_plain_text_target_stops_at_eos():
    model, tokenizer = build_tiny_target("llama", seed=1)
    generator = HFGenerator(TargetModel(model, tokenizer), max_new_tokens=5)
    assert generator.stop_ids == {tokenizer.eos_token_id}
    (answer,) = generator([[{"role": "user", "content": "Once upon a time"}]])
    assert isinstance(answer.text, str) and 1 <= answer.num_tokens <= 5


def test_bad_settings_and_rows_name_their_keys(chat_target, tmp_path):
    for field, value in [("batch_size", 0), ("shard_size", 0), ("max_new_tokens", 0), ("top_p", 0.0), ("temperature", -1.0)]:
        with pytest.raises(ConfigError) as err, config_key("regenerate"):  # the entry point's adapter adds the group
            regenerate(chat_target, rows_of(PROMPTS[:1]), str(tmp_path), RegenerateSettings(**{field: value}), progress=False)
        assert err.value.key == f"regenerate.{field}"
    with pytest.raises(ConfigError) as err:
        regenerate(chat_target, [{"messages": [{"role": "system", "content": "s"}]}], str(tmp_path), progress=False)
    assert err.value.key == "data"


class CannedChat(BaseHTTPRequestHandler):
    """A stand-in for vLLM / SGLang: lists one model and answers every chat request."""

    bodies: list[dict] = []

    def do_GET(self):
        self._reply(200, {"object": "list", "data": [{"id": "canned-model", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        CannedChat.bodies.append(body)
        if body["model"] != "canned-model":
            return self._reply(404, {"error": f"model {body['model']} not found"})
        question = body["messages"][-1]["content"]
        message = {"role": "assistant", "content": f"answer to {question}"}
        if "think" in question:
            message["reasoning_content"] = "let me see"
        self._reply(200, {"choices": [{"message": message, "finish_reason": "stop"}], "usage": {"completion_tokens": 3}})

    def _reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def canned_server():
    CannedChat.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), CannedChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_server_generator_writes_shards(canned_server, tmp_path):
    settings = RegenerateSettings(batch_size=3, shard_size=4, max_new_tokens=32, server_url=canned_server, enable_thinking=False)
    prompts = PROMPTS + ["think about it"]
    out = regenerate(None, rows_of(prompts), str(tmp_path), settings, progress=False)
    answers = [r["messages"][-1]["content"] for r in read_rows(out)]
    assert answers[:5] == [f"answer to {p}" for p in PROMPTS]
    # A server returns text only: no token ids and no tokenizer in the manifest.
    assert not any("token_ids" in r for r in read_rows(out))
    assert "tokenizer" not in json.loads((tmp_path / "manifest.json").read_text())
    assert answers[5] == "<think>\nlet me see\n</think>\n\nanswer to think about it"
    body = CannedChat.bodies[0]
    assert body["model"] == "canned-model" and body["max_tokens"] == 32 and body["temperature"] == 0.0
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    # Only the prompt is sent: the dataset's old answer is what gets replaced.
    assert sorted(b["messages"][0]["content"] for b in CannedChat.bodies) == sorted(prompts)
    assert all(len(b["messages"]) == 1 for b in CannedChat.bodies)
    requests = len(CannedChat.bodies)
    regenerate(None, rows_of(prompts), out, settings, progress=False)
    assert len(CannedChat.bodies) == requests  # resumed: nothing asked again


def test_server_errors_name_the_server_keys(canned_server):
    generator = ServerGenerator(f"{canned_server}/chat/completions", model="other-model", retries=0)
    assert generator.endpoint == f"{canned_server}/chat/completions"
    with pytest.raises(ConfigError) as err:
        generator([[{"role": "user", "content": "hi"}]])
    assert err.value.key == "regenerate.server_url" and "404" in str(err.value)
    with pytest.raises(ConfigError) as err:
        ServerGenerator("http://127.0.0.1:9/v1", retries=0, timeout_s=2)  # nothing listens on port 9
    assert err.value.key == "regenerate.server_url"


def test_cli_regenerates_a_local_file_and_reports_bad_config_in_one_line(tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    from dflash.cli.common import CONF_DIR
    from dflash.cli.regenerate import _hydra_main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:3]))
    out = tmp_path / "regenerated"
    overrides = [
        f"paths.root={tmp_path}",
        f"paths.output_dir={tmp_path}",  # what Hydra sets (${hydra:runtime.output_dir}), called without it
        f"data.path={prompts}",
        f"regenerate.output_dir={out}",
        "regenerate.max_new_tokens=4",
        "regenerate.shard_size=2",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        _hydra_main(compose("regenerate", overrides=overrides))
        assert len(read_rows(str(out))) == 3
        assert f"regenerated 3 conversations: {out}" in capsys.readouterr().out

        with pytest.raises(SystemExit) as exit_info:
            _hydra_main(
                compose("regenerate", overrides=[f"paths.root={tmp_path}", f"paths.output_dir={tmp_path}", f"data.path={prompts}"])
            )
        assert exit_info.value.code == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("error: regenerate.output_dir: ") and "\n" not in error

        with pytest.raises(SystemExit):
            _hydra_main(
                compose(
                    "regenerate",
                    overrides=[
                        f"paths.root={tmp_path}",
                        f"paths.output_dir={tmp_path}",
                        f"data.path={tmp_path / 'none.jsonl'}",
                        f"regenerate.output_dir={out}",
                    ],
                )
            )
        assert capsys.readouterr().err.startswith("error: data.path: ")
