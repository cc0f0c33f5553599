"""Atomic file writes: a file that exists under its final name is complete.

Invariants (docs/design.md invariant 20; every writer of an output file uses `atomic_write`):
- The content is written to a temporary file in the destination's own directory, flushed
  to disk (fsync), then renamed over the destination. A job killed at any moment, or a
  full disk, leaves the previous version (or nothing) under the final name, never half a file.
- The temporary name is unique per writer (host, process id, random part) and created
  with O_EXCL, so two writers never share one; it is hidden (leading dot) and ends in
  `.tmp`, so readers of a directory of shards skip it.
- Files get the permissions a plain `open()` gives (0o666 minus the user's umask), not
  the 0600 of `tempfile.mkstemp`: colleagues on a shared cluster can read the results.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import socket
import uuid
from collections.abc import Callable

TEMPORARY_SUFFIX = ".tmp"


def atomic_write(path: str, write: Callable[[str], None]) -> str:
    """Call `write(temporary_path)`, then rename the temporary file to `path`; returns `path`.

    `write` fills the file at the path it is given (it may reopen or truncate it). The
    directory of `path` is created if needed. On any error the temporary file is removed
    and `path` is left as it was.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    name = f".{os.path.basename(path)}.{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}{TEMPORARY_SUFFIX}"
    temporary = os.path.join(directory, name)
    # Created with 0o666, the kernel applies the umask, as for open(): that is the mode the
    # file must end with, even if `write` replaces it (safetensors writes files as 0600).
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    mode = os.stat(temporary).st_mode
    try:
        write(temporary)
        os.chmod(temporary, mode)
        descriptor = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return path


def write_text(path: str, text: str) -> str:
    """Write `text` (UTF-8) to `path` atomically; returns `path`."""

    def write(temporary: str) -> None:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)

    return atomic_write(path, write)


def write_json(path: str, data, **dump_options) -> str:
    """Write `data` as JSON (plus a final newline) to `path` atomically; returns `path`.

    dump_options: passed to `json.dumps` (indent, sort_keys, ...).
    """
    return write_text(path, json.dumps(data, **dump_options) + "\n")


def write_jsonl(path: str, rows, **dump_options) -> str:
    """Write `rows` as JSON lines to `path` atomically; returns `path`."""
    return write_text(path, "".join(json.dumps(row, **dump_options) + "\n" for row in rows))


def json_digest(data, length: int | None = None, **dump_options) -> str:
    """The sha256 of `data` as JSON with sorted keys, in hex (its first `length` digits): a
    stable name for settings. dump_options: passed to `json.dumps` (default, ensure_ascii)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, **dump_options).encode()).hexdigest()[:length]


def read_json(path: str):
    """The JSON value in `path`; None when the file is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def remove_partial_writes(directory: str) -> list[str]:
    """Delete the temporary files that killed writers left in `directory`; returns their paths.

    Only safe while no other job writes there: call it under the directory's lock
    (`dflash.locks.DirectoryLock`).
    """
    leftovers = glob.glob(os.path.join(glob.escape(directory), f".*{TEMPORARY_SUFFIX}"))
    for path in leftovers:
        os.remove(path)
    return leftovers
