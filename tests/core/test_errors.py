"""dflash.errors outside the config-schema checks: `require`, `reading`, `check_writable_dir`
and `first_line` (docs/design.md invariant 23: a user's mistake is one line naming the key)."""

from __future__ import annotations

import errno
import json
import os

import pytest

import dflash.errors
from dflash.errors import ConfigError, check_writable_dir, first_line, reading, require

FIX = "point drafter.path at a directory save_drafter wrote"


def test_require_raises_a_config_error_naming_the_key_only_when_the_condition_fails():
    require(True, "drafter.block_size", "unused")
    with pytest.raises(ConfigError) as caught:
        require(False, "drafter.block_size", "must be >= 2, got 1")
    assert isinstance(caught.value, ValueError)  # callers that catch ValueError still see it
    assert caught.value.key == "drafter.block_size" and str(caught.value) == "drafter.block_size: must be >= 2, got 1"


def test_reading_turns_a_parser_error_into_one_line_naming_key_path_and_fix(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{broken")
    with pytest.raises(ConfigError) as caught:
        with reading("drafter.path", str(path), FIX):
            json.loads(path.read_text())
    error = caught.value
    assert error.key == "drafter.path"
    assert str(error) == (
        f"drafter.path: cannot read {str(path)!r} (JSONDecodeError: Expecting property name enclosed in double quotes: "
        f"line 1 column 2 (char 1)); {FIX}"
    )
    assert error.__cause__ is None and error.__suppress_context__  # no parser traceback chained to it


def test_reading_keeps_the_first_line_and_first_sentence_of_a_long_reason(tmp_path):
    def load():
        raise RuntimeError("Weights only load failed. This file can still be loaded, but...\nLine two\nLine three")

    with pytest.raises(ConfigError) as caught:
        with reading("checkpoint", "last.ckpt", "delete it", errors=(RuntimeError,)):
            load()
    assert str(caught.value) == "checkpoint: cannot read 'last.ckpt' (RuntimeError: Weights only load failed); delete it"


def test_reading_names_a_missing_file_and_an_error_without_message(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=r"cannot read .*nope\.json' \(FileNotFoundError: \[Errno 2\] No such file"):
        with reading("data.path", str(missing), "fix data.path"):
            open(missing)
    with pytest.raises(ConfigError) as caught:
        with reading("data.path", "x", "fix it"):
            raise ValueError()
    assert str(caught.value) == "data.path: cannot read 'x' (ValueError); fix it"


def test_reading_lets_other_errors_through_with_their_traceback():
    with pytest.raises(KeyError):  # a bug, not a bad file
        with reading("data.path", "x", "fix it"):
            {}["missing"]
    with pytest.raises(ValueError):  # not among the errors this reader expects
        with reading("checkpoint", "x", "fix it", errors=(RuntimeError,)):
            raise ValueError("bad")
    with reading("data.path", "x", "fix it"):
        value = 1  # nothing raised: nothing changes
    assert value == 1


def test_a_writable_directory_to_be_created_passes_and_creates_nothing(tmp_path, monkeypatch):
    check_writable_dir("out", str(tmp_path / "new" / "nested"))
    monkeypatch.setenv("HOME", str(tmp_path))
    check_writable_dir("out", "~/runs/one")
    monkeypatch.chdir(tmp_path)
    check_writable_dir("out", "relative/dir")
    assert os.listdir(tmp_path) == []


def test_a_path_through_a_file_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "below" / "deeper"):
        with pytest.raises(ConfigError) as caught:
            check_writable_dir("paths.output_dir", str(path))
        assert caught.value.key == "paths.output_dir"
        assert f"{str(tmp_path / 'file')!r} is a file; set paths.output_dir to a directory path" in str(caught.value)


def test_a_directory_that_refuses_writes_is_a_config_error(tmp_path, monkeypatch):
    """Tests run as root, where permission bits do not refuse; the refusal a read-only
    mount gives is injected where the check writes."""

    def refuse(dir):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(dflash.errors.tempfile, "TemporaryFile", refuse)
    with pytest.raises(ConfigError) as caught:
        check_writable_dir("out", str(tmp_path / "new"))
    assert str(caught.value) == f"out: cannot write in {str(tmp_path)!r} (Read-only file system); set out to a writable directory"
    assert caught.value.__cause__ is None


@pytest.mark.parametrize(
    "error, line",
    [
        (ValueError("first\nsecond"), "first"),
        (OSError("\n  padded first\nsecond"), "padded first"),
        (RuntimeError(""), "RuntimeError"),
        (KeyError(), "KeyError"),
        (ValueError("   \n "), "ValueError"),
    ],
)
def test_first_line(error, line):
    assert first_line(error) == line
