"""A tiny but real code LM, built offline from the Python standard library's source.

The stdlib's functions, one document each (`split_corpus`), a byte-level BPE tokenizer trained on
them (`train_tokenizer`), a small Qwen3 pre-trained with next-token loss (`dflash.toy.pretrain`),
saved as an HF directory with `build_info.json` (config, its hash, losses, tokens seen, wall time).

Invariants:
- Same `TinyCodeConfig` (which fixes the thread count) on the same machine (Python
  stdlib, torch build) -> same weights. Training length is a step count, never a time
  budget, for that reason.
- A directory is "built" only when `build_info.json` holds the current config hash;
  builds write into a temporary sibling directory that is renamed into place last, so
  a killed build never leaves a directory that looks finished.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import random
import sys
import sysconfig
import textwrap
import time
from dataclasses import dataclass

from dflash.errors import require
from dflash.fileio import json_digest
from dflash.target.builds import Say, build_once, read_build_info, save_atomically

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|MASK|>"]
# Bump when the build procedure changes in a way that changes the weights.
BUILD_FORMAT_VERSION = 1
# Path components skipped in the stdlib: tests and test data, vendored or third-party
# code, and generated tables (codec maps, pydoc topics) that teach nothing about code.
EXCLUDED_DIRS = frozenset(
    "test tests idle_test idlelib lib2to3 site-packages dist-packages ensurepip encodings pydoc_data turtledemo __pycache__".split()
)


@dataclass
class TinyCodeConfig:
    """Everything that determines a tiny code target (hashed to decide rebuilds).

    Model: a Qwen3 with `num_layers` layers of width `hidden_size`, `num_heads` query and
    `num_kv_heads` key/value heads (head_dim = hidden_size / num_heads).
    Training: `max_steps` AdamW steps on batches of `batch_size` random windows of
    `seq_len` tokens; linear warm-up over `warmup_steps`, cosine decay to lr/10.
    Corpus: at most `max_corpus_bytes` of stdlib functions, `heldout_fraction` of it
    (whole files) held out; validation loss is averaged over at most `val_windows` windows.
    num_threads: torch threads while pre-training; set 1 on a shared machine (docs/design.md,
        "Measured figures").
    """

    seed: int = 0
    vocab_size: int = 1024
    num_layers: int = 8
    hidden_size: int = 64
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 192
    max_position_embeddings: int = 2048
    seq_len: int = 512
    batch_size: int = 2
    max_steps: int = 2400
    lr: float = 5e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1
    max_corpus_bytes: int = 8_000_000
    heldout_fraction: float = 0.05
    val_windows: int = 32
    num_threads: int = 2

    def __post_init__(self):
        for name in (
            "vocab_size",
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "seq_len",
            "batch_size",
            "max_steps",
            "max_corpus_bytes",
            "val_windows",
            "num_threads",
        ):
            require(getattr(self, name) > 0, name, f"must be a positive integer, got {getattr(self, name)}")
        require(self.vocab_size >= 512, "vocab_size", f"must be >= 512 (256 bytes + merges), got {self.vocab_size}")
        require(
            self.hidden_size % self.num_heads == 0,
            "num_heads",
            f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}",
        )
        require(
            self.num_heads % self.num_kv_heads == 0,
            "num_kv_heads",
            f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}",
        )
        require(
            self.seq_len <= self.max_position_embeddings,
            "seq_len",
            f"seq_len {self.seq_len} exceeds max_position_embeddings {self.max_position_embeddings}",
        )
        require(0.0 < self.heldout_fraction < 0.5, "heldout_fraction", f"must be in (0, 0.5), got {self.heldout_fraction}")
        require(self.lr > 0, "lr", f"must be positive, got {self.lr}")
        require(0 <= self.warmup_steps < self.max_steps, "warmup_steps", "must be in [0, max_steps)")

    @classmethod
    def from_dict(cls, data: dict) -> TinyCodeConfig:
        """Build from a plain dict (a `target.build` config block; `kind` is ignored)."""
        from dflash.structured import typed

        return typed(cls, {k: v for k, v in data.items() if k != "kind"}, "")

    def build_hash(self) -> str:
        """Hash of everything that determines the weights: this config, the build
        procedure version and the Python version (whose stdlib is the corpus)."""
        payload = {
            "config": dataclasses.asdict(self),
            "format": BUILD_FORMAT_VERSION,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}",
        }
        return json_digest(payload, 16)


def stdlib_source_files() -> list[str]:
    """Sorted absolute paths of the stdlib `.py` files used as corpus (see EXCLUDED_DIRS)."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in EXCLUDED_DIRS and not d.startswith("config-"))
        paths.extend(os.path.join(directory, name) for name in files if name.endswith(".py"))
    require(paths, "build", f"no Python source files found under the stdlib directory {root!r}")
    return sorted(paths)


