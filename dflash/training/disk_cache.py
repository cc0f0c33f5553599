"""A disk cache of the frozen target's states, shared by every drafter trained on the same data.

The target is frozen and the tokenised training rows are fixed, so the target states a
drafter trains on (the tapped layers' hidden states, plus the final hidden state for
losses that read the target's distribution) are a pure function of (target, rows). They
are computed once, written to disk in the storage dtype (bf16 by default), and
memory-mapped by every later run on the same data: seeds, depths, block sizes, losses and
EAGLE-3 skip the target entirely (`training.target_cache_dir`, docs/training.md).

Layout of one cache, `<root>/<key>/` (key: a hash of the target's fingerprint, the
tokenised rows' fingerprint, the storage dtype and `FORMAT`):

    manifest.json                          what the key hashes, row count, shard size, hidden size
    layer-LL/rows-SSSSSSSS-EEEEEEEE.bin    target layer LL of rows [S, E): the real positions of
                                           row S, then row S+1, ...: (their total length, D) values,
                                           raw, in the storage dtype (bf16 as its 16 bits)

Invariants:
- Layer ids follow the tap convention everywhere: layer i is HF's `hidden_states[i + 1]`; layer
  L-1 is HF's last hidden state, after the final norm, from which the loss reads logits.
- Layers are separate files, so drafters with different taps share the layers they have in
  common; a run fills only the (shard, layer) files that are missing.
- Every file is written atomically (`dflash.fileio.atomic_write`): a file under its final name
  is complete, so a killed fill resumes at the first missing file. A file whose size does not
  match its rows' lengths is damaged: it is deleted and filled again, with a warning.
- A row's states equal the target's states of that row in a training batch up to float
  rounding (and the storage dtype's rounding): fill batches are right-padded, and causal
  attention keeps padding out of real positions, as in training. The fill runs under the
  trainer's precision context, as a training step's target forward does; the autocast
  dtype is part of the key, so a float32 fill and a bf16-mixed one are two caches.
- Ranks split the fill by shard (shard i by rank i % world_size); the caller then waits for
  all ranks before reading (`DrafterTrainingModule.setup`). Processes filling the same share
  (jobs of a sweep started together) take turns on a file lock, so each file is computed once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from dflash.errors import ConfigError, require
from dflash.fileio import atomic_write, json_digest, write_json
from dflash.layout import MANIFEST
from dflash.progress import PROGRESS_INTERVAL_S, format_duration, is_interactive

log = logging.getLogger(__name__)

FORMAT = 1
STORAGE_DTYPES = {"bfloat16": (torch.bfloat16, np.int16), "float32": (torch.float32, np.float32)}
_SAMPLE = 1024  # values per parameter end hashed by `weights_fingerprint`


def _autocast(device_type: str) -> dict:
    """{"autocast": dtype} when the fill runs under autocast (a mixed-precision trainer's), else {}."""
    if not torch.is_autocast_enabled(device_type):
        return {}
    return {"autocast": str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")}


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A cheap fingerprint of a model's weights: the names, shapes and dtypes of every
    parameter and buffer, and the first and last `_SAMPLE` values of each."""
    digest = hashlib.sha256()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        flat = tensor.detach().reshape(-1)
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        sample = torch.cat([flat[:_SAMPLE], flat[-_SAMPLE:]]).float().cpu()
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:20]


class DiskStateCache:
    """The states of one target on one set of tokenised rows (see the module docstring).

    Args:
        directory: `<root>/<key>`, as `open` makes it.
        lengths: (rows,) int, the number of tokens of each row.
        hidden_size: D of the target.
        dtype: storage dtype, "bfloat16" or "float32".
        shard_rows: rows per file.
    """

    def __init__(self, directory: str, lengths: np.ndarray, hidden_size: int, dtype: str = "bfloat16", shard_rows: int = 64):
        if dtype not in STORAGE_DTYPES:  # TrainingSettings refuses it, naming training.target_cache_dtype
            raise ValueError(f"unknown storage dtype {dtype!r}; choose one of {list(STORAGE_DTYPES)}")
        self.directory = directory
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.hidden_size = int(hidden_size)
        self.dtype = dtype
        self.torch_dtype, self.numpy_dtype = STORAGE_DTYPES[dtype]
        self.shard_rows = int(shard_rows)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self._maps: dict[tuple[int, int], np.memmap] = {}

    @classmethod
    def open(
        cls,
        root: str,
        target,
        data_fingerprint: str,
        lengths: np.ndarray,
        dtype: str = "bfloat16",
        shard_rows: int = 64,
    ) -> DiskStateCache:
        """The cache of `target` (a `TargetModel`) on the rows `data_fingerprint` names,
        under `root`; creates its directory and manifest when new."""
        lengths = np.asarray(lengths, dtype=np.int64)
        identity = {
            "format": FORMAT,
            "target": {
                "name": getattr(target.config, "_name_or_path", "") or type(target.model).__name__,
                "weights": weights_fingerprint(target.model),
                "dtype": str(target.dtype).removeprefix("torch."),
                "hidden_size": target.hidden_size,
                "num_layers": target.num_layers,
                **_autocast(target.device.type),
            },
            "data": data_fingerprint,
            "storage_dtype": dtype,
            "shard_rows": shard_rows,
        }
        key = json_digest(identity, 16)
        directory = os.path.join(os.path.abspath(os.path.expanduser(root)), key)
        manifest = {
            **identity,
            "num_rows": int(len(lengths)),
            "num_tokens": int(lengths.sum()),
            "lengths_sha256": hashlib.sha256(lengths.tobytes()).hexdigest(),
        }
        path = os.path.join(directory, MANIFEST)
        if os.path.isfile(path):
            try:
                with open(path) as handle:
                    existing = json.load(handle)
            except ValueError:
                existing = None
            if existing != manifest:  # a key collision or a damaged manifest: never mix two caches
                raise ConfigError(
                    "target_cache_dir",
                    f"{directory} holds a different cache (its manifest.json does not match); delete that directory",
                )
        else:
            write_json(path, manifest, indent=2)
        return cls(directory, lengths, target.hidden_size, dtype, shard_rows)

    @property
    def num_shards(self) -> int:
        return (len(self.lengths) + self.shard_rows - 1) // self.shard_rows

    def disk_bytes(self) -> int:
        """Bytes of every layer file of this cache."""
        total = 0
        for directory, _, files in os.walk(self.directory):
            total += sum(os.path.getsize(os.path.join(directory, f)) for f in files if f.endswith(".bin"))
        return total

    def _rows(self, shard: int) -> tuple[int, int]:
        return shard * self.shard_rows, min((shard + 1) * self.shard_rows, len(self.lengths))

    def _path(self, shard: int, layer: int) -> str:
        start, stop = self._rows(shard)
        return os.path.join(self.directory, f"layer-{layer:02d}", f"rows-{start:08d}-{stop:08d}.bin")

    def _expected_bytes(self, shard: int) -> int:
        start, stop = self._rows(shard)
        tokens = int(self.offsets[stop] - self.offsets[start])
        return tokens * self.hidden_size * np.dtype(self.numpy_dtype).itemsize

    def _present(self, shard: int, layer: int) -> bool:
        path = self._path(shard, layer)
        if not os.path.isfile(path):
            return False
        if os.path.getsize(path) == self._expected_bytes(shard):
            return True
        log.warning("target state cache: %s has the wrong size (damaged); filling it again", path)
        os.remove(path)
        return False

    def missing(self, layers: list[int]) -> dict[int, list[int]]:
        """{shard: layers of `layers` whose file is missing}, for the shards that miss any."""
        todo = {}
        for shard in range(self.num_shards):
            absent = [layer for layer in layers if not self._present(shard, layer)]
            if absent:
                todo[shard] = absent
        return todo

    def fill(
        self,
        target,
        row_ids,
        layers: list[int],
        batch_size: int = 8,
        rank: int = 0,
        world_size: int = 1,
        progress: bool = True,
    ) -> int:
        """Compute and write this rank's missing (shard, layer) files. Returns the tokens computed.

        Args:
            target: the `TargetModel` the cache belongs to.
            row_ids: row index -> that row's token ids (1-D int array-like).
            layers: target layers to have on disk (0-based; L-1 for the final hidden state).
            batch_size: rows per target forward.
        """
        from dflash.target.builds import build_lock

        # Jobs filling the same share wait for each other; ranks of one job fill at once.
        lock = os.path.join(self.directory, f"fill-{rank}-of-{world_size}")
        with build_lock(lock, lambda message: log.info("target state cache: %s", message)):
            return self._fill(target, row_ids, layers, batch_size, rank, world_size, progress)

    def _fill(self, target, row_ids, layers, batch_size, rank, world_size, progress) -> int:
        from dflash.training.forward import target_features

        todo = {s: absent for s, absent in self.missing(layers).items() if s % world_size == rank}
        if not todo:
            return 0
        rows = sum(self._rows(s)[1] - self._rows(s)[0] for s in todo)
        log.info(
            "target state cache: computing layers %s for %d rows (%d shards) into %s",
            sorted({layer for absent in todo.values() for layer in absent}),
            rows,
            len(todo),
            self.directory,
        )
        report = _FillProgress(rows, progress)
        began, tokens = time.perf_counter(), 0
        for shard, absent in todo.items():
            start, stop = self._rows(shard)
            buffers = {
                layer: torch.empty(int(self.offsets[stop] - self.offsets[start]), self.hidden_size, dtype=self.torch_dtype)
                for layer in absent
            }
            order = sorted(range(start, stop), key=lambda r: -int(self.lengths[r]))  # similar lengths batch together
            for first in range(0, len(order), batch_size):
                batch_rows = order[first : first + batch_size]
                width = int(self.lengths[batch_rows[0]])
                input_ids = torch.zeros((len(batch_rows), width), dtype=torch.long)  # right padding: never read
                for i, row in enumerate(batch_rows):
                    ids = torch.as_tensor(np.asarray(row_ids(row)), dtype=torch.long)
                    require(
                        len(ids) == self.lengths[row],
                        "target_cache_dir",
                        f"row {row} changed length; delete {self.directory}",
                    )
                    input_ids[i, : len(ids)] = ids
                with torch.no_grad():
                    states = target_features(target, input_ids.to(target.device), absent).cpu()
                for i, row in enumerate(batch_rows):
                    length = int(self.lengths[row])
                    at = int(self.offsets[row] - self.offsets[start])
                    for j, layer in enumerate(absent):
                        buffers[layer][at : at + length] = states[i, :length, j * self.hidden_size : (j + 1) * self.hidden_size]
                    tokens += length
                report.update(len(batch_rows), tokens)
            for layer, values in buffers.items():
                raw = values.view(torch.int16) if self.torch_dtype == torch.bfloat16 else values
                data = raw.numpy().tobytes()
                atomic_write(self._path(shard, layer), lambda temporary, data=data: _write_bytes(temporary, data))
        report.close()
        elapsed = time.perf_counter() - began
        log.info(
            "target state cache: %d tokens in %.0f s (%.0f tokens/s); %.1f MiB on disk in %s",
            tokens,
            elapsed,
            tokens / max(elapsed, 1e-9),
            self.disk_bytes() / 2**20,
            self.directory,
        )
        return tokens

    def _map(self, shard: int, layer: int) -> np.memmap:
        key = (shard, layer)
        if key not in self._maps:
            path = self._path(shard, layer)
            if not self._present(shard, layer):
                raise ConfigError(
                    "target_cache_dir",
                    f"{path} is missing; the cache was not filled for layer {layer} (or was deleted while training)",
                )
            start, stop = self._rows(shard)
            tokens = int(self.offsets[stop] - self.offsets[start])
            self._maps[key] = np.memmap(path, dtype=self.numpy_dtype, mode="r", shape=(tokens, self.hidden_size))
        return self._maps[key]

    def read(self, row_index: torch.Tensor, width: int, layers: list[int], dtype: torch.dtype) -> torch.Tensor:
        """States of a right-padded batch, zero on padding.

        Args:
            row_index: (b,) long, the rows (as in the training batch's `row_index`).
            width: S, the batch's padded length.
            layers: the layers to concatenate, in order.
            dtype: dtype of the result.
        Returns:
            (b, S, len(layers) * D) on the CPU.
        """
        rows = [int(r) for r in row_index.tolist()]
        out = torch.zeros(len(rows), width, len(layers) * self.hidden_size, dtype=dtype)
        for i, row in enumerate(rows):
            shard = row // self.shard_rows
            start = self.shard_rows * shard
            at = int(self.offsets[row] - self.offsets[start])
            length = int(self.lengths[row])
            require(
                length <= width,
                "target_cache_dir",
                f"row {row} is longer than its batch; the cache does not fit this data",
            )
            for j, layer in enumerate(layers):
                values = torch.from_numpy(np.array(self._map(shard, layer)[at : at + length]))
                if self.torch_dtype == torch.bfloat16:
                    values = values.view(torch.bfloat16)
                out[i, :length, j * self.hidden_size : (j + 1) * self.hidden_size] = values.to(dtype)
        return out


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


class _FillProgress:
    """A progress bar on a terminal, else one log line every `PROGRESS_INTERVAL_S` seconds."""

    def __init__(self, total_rows: int, enabled: bool):
        self.total, self.done, self.interval = total_rows, 0, PROGRESS_INTERVAL_S
        self.began = self.last_line = time.perf_counter()
        self.bar = tqdm(total=total_rows, desc="target states", unit="row") if enabled and is_interactive() else None
        self.lines = enabled and self.bar is None

    def update(self, rows: int, tokens: int) -> None:
        self.done += rows
        now = time.perf_counter()
        rate = tokens / max(now - self.began, 1e-9)
        if self.bar is not None:
            self.bar.update(rows)
            self.bar.set_postfix(tok_s=f"{rate:.0f}", refresh=False)
        elif self.lines and now - self.last_line >= self.interval:
            self.last_line = now
            eta = (now - self.began) / self.done * (self.total - self.done)
            log.info(
                "target states: %d/%d rows (%d%%), %.0f tokens/s, ETA %s",
                self.done,
                self.total,
                100 * self.done // self.total,
                rate,
                format_duration(eta),
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
