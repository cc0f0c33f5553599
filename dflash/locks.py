"""One job at a time per output directory (training run, evaluation run, regeneration output).

Invariants (docs/design.md invariant 21):
- A job that writes a directory holds `DirectoryLock(directory)` for as long as it writes:
  an exclusive `fcntl.flock` on `directory/.dflash.lock`. A second job on the same
  directory fails at once with a `ConfigError` naming the holder (process id, host, start time).
- The kernel (or the NFS lock manager) drops a flock when its process ends, however it
  ends: the next job takes a killed job's lock over with a warning naming the dead holder.
- The lock file holds the holder's record as JSON and is removed on release; a new
  holder checks that the file it locked is still the one at the path (a releasing holder
  may have removed it in between).
- A process may take the lock of a directory it already holds (an entry point locks
  before loading models, the library function it calls locks again); it is released when
  the outermost holder lets go.
- On a filesystem without flock support the job runs unguarded, with a warning.
- Every flock of the package goes through `lock_file`: POSIX's flock, Windows' byte lock
  (msvcrt) where there is no fcntl, so the package imports and locks on every OS.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
from datetime import datetime, timezone

from dflash.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

log = logging.getLogger(__name__)

LOCK_FILE = ".dflash.lock"
_UNSUPPORTED = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
_held_here: dict[str, int] = {}  # directory -> how many DirectoryLocks of this process hold it


class DirectoryLock:
    """Context manager: hold the lock of `directory` (created if needed) while writing it.

    key, remedy: the config key that chose the directory and how to pick another, for the
    one-line error a second job gets, e.g. key="run_name", remedy="pick another run_name=NAME".
    """

    def __init__(self, directory: str, key: str, remedy: str):
        self.directory, self.key, self.remedy = os.path.abspath(directory), key, remedy
        self.path = os.path.join(self.directory, LOCK_FILE)
        self._descriptor: int | None = None
        self._holding = False

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise ConfigError(key) naming the job that holds it."""
        if _held_here.get(self.directory):
            _held_here[self.directory] += 1
            self._holding = True
            return
        os.makedirs(self.directory, exist_ok=True)
        while True:
            try:
                descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except PermissionError as err:  # a lock file left by another user's killed job
                raise ConfigError(
                    self.key,
                    f"cannot open the lock file {self.path} ({err.strerror}), left by {describe(read_holder(self.path))}; "
                    f"if that job has ended, delete the file, or {self.remedy}",
                ) from None
            try:
                lock_file(descriptor, wait=False)
            except BlockingIOError:
                os.close(descriptor)
                raise ConfigError(
                    self.key, f"{self.directory} is in use by {describe(read_holder(self.path))}; {self.remedy}"
                ) from None
            except OSError as err:
                if err.errno not in _UNSUPPORTED:
                    os.close(descriptor)
                    raise
                log.warning("cannot lock %s (%s): a second job writing there would not be stopped", self.directory, err.strerror)
            if _same_file(descriptor, self.path):
                break
            os.close(descriptor)  # the previous holder removed the file after we opened it: lock the new one
        previous = read_holder(self.path)
        if previous:
            log.warning("%s: taking over the lock of %s, which ended without releasing it", self.directory, describe(previous))
        record = json.dumps(_this_process()).encode()
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, record, 0)
        self._descriptor, self._holding = descriptor, True
        _held_here[self.directory] = 1

    def release(self) -> None:
        """Let go; the outermost holder removes the lock file and drops the lock."""
        if not self._holding:
            return
        self._holding = False
        _held_here[self.directory] -= 1
        if self._descriptor is None:
            return
        del _held_here[self.directory]
        if _same_file(self._descriptor, self.path):
            os.remove(self.path)
        os.close(self._descriptor)
        self._descriptor = None


def lock_file(handle, wait: bool = True) -> None:
    """An exclusive lock on an open file (a descriptor or a file object), released when it
    is closed or its process ends; waits for it, or raises BlockingIOError (`wait=False`)."""
    if fcntl is not None:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        return
    import msvcrt  # Windows only
    import time

    descriptor = handle if isinstance(handle, int) else handle.fileno()
    while True:
        os.lseek(descriptor, 0, os.SEEK_SET)
        try:
            msvcrt.locking(descriptor, msvcrt.LK_NBLCK, 1)
            return
        except OSError:
            if not wait:
                raise BlockingIOError(errno.EAGAIN, "locked by another process") from None
            time.sleep(0.5)


def read_holder(path: str) -> dict:
    """The holder record in lock file `path` ({} when there is none or it is unreadable)."""
    try:
        with open(path) as handle:
            return json.loads(handle.read() or "{}")
    except (OSError, ValueError):
        return {}


def describe(holder: dict) -> str:
    """E.g. "process 4242 on host node17 (since 2026-01-01T10:00:00+00:00)"; the record's
    `command` stays in the lock file for whoever wants to know more."""
    if not holder:
        return "another process"
    return f"process {holder.get('pid')} on host {holder.get('host')} (since {holder.get('since')})"


def _this_process() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
    }


def _same_file(descriptor: int, path: str) -> bool:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (stat.st_dev, stat.st_ino) == (opened.st_dev, opened.st_ino)
