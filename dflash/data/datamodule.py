"""Lightning DataModule for drafter training.

Batch contract (what the training module consumes), for a batch of b sequences padded
to the longest one, S tokens:
    input_ids:      LongTensor (b, S), right-padded with the tokenizer's pad id (EOS if none)
    loss_mask:      BoolTensor (b, S), True on response tokens that are training targets,
                    False on prompt tokens and padding
    attention_mask: BoolTensor (b, S), True on real tokens, False on padding
    row_index:      LongTensor (b,), each sequence's index among the tokenised rows (the
                    same on every rank and epoch; the state caches key on it), when the
                    rows carry "row_index".

Regenerated data (a directory with a manifest.json, see `dflash.data.regenerate`) must
hold every row its manifest lists: a directory whose regeneration did not finish is
refused unless `allow_partial` is set, which logs how much is missing.

The train/held-out split is made over conversations (before tokenisation) with a seeded
permutation, so it is the same on every rank and every run and does not move when
`max_length` changes. Under DDP Lightning inserts its DistributedSampler.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from dflash.data.config import DataSpec
from dflash.data.regenerate import read_manifest, shard_rows
from dflash.data.sources import SourceSpec, iter_conversations
from dflash.data.token_ids import tokenizer_fingerprint
from dflash.data.tokenize import TokenizedRows, TokenizeSettings, tokenize_conversations
from dflash.errors import require
from dflash.fileio import json_digest

log = logging.getLogger(__name__)

# Bumped whenever tokenisation changes what it produces from the same files, so caches
# built by an older version are not reused (2: rows use the target's token ids).
TOKENIZED_FORMAT = 2


@dataclass
class PadCollator:
    """Collate `{"input_ids": list[int], "loss_mask": list[int]}` rows (and an optional
    "row_index": int) into the batch contract."""

    pad_id: int

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(row["input_ids"]) for row in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        loss_mask = torch.zeros((len(rows), width), dtype=torch.bool)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, row in enumerate(rows):
            length = len(row["input_ids"])
            input_ids[i, :length] = torch.tensor(row["input_ids"], dtype=torch.long)
            loss_mask[i, :length] = torch.tensor(row["loss_mask"], dtype=torch.bool)
            attention_mask[i, :length] = True
        batch = {"input_ids": input_ids, "loss_mask": loss_mask, "attention_mask": attention_mask}
        if all("row_index" in row for row in rows):
            batch["row_index"] = torch.tensor([row["row_index"] for row in rows], dtype=torch.long)
        return batch


class _Subset(Dataset):
    def __init__(self, rows: TokenizedRows, indices: np.ndarray):
        self.rows, self.indices = rows, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict:
        row_index = int(self.indices[index])
        return {**self.rows[row_index], "row_index": row_index}


def split_conversations(num_rows: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (train, held-out) conversation indices, each sorted.

    The held-out share is round(num_rows * val_fraction), at least one row when
    val_fraction > 0 and there are two or more rows, and never every row.
    """
    permutation = np.random.default_rng(seed).permutation(num_rows)
    held_out = int(round(num_rows * val_fraction))
    if val_fraction > 0 and num_rows >= 2:
        held_out = min(max(held_out, 1), num_rows - 1)
    return np.sort(permutation[held_out:]), np.sort(permutation[:held_out])


