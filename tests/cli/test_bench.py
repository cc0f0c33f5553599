"""`python -m dflash.bench`: its smoke mode runs where CI runs, and its report reads as a table
with every measured width, both forwards and the floor."""

import subprocess
import sys

import pytest

from helpers.apps import run_python


def test_quick_bench_reports_every_width_against_the_floor(tmp_path, monkeypatch):
    out = tmp_path / "report.md"
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path / "artifacts"))  # the tiny target is built there
    argv = ["-m", "dflash.bench", "--target", "tiny_qwen3", "--quick", "--threads", "1", "--draft-vocab", "64", "--out", str(out)]
    run_python(argv, tmp_path)
    text = out.read_text()
    assert "floor" in text and "decoding forward: fast: float32; layers " in text
    assert "drafter: random, 1 layer(s) (drafts over 64 tokens)" in text
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ") and not line.startswith("| B ")]
    assert [int(row[0]) for row in rows] == [1, 4]
    one, four = ([float(cell) for cell in row[1:]] for row in rows)
    # cells: verify, / floor, / t(1), HF forward, propose, / its floor, step, break-even
    assert one[2] == 1.0 and one[4] == 0.0 and one[5] == 0.0  # t(1) / t(1); no drafter at B = 1
    assert four[4] > 0 and four[7] == pytest.approx((four[0] + four[4]) / one[0], abs=0.02)  # break-even = step / t(1)
    drafter_floor = float(text.split(" MB read per propose, floor ")[1].split(" ms")[0])
    assert four[5] == pytest.approx(four[4] / drafter_floor, rel=0.05, abs=0.02)
    generation = next(line for line in text.splitlines() if line.startswith("Batched greedy generation, 4 prompts ("))
    assert " x 8 new tokens: fast " in generation and ", its steps after the prefill " in generation and ", hf " in generation
    assert "new tok/s for the fast run" in generation


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--widths", "0"], "--widths"),
        (["--target", "nope"], "--target"),
        (["--device", "gpu"], "--device"),
        (["--draft-vocab", "0"], "--draft-vocab"),
        (["--draft-vocab", "64", "--drafter", "some/dir"], "--draft-vocab"),
    ],
)
def test_bad_bench_arguments_are_one_line(tmp_path, argv, message):
    result = subprocess.run(
        [sys.executable, "-m", "dflash.bench", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr
