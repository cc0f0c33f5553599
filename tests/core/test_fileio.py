"""dflash.fileio: a file under its final name is complete (docs/design.md invariant 20)."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import dflash.fileio
from dflash.fileio import TEMPORARY_SUFFIX, atomic_write, remove_partial_writes, write_json, write_text
from helpers import REPO

# Writes half of the new content, says so, then waits to be killed.
DYING_WRITER = """
import sys, time
from dflash.fileio import atomic_write

def write(temporary):
    with open(temporary, "w") as handle:
        handle.write('{"half": ')
        handle.flush()
        print(temporary, flush=True)
        time.sleep(600)

atomic_write(sys.argv[1], write)
"""


def kill_a_writer_midway(path: Path) -> str:
    """Run `atomic_write(path)` in a process and SIGKILL it while it writes; returns its temporary path."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writer = subprocess.Popen([sys.executable, "-c", DYING_WRITER, str(path)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        temporary = writer.stdout.readline().strip()
        assert temporary, "the writer did not start"
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    return temporary


@pytest.mark.parametrize("existing", [True, False])
def test_a_writer_killed_midway_leaves_the_old_file_or_none(tmp_path, existing):
    path = tmp_path / "results.json"
    if existing:
        write_json(str(path), {"tau": 1.0})
    temporary = kill_a_writer_midway(path)
    if existing:
        assert json.loads(path.read_text()) == {"tau": 1.0}
    else:
        assert not path.exists()
    # What it leaves is hidden, beside the destination, and named as a temporary.
    leftover = Path(temporary)
    assert leftover.parent == tmp_path and leftover.name.startswith(".results.json.") and leftover.name.endswith(TEMPORARY_SUFFIX)
    assert leftover.read_text() == '{"half": '
    (tmp_path / "notes.tmp").write_text("a user's own file")  # not hidden: not ours to delete
    assert remove_partial_writes(str(tmp_path)) == [temporary]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["notes.tmp", *(["results.json"] if existing else [])])


def test_a_failing_writer_leaves_no_file_and_no_temporary(tmp_path):
    def fails(temporary):
        Path(temporary).write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(str(tmp_path / "new.txt"), fails)
    assert list(tmp_path.iterdir()) == []


def test_the_content_is_synced_before_it_takes_the_final_name(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor):
        events.append("fsync")
        real_fsync(descriptor)

    def replace(source, destination):
        events.append("replace")
        real_replace(source, destination)

    monkeypatch.setattr(dflash.fileio.os, "fsync", fsync)
    monkeypatch.setattr(dflash.fileio.os, "replace", replace)
    write_text(str(tmp_path / "out.txt"), "done")
    assert events == ["fsync", "replace"]


def test_parents_are_created_and_the_path_is_returned(tmp_path):
    path = tmp_path / "a" / "b" / "out.json"
    assert write_json(str(path), {"é": [1, 2]}, indent=2, sort_keys=True) == str(path)
    text = path.read_text(encoding="utf-8")
    assert text.endswith("}\n") and json.loads(text) == {"é": [1, 2]} and '\n  "' in text


def test_every_writer_gets_its_own_temporary(tmp_path):
    seen = []

    def record(temporary):
        seen.append(temporary)
        Path(temporary).write_text(str(len(seen)))

    for _ in range(3):
        atomic_write(str(tmp_path / "out.txt"), record)
    assert len(set(seen)) == 3 and all(os.path.dirname(t) == str(tmp_path) for t in seen)
    assert (tmp_path / "out.txt").read_text() == "3" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_files_get_the_umask_mode_even_if_the_writer_narrows_it(tmp_path, umask, mode):
    def private(temporary):  # as safetensors does
        Path(temporary).write_text("weights")
        os.chmod(temporary, 0o600)

    saved = os.umask(umask)
    try:
        atomic_write(str(tmp_path / "model.safetensors"), private)
    finally:
        os.umask(saved)
    assert stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode) == mode


def test_partial_writes_are_found_in_a_directory_whose_name_is_a_glob_pattern(tmp_path):
    directory = tmp_path / "run[1]*"
    directory.mkdir()
    leftover = directory / f".rows.jsonl.host-1-abcdef01{TEMPORARY_SUFFIX}"
    leftover.write_text("{")
    (directory / "rows.jsonl").write_text("{}\n")
    assert remove_partial_writes(str(directory)) == [str(leftover)]
    assert [p.name for p in directory.iterdir()] == ["rows.jsonl"]