class DFlashDataModule(L.LightningDataModule):
    """Tokenised conversations, split into train / held-out, batched by `PadCollator`.

    Args:
        data: a `SourceSpec`, a path (JSONL/Parquet file or directory of shards), or
            rows `{"messages": [...]}` already in memory. Every row needs a final
            assistant response.
        tokenizer: the target's tokenizer (its chat template lays out the sequences).
        tokenize: max_length, chat template and thinking settings.
        batch_size / val_fraction / seed / num_workers / allow_partial: as the `DataSpec` fields.
        cache_dir: when set, the tokenised rows are stored there (built once, by
            `prepare_data` on one process per node) and reused while the data, tokenizer
            and settings are unchanged.
        key: config prefix used to name keys in errors.
    """

    def __init__(
        self,
        data: SourceSpec | str | list[dict],
        tokenizer,
        tokenize: TokenizeSettings | None = None,
        batch_size: int = 1,
        val_fraction: float = 0.01,
        seed: int = 0,
        num_workers: int = 0,
        cache_dir: str | None = None,
        allow_partial: bool = False,
        key: str = "data",
    ):
        super().__init__()
        self.source = SourceSpec(path=data) if isinstance(data, str) else data
        self.tokenizer = tokenizer
        self.tokenize = tokenize or TokenizeSettings()
        self.tokenize.validate(tokenizer, key)
        require(batch_size >= 1, f"{key}.batch_size", f"must be at least 1, got {batch_size}")
        require(0 <= val_fraction < 1, f"{key}.val_fraction", f"must be in [0, 1), got {val_fraction}")
        require(num_workers >= 0, f"{key}.num_workers", f"must be >= 0, got {num_workers}")
        self.batch_size, self.val_fraction, self.seed = batch_size, val_fraction, seed
        self.num_workers, self.cache_dir, self.allow_partial, self.key = num_workers, cache_dir, allow_partial, key
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        require(pad_id is not None, "target.path", "the tokenizer has neither a pad nor an EOS token to pad with")
        self.collate = PadCollator(pad_id)
        self.rows: TokenizedRows | None = None
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self._check_regenerated_directory()

    @classmethod
    def from_spec(cls, spec: DataSpec, tokenizer, key: str = "data") -> DFlashDataModule:
        """Build from the `data` config group."""
        return cls(
            spec.source(),
            tokenizer,
            tokenize=spec.tokenize_settings(),
            batch_size=spec.batch_size,
            val_fraction=spec.val_fraction,
            seed=spec.seed,
            num_workers=spec.num_workers,
            cache_dir=spec.cache_dir,
            allow_partial=spec.allow_partial,
            key=key,
        )

    @property
    def num_dropped(self) -> int:
        """Conversations left out by tokenisation (no response token left, hidden response)."""
        return sum(self.rows.dropped.values()) if self.rows is not None else 0

    def prepare_data(self) -> None:
        if self.cache_dir is not None:
            self._tokenized()

    def setup(self, stage: str | None = None) -> None:
        if self.rows is not None:
            return
        self.rows = self._tokenized()
        num_conversations = self.rows.num_conversations
        _, held_out = split_conversations(num_conversations, self.val_fraction, self.seed)
        is_held_out = np.isin(self.rows.conversation_index, held_out)
        self.train_set = _Subset(self.rows, np.flatnonzero(~is_held_out))
        self.val_set = _Subset(self.rows, np.flatnonzero(is_held_out))
        require(len(self.train_set) > 0, f"{self.key}.path", "no training sequence is left after tokenisation")
        log.info(
            "data: %d train / %d held-out sequences from %d conversations (%d dropped)",
            len(self.train_set),
            len(self.val_set),
            num_conversations,
            self.num_dropped,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def _loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def _tokenized(self) -> TokenizedRows:
        cache_path = None
        if self.cache_dir is not None:
            cache_path = os.path.join(self.cache_dir, f"tokenized-{self.fingerprint()}.npz")
            if os.path.isfile(cache_path):
                return TokenizedRows.load(cache_path)
        if isinstance(self.source, SourceSpec):
            conversations = iter_conversations(self.source, self.key, require_response=True)
        else:
            conversations = self.source
        rows = tokenize_conversations(self.tokenizer, conversations, self.tokenize)
        if cache_path is not None:
            rows.save(cache_path)
        return rows

    def fingerprint(self) -> str:
        """Hash of everything the tokenised rows depend on."""
        tokenizer = self.tokenizer
        parts = {
            "format": TOKENIZED_FORMAT,
            "tokenize": dataclasses.asdict(self.tokenize),
            "tokenizer": [tokenizer_fingerprint(tokenizer), tokenizer.eos_token_id],
        }
        if isinstance(self.source, SourceSpec):
            parts["source"] = dataclasses.asdict(self.source)
            path = os.path.expanduser(self.source.path)
            if os.path.isdir(path):  # hidden files (locks, unfinished writes) are not data
                files = sorted(os.path.join(path, name) for name in os.listdir(path) if not name.startswith("."))
            else:
                files = [path] if os.path.isfile(path) else []
            parts["files"] = [(f, os.path.getsize(f), os.path.getmtime(f)) for f in files]
        else:
            parts["rows"] = json_digest(self.source)
        return json_digest(parts, 20, default=str)

    def _check_regenerated_directory(self) -> None:
        """Regenerated data must be complete (or `allow_partial`) and use the thinking mode
        it was regenerated with."""
        if not isinstance(self.source, SourceSpec) or not os.path.isdir(os.path.expanduser(self.source.path)):
            return
        directory = os.path.expanduser(self.source.path)
        manifest = read_manifest(directory, f"{self.key}.path") or {}
        regenerated = manifest.get("settings", {}).get("enable_thinking", self.tokenize.enable_thinking)
        require(
            regenerated == self.tokenize.enable_thinking,
            f"{self.key}.enable_thinking",
            f"is {self.tokenize.enable_thinking} but {self.source.path!r} was regenerated with "
            f"enable_thinking={regenerated}; the template must match (docs/design.md invariant 8)",
        )
        expected = manifest.get("num_rows")
        present = shard_rows(directory)
        if expected is None or present >= expected:
            return
        missing = f"{expected - present} of the {expected} rows its manifest.json lists are missing"
        require(
            self.allow_partial,
            f"{self.key}.path",
            f"{self.source.path!r} is unfinished regenerated data: {missing}; finish it by re-running the "
            f"same python -m dflash.regenerate command, or set {self.key}.allow_partial=true to train on the {present} there",
        )
        log.warning(
            "data: %s in %s; training on the %d there (%s.allow_partial=true)", missing, self.source.path, present, self.key
        )