def read_source(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


@dataclass(frozen=True)
class FunctionSource:
    """One function (or method) of a source file, dedented.

    text: the whole definition from its `def` line, ending in a newline.
    header: the `def` line(s) and docstring, up to where the body starts, ending in a
        newline; None when there is no docstring followed by a body.
    has_body: False for a function that is only a docstring (a stub).
    """

    text: str
    header: str | None
    has_body: bool


def source_functions(source: str) -> list[FunctionSource]:
    """The module-level functions and the methods of module-level classes of `source`,
    in file order (nested functions stay inside their parent). Unparsable sources give []."""
    tree = _parse(source)
    return [] if tree is None else _functions(tree, source.splitlines())


def file_documents(source: str) -> list[str]:
    """The pre-training documents of one file: each function that has a body beyond its
    docstring; the first is preceded by the file's module-level imports, as HumanEval
    prompts are."""
    tree = _parse(source)
    if tree is None:
        return []
    lines = source.splitlines()
    documents = [function.text for function in _functions(tree, lines) if function.has_body]
    imports = ["\n".join(lines[n.lineno - 1 : n.end_lineno]) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if documents and imports:
        documents[0] = "\n".join(imports) + "\n\n\n" + documents[0]
    return documents


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _functions(tree: ast.Module, lines: list[str]) -> list[FunctionSource]:
    nodes = []
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        nodes.extend(n for n in members if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    functions = []
    for node in nodes:
        text = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno])) + "\n"
        if not text.startswith(("def ", "async def ")):
            continue  # a multi-line string at column 0 kept the indentation: not a clean cut
        body = node.body
        has_docstring = (
            isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)
        )
        header = None
        # `"""doc"""; body` on one line leaves no clean place to cut.
        if has_docstring and len(body) > 1 and body[1].lineno > body[0].end_lineno:
            header = "\n".join(text.split("\n")[: body[0].end_lineno - node.lineno + 1]) + "\n"
        functions.append(FunctionSource(text, header, has_body=len(body) > 1 or not has_docstring))
    return functions


@dataclass
class Corpus:
    """Training and held-out documents (one function each) and the files they came from."""

    train_documents: list[str]
    heldout_documents: list[str]
    train_files: list[str]
    heldout_files: list[str]


def split_corpus(config: TinyCodeConfig) -> Corpus:
    """The pre-training corpus: the functions of the stdlib files, one document each.

    Files are visited in a seeded shuffle until the functions reach `max_corpus_bytes` (UTF-8); the
    files worth the last `heldout_fraction` of those bytes are held out.
    """
    files = stdlib_source_files()
    random.Random(config.seed).shuffle(files)
    chosen: list[tuple[str, list[str]]] = []
    total = 0
    for path in files:
        if total >= config.max_corpus_bytes:
            break
        documents = file_documents(read_source(path))
        if documents:
            chosen.append((path, documents))
            total += sum(len(d.encode()) for d in documents)
    heldout: list[tuple[str, list[str]]] = []
    heldout_bytes = 0
    while len(chosen) > 1 and heldout_bytes < config.heldout_fraction * total:
        path, documents = chosen.pop()
        heldout.append((path, documents))
        heldout_bytes += sum(len(d.encode()) for d in documents)
    return Corpus(
        train_documents=[d for _, documents in chosen for d in documents],
        heldout_documents=[d for _, documents in heldout for d in documents],
        train_files=[path for path, _ in chosen],
        heldout_files=[path for path, _ in heldout],
    )


