"""Hub datasets without the hub: `datasets.load_dataset` routed to local directories laid
out as the real repos are, with every call recorded."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq


class LocalHub:
    """Stands in for the hub: `repos[hub id] = local directory`; `calls` records each
    load_dataset call's path and keyword arguments (revision included, which local
    directories do not take and is dropped before the real call)."""

    def __init__(self, monkeypatch, cache_dir):
        import datasets

        self.repos: dict[str, str] = {}
        self.calls: list[dict] = []
        real = datasets.load_dataset

        def load_dataset(path, *args, revision=None, **kwargs):
            self.calls.append({"path": path, "revision": revision, **kwargs})
            return real(self.repos.get(path, path), *args, **kwargs)

        monkeypatch.setattr(datasets, "load_dataset", load_dataset)
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache_dir))
        # datasets sleeps this long (5 s) each time a parquet stream stops, against a thread
        # crash of arrow at the interpreter's exit (apache/arrow#39862): a test process does
        # not exit there, and a tenth of a second is the workaround's own measure.
        monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0.1)


def write_parquet_shards(root, split: str, shards: list[list[dict]]) -> list[str]:
    """`root/data/{split}-0000i-of-0000n.parquet`, the hub's layout for a split's shards."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    paths = []
    for i, rows in enumerate(shards):
        path = root / "data" / f"{split}-{i:05d}-of-{len(shards):05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        paths.append(str(path))
    return paths


def write_unreadable_split(root, split: str) -> None:
    """A split whose one shard is not Parquet: reading it at all fails."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / f"{split}-00000-of-00001.parquet").write_bytes(b"not a parquet file")


def chat_row(text: str, source: str) -> dict:
    """A Nemotron v2 row: messages plus the metadata columns the dataset carries."""
    return {
        "uuid": text,
        "license": "CC BY 4.0",
        "generator": source,
        "reasoning": "off",
        "messages": [
            {"role": "user", "content": text, "reasoning_content": ""},
            {"role": "assistant", "content": "ok", "reasoning_content": ""},
        ],
    }
