"""Targets built or converted here: one build per directory, never half a directory.

Offline targets (the tiny code LM pre-trained here, a GGUF file converted to an HF
directory) are made once and reused by every later stage. Both kinds share these rules:

Invariants:
- A build writes everything into a temporary sibling of its directory and renames it
  into place last (`save_atomically`): a killed build never leaves a directory that
  looks finished, and a stale build is replaced whole.
- Processes that want the same directory at once serialise on an flock of
  `<dir>.build.lock` (`build_lock`): one builds, the others wait and find it current.
- "Current" is decided by `build_info.json` in the directory (each kind writes what
  its build depends on there and checks it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator

from dflash.fileio import read_json, write_json
from dflash.locks import lock_file

BUILD_INFO = "build_info.json"


def read_build_info(out_dir: str) -> dict | None:
    """`out_dir/build_info.json` as a dict, or None when it is missing or not JSON, or the
    directory holds no config.json (then it is no model)."""
    info = read_json(os.path.join(out_dir, BUILD_INFO))
    if not isinstance(info, dict) or not os.path.isfile(os.path.join(out_dir, "config.json")):
        return None
    return info


def build_once(out_dir: str, is_current: Callable[[], bool], build: Callable[[], None], say: Callable[[str], None]) -> str:
    """Run `build()` (which writes `out_dir`) unless `is_current()`; under the build lock,
    checking again after waiting, so processes started side by side build it once."""
    if is_current():
        return out_dir
    with build_lock(out_dir, say):
        if is_current():
            say(f"using the build another process just finished in {out_dir}")
            return out_dir
        build()
    return out_dir


@contextlib.contextmanager
def build_lock(out_dir: str, say: Callable[[str], None]) -> Iterator[None]:
    """An exclusive flock on `<out_dir>.build.lock`, waiting (with a message) while another process holds it."""
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    with open(f"{out_dir}.build.lock", "a") as handle:
        try:
            lock_file(handle, wait=False)
        except BlockingIOError:
            say(f"another process is building {out_dir}; waiting for it")
            lock_file(handle)
        yield  # closing the file lets go


def save_atomically(out_dir: str, model, tokenizer, info: dict, config_keys: dict | None = None) -> None:
    """Write the model, its tokenizer and `info` (as build_info.json) into a temporary
    sibling, then swap it in for `out_dir`. `config_keys` are added to config.json as
    written (keys the running transformers would not write itself)."""
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.building-", dir=parent)
    try:
        os.chmod(staging, 0o755)  # mkdtemp makes it private; the build is an ordinary directory
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if config_keys:
            config_path = os.path.join(staging, "config.json")
            with open(config_path) as handle:
                config = json.load(handle)
            write_json(config_path, {**config, **config_keys}, indent=2, sort_keys=True)
        write_json(os.path.join(staging, BUILD_INFO), info, indent=2)
        stale = None
        if os.path.exists(out_dir):
            # rename() cannot replace a non-empty directory: move the stale build aside first.
            stale = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.stale-", dir=parent)
            os.replace(out_dir, os.path.join(stale, "old"))
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)


class Say:
    """Stage messages `[<name>] ...` on stderr (through tqdm, so they do not break progress bars)."""

    def __init__(self, name: str, enabled: bool = True):
        self.name, self.enabled = name, enabled

    def __call__(self, message: str) -> None:
        if self.enabled:
            from tqdm.auto import tqdm

            tqdm.write(f"[{self.name}] {message}", file=sys.stderr)
