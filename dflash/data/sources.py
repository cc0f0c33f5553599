"""Conversation sources: Hugging Face datasets and local JSONL/JSON/Parquet files.

Every source is normalised to rows `{"messages": [{"role": ..., "content": ...}, ...]}`
with roles "system", "user" and "assistant". Three layouts are understood:

- messages: a column of `[{"role", "content"}, ...]` (UltraChat, Nemotron, our own shards);
- sharegpt: a column of `[{"from", "value"}, ...]` with from = human/gpt/system;
- prompt_response: one prompt column, an optional extra input column (Alpaca's
  `input`), and an optional response column.

Rows that cannot form a conversation (no user turn, non-text content, unknown roles)
are skipped and counted, never silently changed into something else. A messages row
that carries the target's token ids (`"token_ids"`, written by regeneration; see
`dflash.data.token_ids`) keeps them.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dflash.data.builtin_prompts import builtin_rows, is_builtin
from dflash.data.hub import load_errors, reason
from dflash.data.token_ids import TOKEN_IDS
from dflash.errors import ConfigError, require
from dflash.layout import MANIFEST

log = logging.getLogger(__name__)

FORMATS = ("auto", "messages", "sharegpt", "prompt_response")
LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}

# ShareGPT and assorted chat dumps name the roles in several ways.
ROLE_ALIASES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
}


@dataclass
class SourceSpec:
    """Where conversations come from and how to read them."""

    path: str
    """A hub dataset id ("HuggingFaceH4/ultrachat_200k"), or a local .jsonl/.json/.parquet
    file, or a local directory of such files (e.g. regenerated shards), or
    `builtin:<family>`, prompts that need no network (`dflash.data.builtin_prompts`)."""
    format: str = "auto"
    """"auto" (pick by columns), "messages", "sharegpt" or "prompt_response"."""
    split: str = "train"
    """Passed to `datasets.load_dataset` for hub datasets."""
    subset: str | None = None
    """Passed to `datasets.load_dataset` for hub datasets."""
    data_files: Any = None
    """str | list[str] | None (OmegaConf has no unions with containers): the files of `split`
    (a name, a glob such as "data/code-*.parquet", or a list); only these are downloaded."""
    messages_column: str = "messages"
    conversations_column: str = "conversations"
    prompt_column: str = "prompt"
    input_column: str | None = None
    """Optional extra prompt text appended after the prompt (Alpaca's `input`)."""
    response_column: str | None = "response"
    """None for prompt-only datasets (fine for regeneration)."""
    limit: int | None = None
    """Keep `limit` rows. A hub dataset is then streamed and sampled: shards in a seeded order,
    rows through a seeded `shuffle_buffer`-row buffer, the first `limit` kept. A local file
    keeps its first `limit` rows in file order; `builtin:` prompts are a seeded sample already."""
    revision: str | None = None
    """Hub datasets only: the commit (or tag, branch) to read; None reads the current main branch."""
    seed: int = 0
    """The seed of `limit`'s draw (and of the `builtin:` prompts' order)."""
    shuffle_buffer: int = 10_000
    """Rows held by the streamed shuffle; a draw is uniform over the split only when the
    buffer holds all of it."""

    def __post_init__(self):
        files = self.data_files
        if isinstance(files, (list, tuple)) and all(isinstance(f, str) for f in files):
            self.data_files = list(files)
        else:
            require(
                files is None or isinstance(files, str),
                "data_files",
                f"expected a file name, a list of them or null, got {files!r}",
            )


def load_conversations(spec: SourceSpec, key: str = "data", require_response: bool = False) -> list[dict]:
    """Load and normalise one source.

    Args:
        key: config prefix of `spec`, used to name keys in errors ("data", "data.sources[1]").
        require_response: every kept row must end with an assistant turn (training);
            rows without one are skipped, and a source with none at all is an error.
    Returns:
        rows `{"messages": [...]}` (plus `"token_ids"` where the source has them) in source order.
    """
    return list(iter_conversations(spec, key, require_response))


def iter_conversations(spec: SourceSpec, key: str = "data", require_response: bool = False) -> Iterator[dict]:
    """`load_conversations` one row at a time, local sources read from their memory-mapped
    Arrow cache, never held in memory whole. Errors surface on the first row."""
    require(spec.format in FORMATS, f"{key}.format", f"unknown format {spec.format!r}; choose one of {list(FORMATS)}")
    require(spec.limit is None or spec.limit > 0, f"{key}.limit", f"must be positive or null, got {spec.limit}")
    require(spec.shuffle_buffer > 0, f"{key}.shuffle_buffer", f"must be positive, got {spec.shuffle_buffer}")
    columns, dataset = _open_dataset(spec, key)
    layout = _resolve_layout(spec, columns, key, require_response)

    kept, skipped = 0, 0
    for raw in dataset:
        messages = _normalise(raw, spec, layout)
        if messages is None or (require_response and messages[-1]["role"] != "assistant"):
            skipped += 1
            continue
        row = {"messages": messages}
        if layout == "messages" and raw.get(TOKEN_IDS):
            row[TOKEN_IDS] = raw[TOKEN_IDS]
        kept += 1
        yield row
    if skipped:
        log.info("%s: skipped %d of %d rows that do not form a usable conversation", spec.path, skipped, skipped + kept)
    if require_response and not kept and skipped:
        raise ConfigError(
            f"{key}.path",
            f"no row of {spec.path!r} ends with an assistant response; regenerate responses first "
            "(python -m dflash.regenerate) or point at data that has them",
        )


def split_prompt(messages: list[dict]) -> tuple[list[dict], str | None]:
    """Split a conversation into the prompt and the final assistant response.

    The prompt is every turn before the last assistant turn (or the whole conversation
    when it does not end with an assistant turn); returns (prompt_messages, response or None).
    """
    if messages and messages[-1]["role"] == "assistant":
        return messages[:-1], messages[-1]["content"]
    return list(messages), None


def describe_source(spec: SourceSpec, rows: int | None = None) -> str:
    """One line for the data summary: where `spec` reads from (revision included) and how
    its rows are drawn; `rows`: how many it gave, when known."""
    path = os.path.expanduser(spec.path)
    count = f"{rows} rows" if rows is not None else "rows"
    if is_builtin(spec.path):
        drawn = f"a seeded sample (seed {spec.seed})" + (f" of {spec.limit}" if spec.limit else "")
        return f"{spec.path}: {count}, {drawn}"
    if _looks_local(path):
        drawn = f"the first {spec.limit} in file order" if spec.limit else "all of them"
        return f"{spec.path}: {count}, {drawn}"
    where = f"{spec.path}@{spec.revision or 'main (no revision pinned)'}"
    where += f" ({', '.join(p for p in (spec.subset, f'split {spec.split}') if p)}"
    where += f", files {spec.data_files})" if spec.data_files else ")"
    if not spec.limit:
        return f"{where}: {count}, the whole split"
    return (
        f"{where}: {count}, a seeded sample streamed from the hub (seed {spec.seed}): shards in a shuffled order, "
        f"rows through a {spec.shuffle_buffer}-row shuffle buffer, the first {spec.limit} kept"
    )


def _open_dataset(spec: SourceSpec, key: str) -> tuple[list[str], object]:
    """(column names, iterable of raw rows) of the source."""
    import datasets
    from datasets.exceptions import DatasetGenerationError

    if is_builtin(spec.path):
        require(spec.revision is None, f"{key}.revision", f"{spec.path} is built in and has no revision; set it to null")
        return ["messages"], builtin_rows(spec.path, spec.limit, key, seed=spec.seed)
    path = os.path.expanduser(spec.path)
    if _looks_local(path):
        require(spec.revision is None, f"{key}.revision", f"only hub datasets have revisions; {spec.path!r} is local")
        files = _local_files(path, key)
        builder = LOCAL_SUFFIXES[os.path.splitext(files[0])[1]]
        try:
            dataset = datasets.load_dataset(builder, data_files=files, split="train")
        except (DatasetGenerationError, OSError, ValueError) as err:
            raise ConfigError(f"{key}.path", f"cannot read {spec.path!r}: {reason(err)}") from None
        if spec.limit:
            dataset = dataset.select(range(min(spec.limit, len(dataset))))
        return list(dataset.column_names), dataset
    # Only the split's own files: without data_files, `datasets` prepares every split of the repo.
    files = {spec.split: spec.data_files} if spec.data_files else None
    options = dict(split=spec.split, data_files=files, revision=spec.revision)
    try:
        if spec.limit is None:
            dataset = datasets.load_dataset(path, spec.subset, **options)
            return list(dataset.column_names), dataset
        # Streaming reads about `limit` rows instead of the whole split; the seeded shuffle keeps
        # the subset from being the first rows in file order (biased where a split is ordered).
        stream = datasets.load_dataset(path, spec.subset, streaming=True, **options)
        stream = stream.shuffle(seed=spec.seed, buffer_size=spec.shuffle_buffer)
        rows = list(stream.take(spec.limit))
    except load_errors() as err:
        raise ConfigError(f"{key}.path", f"cannot load dataset {spec.path!r}: {reason(err)}") from None
    return (list(rows[0]) if rows else []), rows


def _looks_local(path: str) -> bool:
    # A hub id is "org/name"; paths, files with known suffixes and anything on disk are local.
    return (
        os.path.exists(path)
        or path.startswith((".", "/", "~"))
        or os.path.splitext(path)[1] in LOCAL_SUFFIXES
        or path.count("/") != 1
    )


def check_local_source(spec: SourceSpec, key: str = "data") -> None:
    """ConfigError now, before any model loads, when a local source names no data files
    (hub datasets are checked when they load)."""
    path = os.path.expanduser(spec.path)
    if _looks_local(path) and not is_builtin(path):
        _local_files(path, key)


def _local_files(path: str, key: str) -> list[str]:
    require(os.path.exists(path), f"{key}.path", f"{path!r} does not exist")
    if os.path.isfile(path):
        require(
            os.path.splitext(path)[1] in LOCAL_SUFFIXES,
            f"{key}.path",
            f"{path!r} is not a .jsonl, .json or .parquet file",
        )
        require(os.path.getsize(path) > 0, f"{key}.path", f"{path!r} is empty; point {key}.path at a file with rows")
        return [path]
    files = sorted(f for f in glob.glob(os.path.join(path, "*")) if os.path.splitext(f)[1] in LOCAL_SUFFIXES and os.path.isfile(f))
    files = [f for f in files if not os.path.basename(f).startswith(".") and os.path.basename(f) != MANIFEST]
    require(files, f"{key}.path", f"directory {path!r} holds no .jsonl, .json or .parquet files")
    files = [f for f in files if os.path.getsize(f) > 0]  # an empty file holds no rows (and stops `datasets`)
    require(files, f"{key}.path", f"every data file in {path!r} is empty; point {key}.path at data with rows")
    kinds = {LOCAL_SUFFIXES[os.path.splitext(f)[1]] for f in files}
    require(len(kinds) == 1, f"{key}.path", f"directory {path!r} mixes JSON and Parquet files; keep one kind")
    return files


def _resolve_layout(spec: SourceSpec, columns: list[str], key: str, require_response: bool) -> str:
    layout = spec.format
    if layout == "auto":
        if spec.messages_column in columns:
            layout = "messages"
        elif spec.conversations_column in columns:
            layout = "sharegpt"
        elif spec.prompt_column in columns:
            layout = "prompt_response"
        else:
            raise ConfigError(
                f"{key}.format",
                f"cannot tell the layout of {spec.path!r} from its columns {columns}; set format and the column names",
            )
    needed = {
        "messages": ("messages_column", spec.messages_column),
        "sharegpt": ("conversations_column", spec.conversations_column),
        "prompt_response": ("prompt_column", spec.prompt_column),
    }[layout]
    _require_column(needed[0], needed[1], columns, spec, key)
    if layout == "prompt_response":
        if spec.input_column is not None:
            _require_column("input_column", spec.input_column, columns, spec, key)
        if require_response:
            require(
                spec.response_column is not None,
                f"{key}.response_column",
                f"{spec.path!r} needs responses here but no response column is set; name it or regenerate first",
            )
        if spec.response_column is not None and (require_response or spec.response_column in columns):
            _require_column("response_column", spec.response_column, columns, spec, key)
    return layout


def _require_column(field: str, column: str, columns: list[str], spec: SourceSpec, key: str) -> None:
    require(column in columns, f"{key}.{field}", f"column {column!r} is not in {spec.path!r}; its columns are {columns}")


def _normalise(raw: dict, spec: SourceSpec, layout: str) -> list[dict] | None:
    if layout == "messages":
        turns = [(m.get("role"), m.get("content")) for m in raw[spec.messages_column] or []]
    elif layout == "sharegpt":
        turns = [(m.get("from"), m.get("value")) for m in raw[spec.conversations_column] or []]
    else:
        prompt = raw[spec.prompt_column]
        extra = raw.get(spec.input_column) if spec.input_column else None
        if isinstance(prompt, str) and isinstance(extra, str) and extra.strip():
            prompt = f"{prompt}\n\n{extra}"
        turns = [("user", prompt)]
        response = raw.get(spec.response_column) if spec.response_column else None
        if response is not None:
            turns.append(("assistant", response))
    return _clean_turns(turns)


def _clean_turns(turns: list[tuple]) -> list[dict] | None:
    messages = []
    for role, content in turns:
        role = ROLE_ALIASES.get(str(role).lower()) if role is not None else None
        if role is None or not isinstance(content, str):
            return None
        # Empty system prompts render as an empty system block that evaluation prompts lack.
        if role == "system" and not content.strip():
            continue
        messages.append({"role": role, "content": content})
    # Dumps sometimes open with the assistant's greeting; a conversation starts with the user.
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), len(messages))
    messages = [m for i, m in enumerate(messages) if i >= first_user or m["role"] != "assistant"]
    prompt, _ = split_prompt(messages)
    if not prompt or prompt[-1]["role"] != "user":
        return None
    return messages
