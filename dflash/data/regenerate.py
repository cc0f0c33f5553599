"""Regeneration: the target writes the responses the drafter will learn from.

For each row the prompt (every turn before the last assistant turn) is answered by the
target, and the row is written back as `{"messages": prompt + [{"role": "assistant",
"content": generated}]}`. The HF generator also writes the exact prompt and response
token ids (`"token_ids"`, see `dflash.data.token_ids`), which training uses instead of
re-encoding the text; servers return text only.

Output layout (resumable): `out_dir/rows-SSSSSSSS-EEEEEEEE.jsonl` holds rows [S, E) in
input order; each shard is written atomically (`dflash.fileio.atomic_write`: a temporary
file unique to its writer, then a rename), so a shard that exists is complete and is never
generated again. One regeneration at a time writes a directory: it holds the directory's
`dflash.locks.DirectoryLock`, and a second one exits naming the holder. `out_dir/manifest.json` records the
target, the settings and a fingerprint of the prompts: resuming with anything else
changed is an error rather than a silently mixed dataset. With token ids, the manifest
also records the tokenizer's fingerprint, so a directory never mixes rows with ids and
rows without, nor ids of two tokenizers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict

import torch
from tqdm.auto import tqdm

from dflash.data.config import RegenerateSettings
from dflash.data.generators import Generated, Generator, HFGenerator, ServerGenerator
from dflash.data.sources import split_prompt
from dflash.data.token_ids import TOKEN_IDS, token_ids_record, tokenizer_manifest
from dflash.errors import ConfigError, require
from dflash.fileio import remove_partial_writes, write_json, write_jsonl
from dflash.layout import MANIFEST
from dflash.locks import DirectoryLock
from dflash.progress import bar_interval

log = logging.getLogger(__name__)

LOCK_REMEDY = "wait for it to finish, or write elsewhere (regenerate.output_dir=DIR)"


def make_generator(target, settings: RegenerateSettings) -> Generator:
    """The server generator when `settings.server_url` is set, else the HF target."""
    sampling = {key: getattr(settings, key) for key in ("max_new_tokens", "temperature", "top_p", "top_k", "enable_thinking")}
    if settings.server_url:
        return ServerGenerator(
            settings.server_url,
            model=settings.server_model,
            concurrency=settings.batch_size,
            timeout_s=settings.request_timeout_s,
            **sampling,
        )
    require(target is not None, "target", "a target model is needed when regenerate.server_url is not set")
    return HFGenerator(target, **sampling)


def regenerate(
    target,
    rows: list[dict],
    out_dir: str,
    settings: RegenerateSettings | None = None,
    generator: Generator | Callable | None = None,
    progress: bool = True,
) -> str:
    """Regenerate the final assistant response of every row with the target; returns `out_dir`.

    Args:
        target: a `TargetModel` (unused when `generator` is given or settings.server_url is set).
        rows: `{"messages": [...]}` rows; each must contain a user turn to answer.
        out_dir: output directory of JSONL shards; existing complete shards are kept.
        generator: overrides the generator (tests, custom backends).
    """
    settings = settings or RegenerateSettings()
    settings.validate()
    prompts = []
    for index, row in enumerate(rows):
        prompt, _ = split_prompt(row["messages"])
        require(
            bool(prompt) and prompt[-1]["role"] == "user",
            "data",
            f"row {index} has no user turn to answer; its messages are {row['messages'][:3]}...",
        )
        prompts.append(prompt)
    generator = generator or make_generator(target, settings)
    tokenizer = getattr(generator, "tokenizer", None)
    manifest = _manifest(generator, prompts, settings, tokenizer)
    fingerprint = manifest["tokenizer"]["fingerprint"] if tokenizer is not None else None
    with DirectoryLock(out_dir, "regenerate.output_dir", LOCK_REMEDY):
        remove_partial_writes(out_dir)  # shards of a killed run
        _check_manifest(out_dir, manifest)
        _write_missing_shards(generator, prompts, out_dir, settings, fingerprint, progress)
    return out_dir


def _write_missing_shards(generator, prompts, out_dir, settings: RegenerateSettings, fingerprint, progress: bool) -> None:
    """Generate and write every shard of `prompts` that `out_dir` does not hold yet."""
    size = settings.shard_size
    shards = [(start, min(start + size, len(prompts))) for start in range(0, len(prompts), size)]
    todo = [(start, stop) for start, stop in shards if not os.path.exists(_shard_path(out_dir, start, stop))]
    done_rows = len(prompts) - sum(stop - start for start, stop in todo)
    if done_rows:
        log.info("regenerate: %d of %d rows already done in %s", done_rows, len(prompts), out_dir)
    bar = tqdm(
        total=len(prompts), initial=done_rows, desc="regenerate", unit="row", disable=not progress, mininterval=bar_interval()
    )
    tokens, unfinished, began = 0, 0, time.perf_counter()
    for start, stop in todo:
        torch.manual_seed(settings.seed + start)
        shard_prompts = prompts[start:stop]
        answers: list[Generated | None] = [None] * len(shard_prompts)
        # Similar lengths batch together (less padding); output order stays the input order.
        order = sorted(range(len(shard_prompts)), key=lambda i: sum(len(m["content"]) for m in shard_prompts[i]))
        for first in range(0, len(order), settings.batch_size):
            batch = order[first : first + settings.batch_size]
            for i, answer in zip(batch, generator([shard_prompts[i] for i in batch])):
                answers[i] = answer
                tokens += answer.num_tokens
                unfinished += not answer.finished
            # refresh=False: a postfix must not redraw the bar past its mininterval (a log
            # file got a line every batch); the update draws it when the interval allows.
            bar.set_postfix(tok_s=f"{tokens / max(time.perf_counter() - began, 1e-9):.1f}", refresh=False)
            bar.update(len(batch))
        _write_shard(out_dir, start, stop, shard_prompts, answers, fingerprint)
    bar.close()
    if unfinished:
        log.warning("regenerate: %d responses reached max_new_tokens=%d and are cut", unfinished, settings.max_new_tokens)


def shard_paths(out_dir: str) -> list[str]:
    """The finished shards of a regeneration directory, in row order."""
    names = sorted(n for n in os.listdir(out_dir) if n.startswith("rows-") and n.endswith(".jsonl"))
    return [os.path.join(out_dir, n) for n in names]


def shard_rows(out_dir: str) -> int:
    """How many rows the finished shards of `out_dir` hold (read from their names)."""
    total = 0
    for path in shard_paths(out_dir):
        start, stop = os.path.basename(path).removesuffix(".jsonl").split("-")[1:]
        total += int(stop) - int(start)
    return total


def read_manifest(out_dir: str, key: str = "regenerate.output_dir") -> dict | None:
    """The manifest of a regeneration directory, or None if it has none.

    key: the config key naming `out_dir`, for the error when the manifest is not JSON.
    """
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        try:
            return json.load(handle)
        except ValueError as err:
            raise ConfigError(key, f"{path} is not valid JSON ({err}); regenerate into a new directory") from None


def _shard_path(out_dir: str, start: int, stop: int) -> str:
    return os.path.join(out_dir, f"rows-{start:08d}-{stop:08d}.jsonl")


def _write_shard(out_dir, start, stop, prompts, answers, fingerprint: str | None) -> None:
    rows = []
    for prompt, answer in zip(prompts, answers):
        row = {"messages": prompt + [{"role": "assistant", "content": answer.text}]}
        if answer.response_ids is not None:
            if fingerprint is None:
                raise ValueError("the generator returns token ids but has no `tokenizer` to fingerprint them with")
            row[TOKEN_IDS] = token_ids_record(answer.prompt_ids, answer.response_ids, fingerprint)
        rows.append(row)
    write_jsonl(_shard_path(out_dir, start, stop), rows, ensure_ascii=False)


def _manifest(generator, prompts, settings: RegenerateSettings, tokenizer) -> dict:
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(json.dumps(prompt, sort_keys=True, ensure_ascii=False).encode())
        digest.update(b"\n")
    generation = {k: v for k, v in asdict(settings).items() if k not in ("batch_size", "request_timeout_s", "server_url")}
    manifest = {
        "generator": getattr(generator, "name", type(generator).__name__),
        "num_rows": len(prompts),
        "prompts_sha256": digest.hexdigest(),
        "settings": generation,
    }
    if tokenizer is not None:  # text-only generators (servers) keep the manifest they always had
        manifest["tokenizer"] = tokenizer_manifest(tokenizer)
    return manifest


def _check_manifest(out_dir: str, manifest: dict) -> None:
    existing = read_manifest(out_dir)
    if existing is not None and existing != manifest:
        changed = sorted(k for k in set(existing) | set(manifest) if existing.get(k) != manifest.get(k) and k != "settings")
        changed += [
            f"settings.{k}"
            for k in sorted(set(existing.get("settings", {})) | set(manifest["settings"]))
            if existing.get("settings", {}).get(k) != manifest["settings"].get(k)
        ]
        if "tokenizer" in manifest and "tokenizer" not in existing:
            what = "shards without token ids (written by an older dflash)"
        else:
            what = f"shards made with different {', '.join(changed)}"
        raise ConfigError(
            "regenerate.output_dir",
            f"{out_dir!r} holds {what}; use a new output directory (or delete this one) to regenerate",
        )
    if existing is None:
        write_json(os.path.join(out_dir, MANIFEST), manifest, indent=2)
