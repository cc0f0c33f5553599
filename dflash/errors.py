"""User-facing errors: `ConfigError` for anything a user can fix by changing a config key or an input.

Entry points print it as one line naming the key (`error: <key>: <message>`) and exit with status 2,
without a traceback (`dflash.cli.common`). Library code raises it as early as the bad value is known.

Invariants:
- A ConfigError means "the user can fix this by changing `key`"; its message says how. Anything
  else (a bug) keeps its traceback: nothing here catches broad exception types except around the
  one call that reads a user's file (`reading`).
- Range checks in config dataclasses name the field only; whoever holds the object under its
  group's name adds the group (`dflash.structured.config_key`, docs/design.md invariant 23).
- Checks that need no model (types, ranges, paths to read, directories to write) run before Hydra
  starts and before any model loads (`dflash.cli.common.run_app`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile


class ConfigError(ValueError):
    """A bad config value or input. `key` names the config key to change, `reason` says why."""

    def __init__(self, key: str, message: str):
        self.key, self.reason = key, message
        super().__init__(f"{key}: {message}")


def require(condition: bool, key: str, message: str) -> None:
    """Raise `ConfigError(key, message)` unless `condition` holds."""
    if not condition:
        raise ConfigError(key, message)


@contextlib.contextmanager
def reading(key: str, path: str, fix: str, errors: tuple[type[BaseException], ...] = (OSError, ValueError)):
    """Turn `errors` raised while the block reads the user's file `path` into one ConfigError.

    For the exceptions a damaged or foreign file raises in its parser (OSError,
    json/unicode errors (ValueError), safetensors' SafetensorError, torch.load's
    UnpicklingError/RuntimeError, ...); keep the block to the reading call itself, so a
    bug elsewhere still shows its traceback.
    fix: how to repair it, e.g. "point drafter.path at a directory save_drafter wrote".
    """
    try:
        yield
    except errors as err:
        reason = type(err).__name__
        if str(err).strip():
            reason += ": " + first_line(err).split(". ")[0]  # torch's first line goes on about weights_only
        raise ConfigError(key, f"cannot read {path!r} ({reason}); {fix}") from None


def check_writable_dir(key: str, path: str) -> None:
    """ConfigError naming `key` unless `path` is, or can be created as, a writable directory.

    Creates nothing: the nearest existing ancestor must be a directory in which a
    temporary file can be made (a real write, so it also holds for root and read-only
    mounts, where permission bits say nothing).
    """
    path = os.path.abspath(os.path.expanduser(path))
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    require(
        os.path.isdir(existing),
        key,
        f"{path!r} cannot be a directory: {existing!r} is a file; set {key} to a directory path",
    )
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ConfigError(key, f"cannot write in {existing!r} ({err.strerror}); set {key} to a writable directory") from None


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
