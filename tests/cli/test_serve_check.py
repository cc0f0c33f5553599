"""`python -m dflash.serve_check`: its pure parts, without llama.cpp: what it reads from
llama.cpp's output (captured from build 11434 on SmolLM2-135M-Instruct with the demo's
drafter), the token comparison, the pooled figures. Fetching and building llama.cpp are
`dflash.bench`'s (tests/cli/test_bench.py)."""

from __future__ import annotations

import pytest

from dflash import serve_check

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
