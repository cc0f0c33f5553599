"""dflash.locks: one job per output directory (docs/design.md invariant 21).

Another process's lock is simulated with a second open file description of the lock file
(flock conflicts between descriptions even within one process); a real process is used
where its death matters."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import dflash.locks
from dflash.errors import ConfigError
from dflash.locks import LOCK_FILE, DirectoryLock, describe, read_holder
from helpers import REPO

OTHER = {"pid": 4242, "host": "node17", "since": "2026-01-01T10:00:00+00:00", "command": "python -m dflash.train"}


def lock(directory: Path | str) -> DirectoryLock:
    return DirectoryLock(str(directory), "run_name", "pick another run_name=NAME")


def hold_as_another_job(directory: Path, record: dict | None = OTHER) -> int:
    """Lock `directory` on a descriptor of our own, as another job would; returns it (close to let go)."""
    directory.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if record is not None:
        os.pwrite(descriptor, json.dumps(record).encode(), 0)
    return descriptor


def is_locked(directory: Path) -> bool:
    descriptor = os.open(directory / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False


def test_a_second_job_fails_naming_the_first_and_leaves_its_record_alone(tmp_path):
    descriptor = hold_as_another_job(tmp_path)
    try:
        with pytest.raises(ConfigError) as caught:
            lock(tmp_path).acquire()
        assert caught.value.key == "run_name"
        message = str(caught.value)
        assert message == (
            f"run_name: {tmp_path} is in use by process 4242 on host node17 (since 2026-01-01T10:00:00+00:00); "
            "pick another run_name=NAME"
        )
        assert read_holder(str(tmp_path / LOCK_FILE)) == OTHER  # the loser wrote nothing
    finally:
        os.close(descriptor)
    assert dflash.locks._held_here == {}  # nothing half-held after the failure
    with lock(tmp_path):  # the first job is gone: the next one runs
        assert read_holder(str(tmp_path / LOCK_FILE))["pid"] == os.getpid()


def test_a_holder_without_a_readable_record_is_another_process(tmp_path):
    descriptor = hold_as_another_job(tmp_path, record=None)
    os.pwrite(descriptor, b"{not json", 0)
    try:
        with pytest.raises(ConfigError, match="is in use by another process; pick another"):
            lock(tmp_path).acquire()
    finally:
        os.close(descriptor)
    assert read_holder(str(tmp_path / "missing")) == {} and describe({}) == "another process"


def test_a_killed_holder_is_taken_over_with_a_warning_naming_it(tmp_path, caplog):
    script = (
        "import sys, time\n"
        "from dflash.locks import DirectoryLock\n"
        "DirectoryLock(sys.argv[1], 'k', 'r').acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert is_locked(tmp_path)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert read_holder(str(tmp_path / LOCK_FILE))["pid"] == holder.pid  # the file outlives its process, the lock does not
    with caplog.at_level(logging.WARNING, logger="dflash.locks"):
        with lock(tmp_path):
            assert is_locked(tmp_path)
            assert read_holder(str(tmp_path / LOCK_FILE))["pid"] == os.getpid()
    assert f"taking over the lock of process {holder.pid} on host {socket.gethostname()}" in caplog.text
    assert not (tmp_path / LOCK_FILE).exists()


def test_the_holder_record_names_this_process(tmp_path):
    with lock(tmp_path):
        record = read_holder(str(tmp_path / LOCK_FILE))
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    assert record["since"].endswith("+00:00") and os.path.basename(sys.executable) in record["command"]


def test_nested_holders_release_on_the_outermost_exit(tmp_path):
    outer = lock(tmp_path)
    with outer:
        with lock(f"{tmp_path}/sub/.."):  # the same directory, spelled differently
            pass
        assert is_locked(tmp_path) and (tmp_path / LOCK_FILE).exists()
        outer.release()  # an explicit release, then the with statement's: the second does nothing
    assert not (tmp_path / LOCK_FILE).exists() and dflash.locks._held_here == {}


def test_an_error_inside_the_block_releases_the_lock(tmp_path):
    with pytest.raises(RuntimeError):
        with lock(tmp_path):
            raise RuntimeError("a bug in the job")
    assert not (tmp_path / LOCK_FILE).exists()
    with lock(tmp_path):
        pass


def test_a_lock_file_removed_by_the_previous_holder_meanwhile_is_locked_anew(tmp_path, monkeypatch):
    """The releasing holder removes the file between our open() and flock(): the lock we
    took is on a file no longer at the path, so acquire must lock the new one."""
    real_flock = fcntl.flock
    calls = []

    def flock_after_removal(descriptor, operation):
        calls.append(descriptor)
        if len(calls) == 1:
            os.remove(tmp_path / LOCK_FILE)
        return real_flock(descriptor, operation)

    monkeypatch.setattr(dflash.locks.fcntl, "flock", flock_after_removal)
    with lock(tmp_path):
        monkeypatch.setattr(dflash.locks.fcntl, "flock", real_flock)
        assert len(calls) == 2
        assert is_locked(tmp_path) and read_holder(str(tmp_path / LOCK_FILE))["pid"] == os.getpid()


def test_a_filesystem_without_flock_runs_unguarded_with_a_warning(tmp_path, monkeypatch, caplog):
    def unsupported(descriptor, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(dflash.locks.fcntl, "flock", unsupported)
    with caplog.at_level(logging.WARNING, logger="dflash.locks"):
        with lock(tmp_path):
            pass
    assert f"cannot lock {tmp_path} (No locks available): a second job writing there would not be stopped" in caplog.text
    assert not (tmp_path / LOCK_FILE).exists()


def test_other_flock_errors_keep_their_traceback(tmp_path, monkeypatch):
    def broken(descriptor, operation):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(dflash.locks.fcntl, "flock", broken)
    with pytest.raises(OSError) as caught:
        lock(tmp_path).acquire()
    assert not isinstance(caught.value, ConfigError) and caught.value.errno == errno.EIO
    assert dflash.locks._held_here == {}


def test_without_fcntl_every_module_imports_and_locks_take_windows_byte_locks(tmp_path):
    """Windows has no fcntl: the whole package still imports (the kernels may be missing
    there, never the import), and a directory lock goes through msvcrt (a stand-in here that
    locks by inode; a second holder is refused)."""
    script = """
import importlib, os, pkgutil, sys, types
sys.modules["fcntl"] = None  # `import fcntl` raises ImportError, as on Windows
import dflash
for info in pkgutil.walk_packages(dflash.__path__, "dflash."):
    importlib.import_module(info.name)
held = set()
def locking(descriptor, mode, count):
    if os.fstat(descriptor).st_ino in held:
        raise OSError("locked")
    held.add(os.fstat(descriptor).st_ino)
sys.modules["msvcrt"] = types.SimpleNamespace(LK_NBLCK=2, locking=locking)  # after the imports: subprocess reads it
from dflash.locks import DirectoryLock, lock_file
with DirectoryLock(sys.argv[1], "run_name", "pick another") as lock:
    try:
        lock_file(os.open(lock.path, os.O_RDWR), wait=False)  # another holder
    except BlockingIOError:
        print("refused")
print("held", len(held))
"""
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["refused", "held", "1"]