def train_tokenizer(texts: list[str], vocab_size: int, progress: bool = True):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts`.

    Special tokens take ids 0, 1, 2: <|endoftext|> (eos), <|pad|>, <|MASK|> (mask). No BOS and no chat
    template: this is a plain-text code model.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Every newline is a token of its own, never merged with the next line's indent, so a prompt that
    # ends in "\n" (as HumanEval prompts do) ends on a boundary the model has seen before an indented body.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        mask_token="<|MASK|>",
        model_max_length=1_000_000,
    )


def token_stream(tokenizer, texts: list[str]) -> list[int]:
    """All `texts` tokenised and concatenated, each followed by the eos token."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        stream.append(eos)
    return stream


def is_current(out_dir: str, config: TinyCodeConfig) -> bool:
    """True when `out_dir` holds a finished build of exactly this config."""
    info = read_build_info(out_dir)
    return info is not None and info.get("build_hash") == config.build_hash()


def build_tiny_code_target(out_dir: str, config: TinyCodeConfig | dict, progress: bool = True) -> str:
    """Build the tiny code target at `out_dir` unless a build of this config is there; returns `out_dir`.

    Trains the tokenizer and the model and saves an HF directory that `AutoModelForCausalLM` /
    `AutoTokenizer` / `TargetModel.load` read, plus `build_info.json`.
    """
    if isinstance(config, dict):
        config = TinyCodeConfig.from_dict(config)
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    say = Say("tiny_code", progress)
    # Jobs started side by side wait for one build instead of repeating it.
    return build_once(out_dir, lambda: is_current(out_dir, config), lambda: _build(out_dir, config, say, progress), say)


def _build(out_dir: str, config: TinyCodeConfig, say, progress: bool) -> str:
    started = time.perf_counter()
    say(f"building tiny code target in {out_dir}: collecting stdlib functions")
    corpus = split_corpus(config)
    train_texts, heldout_texts = corpus.train_documents, corpus.heldout_documents
    say(
        f"{len(train_texts):,} train / {len(heldout_texts):,} held-out functions from {len(corpus.train_files)} / "
        f"{len(corpus.heldout_files)} stdlib files ({sum(map(len, train_texts)) / 1e6:.1f}M / "
        f"{sum(map(len, heldout_texts)) / 1e6:.2f}M chars)"
    )
    say(f"training a {config.vocab_size}-token byte-level BPE tokenizer")
    tokenizer = train_tokenizer(train_texts, config.vocab_size, progress=progress)
    train_ids = token_stream(tokenizer, train_texts)
    heldout_ids = token_stream(tokenizer, heldout_texts)
    say(f"corpus: {len(train_ids):,} train / {len(heldout_ids):,} held-out tokens")

    from dflash.toy.pretrain import pretrain

    say(f"pre-training for {config.max_steps} steps of {config.batch_size} x {config.seq_len} tokens")
    model, stats = pretrain(config, train_ids, heldout_ids, tokenizer, progress=progress)
    say(f"train loss {stats['train_loss']:.3f}, validation loss {stats['val_loss']:.3f}")
    info = {
        "build_hash": config.build_hash(),
        "config": dataclasses.asdict(config),
        "python": sys.version.split()[0],
        "corpus": {
            "train_files": len(corpus.train_files),
            "heldout_files": len(corpus.heldout_files),
            "train_documents": len(train_texts),
            "heldout_documents": len(heldout_texts),
            "train_tokens": len(train_ids),
            "heldout_tokens": len(heldout_ids),
            "chars_per_token": round(sum(map(len, train_texts)) / max(1, len(train_ids) - len(train_texts)), 3),
        },
        **stats,
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    save_atomically(out_dir, model, tokenizer, info)
    say(f"saved to {out_dir} in {info['wall_time_s']:.0f} s")
    return out_dir
