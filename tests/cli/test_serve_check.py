"""`python -m dflash.serve_check` without llama.cpp: what it reads from llama.cpp's output
(captured from build 11434 on SmolLM2-135M-Instruct with the demo's drafter), the token
comparison, the pooled figures, the target it takes from the drafter's run, and a whole check
on a tiny target with llama.cpp's programs stood in for. Fetching and building llama.cpp are
`dflash.bench`'s (tests/cli/test_bench.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dflash import serve_check
from dflash.drafter import save_drafter
from dflash.specs import DrafterSpec, build_drafter

PROMPT = "<|im_start|>user\nList 3 colours.<|im_end|>\n<|im_start|>assistant\n"
SPECULATIVE_STDERR = """\
0.11.914.843 I common_speculative_impl_draft_dflash: - block_size=3, mask_token_id=16, n_extract=3, sample_from_anchor=true
1.06.979.123 I encoded   47 tokens in    1.303 seconds, speed:   36.079 t/s
1.06.979.124 I decoded   94 tokens in   53.762 seconds, speed:    1.748 t/s
1.06.979.125 I n_draft   = 2
1.06.979.126 I n_predict = 94
1.06.979.126 I n_drafted = 134
1.06.979.127 I n_accept  = 27
1.06.979.128 I accept    = 20.149%
1.06.979.192 I common_perf_print: prompt eval time =   46685.48 ms /   249 tokens (  187.49 ms per token,     5.33 tokens per second)
"""
COMPLETION_STDERR = """\
0.35.246.535 I common_perf_print: prompt eval time =    1646.93 ms /    47 tokens (   35.04 ms per token,    28.54 tokens per second)
0.35.246.544 I common_perf_print:        eval time =   32262.98 ms /    93 runs   (  346.91 ms per token,     2.88 tokens per second)
"""


def test_speculative_output_gives_text_acceptance_and_time():
    stdout = "\n\n" + PROMPT + "1. red\n2. blue\n\n" + "\n\n\n\n"  # the text ends in a blank line of its own
    parsed = serve_check.parse_speculative(stdout, SPECULATIVE_STDERR, PROMPT)
    assert parsed == {
        "text": "1. red\n2. blue\n\n",
        "prompt_tokens": 47,
        "tokens": 94,
        "accepted": 27,
        "drafted": 134,
        "seconds": 53.762,
    }
    with pytest.raises(ValueError, match="echo the prompt"):
        serve_check.parse_speculative("\n\nanother prompt", SPECULATIVE_STDERR, PROMPT)
    with pytest.raises(ValueError, match="n_accept"):
        serve_check.parse_speculative(stdout, SPECULATIVE_STDERR.replace("n_accept", "n_other"), PROMPT)


@pytest.mark.parametrize("ending", [" [end of text]\n\n\n", "\n\n"])  # a stop token; the length limit
def test_completion_output_gives_text_and_decode_time(ending):
    parsed = serve_check.parse_completion("1. red\n2. blue" + ending, COMPLETION_STDERR)
    assert parsed == {"text": "1. red\n2. blue", "forwards": 93, "seconds": pytest.approx(32.26298)}


def test_outputs_compare_token_for_token_without_the_final_stop_token():
    def tokenizer(text, add_special_tokens):
        assert add_special_tokens is False
        return {"input_ids": [ord(c) for c in text]}

    stops = [2]
    assert serve_check.same_tokens(tokenizer, "ab", [97, 98, 2], stops)
    assert not serve_check.same_tokens(tokenizer, "abc", [97, 98, 2], stops)  # we stopped, llama.cpp went on
    assert not serve_check.same_tokens(tokenizer, "ab", [97, 99, 2], stops)
    # at the length limit: llama.cpp's speculative run may overshoot it
    assert serve_check.same_tokens(tokenizer, "ab", [97, 98], stops)
    assert serve_check.same_tokens(tokenizer, "abcd", [97, 98], stops)
    assert not serve_check.same_tokens(tokenizer, "a", [97, 98], stops)


def _row(tokens, accepted, drafted, ours_tokens, ours_steps, identical=True):
    return {
        "served": {"tokens": tokens, "accepted": accepted, "drafted": drafted, "seconds": 1.0},
        "plain": {"forwards": tokens - 1, "seconds": 2.0},
        "ours": {
            "ar": {"tokens": ours_tokens, "steps": ours_tokens - 1, "seconds": 4.0},
            "dflash": {"tokens": ours_tokens, "steps": ours_steps, "seconds": 2.0},
        },
        "identical": {"prompt_tokens": True, "ours_dflash": True, "llama_plain": True, "llama_dflash": identical},
    }


def test_summary_pools_every_prompt(tmp_path):
    args = serve_check.parse_args(["--drafter", str(tmp_path)])
    rows = [_row(94, 27, 134, 94, 60), _row(32, 11, 42, 32, 20)]
    summary = serve_check.summarize(rows, args, "a CPU", 3, "target")
    assert summary["tau"]["served"] == pytest.approx(126 / (126 - 38))  # tokens per target forward
    assert summary["tau"]["ours"] == pytest.approx((126 - 2) / 80)  # the prefill's token is no step
    assert summary["served_acceptance"] == pytest.approx(38 / 176)
    assert summary["tokens_per_s"] == pytest.approx(
        {"llama.cpp plain": 124 / 4, "llama.cpp + drafter": 126 / 2, "ours plain": 124 / 8, "ours DFlash": 124 / 4}
    )
    assert summary["identical"] is True
    assert serve_check.summarize([*rows, _row(8, 1, 6, 8, 6, identical=False)], args, "a CPU", 3, "t")["identical"] is False
    assert "tau: served 1.432" in serve_check.report(summary)


def test_a_drafter_without_config_is_one_line_before_anything_loads(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve_check.main(["--drafter", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --drafter: ") and "has no config.json" in err and len(err.strip().splitlines()) == 1


def write_run(run: Path, target: dict) -> Path:
    """A training run directory as `python -m dflash.train` leaves it, as far as serve_check reads
    it: the Hydra config naming `target`, and the `drafter/` directory; returns the latter."""
    (run / ".hydra").mkdir(parents=True)
    config = {"paths": {"artifacts": str(run.parent)}, "target": target}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "drafter").mkdir()
    (run / "drafter" / "config.json").write_text("{}")
    return run / "drafter"


def test_the_target_is_the_one_the_drafter_was_trained_for_unless_given(tmp_path):
    (tmp_path / "targets" / "t").mkdir(parents=True)
    trained = {"path": "${paths.artifacts}/targets/t", "dtype": "bfloat16", "engine": "fast", "device": "cuda", "build": None}
    drafter = write_run(tmp_path / "run", trained)
    spec = serve_check.drafter_target(serve_check.parse_args(["--drafter", str(drafter)]))
    # served here: on this CPU, in --dtype, with the engine's own choice
    assert (spec.path, spec.dtype, spec.device, spec.engine) == (str(tmp_path / "targets" / "t"), "float32", "cpu", "auto")
    given = serve_check.drafter_target(serve_check.parse_args(["--drafter", str(drafter), "--target", str(tmp_path)]))
    assert given.path == str(tmp_path)


@pytest.mark.parametrize(
    ("target", "says"),
    [
        (None, "is not the drafter/ of a training run, so it names no target: give --target"),
        ({"path": "${paths.artifacts}/targets/tiny", "build": {"arch": "qwen3", "seed": 0}}, "is a tiny target built here"),
        ({"path": "Qwen/Qwen3-8B"}, "Qwen/Qwen3-8B is no local directory, which llama.cpp's converter needs"),
    ],
)
def test_a_target_llama_cpp_cannot_serve_is_one_line_before_anything_loads(tmp_path, capsys, target, says):
    drafter = write_run(tmp_path / "run", target) if target else tmp_path / "drafter"
    drafter.mkdir(exist_ok=True)
    (drafter / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        serve_check.main(["--drafter", str(drafter)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --target: ") and says in err and len(err.strip().splitlines()) == 1


# llama.cpp's two programs, stood in for: each keeps its arguments and prints what build 11434 prints
STAND_IN = """#!/bin/bash
echo "$@" > "$0.argv"
while [ $# -gt 0 ]; do [ "$1" = -p ] && prompt="$2"; shift; done
{stdout}
cat "$0.stderr" >&2
"""


# the drafter's architecture -> how llama.cpp serves it, with --confidence-threshold 0.25
SERVED = {
    "dflash": ["--spec-type", "draft-dflash"],
    "dspark": ["--spec-type", "draft-dspark", "--spec-draft-p-min", "0.25"],
    "dflash2": ["--spec-type", "draft-dflash", "--spec-draft-p-min", "0.25"],
}


def served_drafter(target, method: str):
    built = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), target)
    if method == "dspark":
        built.add_dspark_heads(rank=4, confidence=True)
    if method == "dflash2":
        built.add_dflash2_parts(kernel_size=2, group_size=16, rank=4, top_k=4)
    return built


@pytest.mark.parametrize("method", sorted(SERVED))
def test_a_drafter_is_served_with_its_runs_target_drafting_its_block_less_one(qwen3_target, tmp_path, monkeypatch, method):
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path / "artifacts"))
    target_dir = tmp_path / "targets" / "tiny"
    qwen3_target.model.save_pretrained(target_dir)
    qwen3_target.tokenizer.save_pretrained(target_dir)
    drafter = write_run(tmp_path / "run", {"path": "${paths.artifacts}/targets/tiny", "build": None})
    save_drafter(served_drafter(qwen3_target, method), str(drafter))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    outputs = {
        "llama-speculative-simple": (r"printf '\n\n%s1. red\n\n\n\n' " + '"$prompt"', SPECULATIVE_STDERR),
        "llama-completion": (r"printf '1. red\n\n'", COMPLETION_STDERR),
    }
    for name, (stdout, stderr) in outputs.items():
        (bindir / name).write_text(STAND_IN.format(stdout=stdout))
        (bindir / name).chmod(0o755)
        (bindir / f"{name}.stderr").write_text(stderr)
    converted = []
    monkeypatch.setattr(serve_check, "fetch_source", lambda root: "src")
    monkeypatch.setattr(serve_check, "build", lambda root, source, binaries: str(bindir))
    monkeypatch.setattr(
        serve_check, "convert", lambda *args, **kwargs: converted.append((args, kwargs)) or f"m{len(converted)}.gguf"
    )
    out = tmp_path / "check.json"
    threshold = ["--confidence-threshold", "0.25"] if method != "dflash" else []
    serve_check.main(["--drafter", str(drafter), "--families", "chat", "--prompts-per-family", "1", "--max-new-tokens", "4", "--threads", "1", "--out", str(out), *threshold])  # fmt: skip
    summary = json.loads(out.read_text())
    assert (summary["target"], summary["block_size"], summary["prompts"], summary["method"]) == (str(target_dir), 4, 1, method)
    assert [(args[2], kwargs) for args, kwargs in converted] == [
        (str(target_dir), {}),
        (str(drafter), {"target_dir": str(target_dir)}),
    ]
    served = (bindir / "llama-speculative-simple.argv").read_text().split()
    flags = SERVED[method]
    assert served[served.index("--spec-type") : served.index("--spec-type") + len(flags)] == flags
    assert served[served.index("--spec-draft-n-max") + 1] == "3"
    assert served[served.index("-m") + 1] == "m1.gguf" and served[served.index("-md") + 1] == "m2.gguf"


def test_a_confidence_threshold_for_a_dflash_drafter_is_one_line(qwen3_target, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path / "artifacts"))
    qwen3_target.model.save_pretrained(tmp_path / "targets" / "tiny")
    qwen3_target.tokenizer.save_pretrained(tmp_path / "targets" / "tiny")
    drafter = write_run(tmp_path / "run", {"path": "${paths.artifacts}/targets/tiny", "build": None})
    save_drafter(served_drafter(qwen3_target, "dflash"), str(drafter))
    monkeypatch.setattr(serve_check, "fetch_source", lambda root: pytest.fail("fetched llama.cpp"))
    with pytest.raises(SystemExit) as exit_info:
        serve_check.main(["--drafter", str(drafter), "--confidence-threshold", "0.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and err[-1].startswith("error: --confidence-threshold: is for DSpark and DFlash2 drafters")
