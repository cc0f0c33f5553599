"""Hub datasets that `datasets` cannot load, as one line; file addresses at a pinned revision.

`datasets` answers a dataset it cannot load with many exception types (from itself,
`huggingface_hub` or fsspec); the loaders catch `load_errors()` and report `reason(err)`
as a ConfigError naming the config key.
"""

from __future__ import annotations

from urllib.parse import quote

SCRIPT_MARK = "Dataset scripts are no longer supported"
# The hub's automatic Parquet conversion of a dataset, which `datasets` >= 4 reads without a script.
PARQUET_REVISION = "refs/convert/parquet"


def load_errors() -> tuple[type[BaseException], ...]:
    """The exception types `datasets.load_dataset` (and iterating its result) raises for a dataset it cannot load."""
    from datasets.exceptions import DatasetsError

    return (OSError, ValueError, RuntimeError, ImportError, DatasetsError)


def reason(err: BaseException) -> str:
    """One line saying why a dataset did not load (the wrapped cause's first line where `datasets` wraps one)."""
    cause = err.__cause__ or err  # datasets wraps the real cause (a JSON syntax error, say) in a generic message
    text = str(cause).strip()
    line = text.splitlines()[0] if text else type(cause).__name__
    if SCRIPT_MARK in text or SCRIPT_MARK in str(err):
        return (
            f"it is a script-based dataset, which the installed `datasets` no longer runs ({line}); "
            f"set its revision to {PARQUET_REVISION!r} (the hub's Parquet copy) or read a local copy"
        )
    return line


def file_url(repo: str, name: str, revision: str | None) -> str:
    """The `hf://` address of file `name` of dataset repo `repo`, at `revision` (None: the main branch)."""
    at = f"@{quote(revision, safe='')}" if revision else ""
    return f"hf://datasets/{repo}{at}/{name}"
