"""`python -m dflash.<app> --help` (and `dflash <app> --help`): what the app does, two examples, its
config groups with a one-line description and their options, each option with the first line of its file.

Read from the YAML files of dflash/conf alone (no schema, no torch): the `python -m dflash.<app>`
shims call `main`, which answers `--help` before importing `dflash.cli`. Internal entries
(`_schema`, `_common`, `_<app>_schema`) are not listed.
"""

from __future__ import annotations

import importlib
import re
import sys
import textwrap

import yaml

from dflash import CONF_DIR

GROUPS = {
    "paths": "where outputs go: paths.artifacts (DFLASH_ARTIFACTS), the run's directory",
    "target": "the frozen target model: a hub id or local HF directory (target.path=...)",
    "drafter": "the drafter's shape, or drafter.path=DIR of a trained one",
    "data": "training conversations or prompts: a local .jsonl, a hub dataset, a mix",
    "training": "optimizer, schedule, anchors and loss of drafter training",
    "method": "the trained drafting method: dflash, dspark, dflash2 or eagle3",
    "trainer": "devices and precision: cpu, gpu, ddp (one node, all GPUs), fsdp",
    "logger": "where metrics go: csv, tensorboard, wandb or none",
    "eval": "the evaluation after training (eval.after_train=true) and val/tau_real",
    "experiment": "a named run: every group above set at once (your own: --config-dir DIR experiment=NAME)",
    "decoding": "block size, greedy or sampled decoding, max new tokens",
    "benchmark": "the prompts an evaluation decodes",
    "ngram": "prompt lookup, when methods=[...] lists ngram",
    "eagle3": "an EAGLE-3 drafter (eagle3.path=DIR), when methods=[...] lists eagle3",
    "dflash_tree": "tree verification with the DFlash drafter, when methods=[...] lists dflash_tree",
    "dflash_lookup": "prompt lookup first, else the DFlash drafter, when methods=[...] lists dflash_lookup",
    "dspark": "a DSpark drafter of drafter.*, when methods=[...] lists dspark",
    "dflash2": "a DFlash2 drafter of drafter.*, when methods=[...] lists dflash2",
}
_EXAMPLE = re.compile(r"^#\s+((?:make \S+|python -m dflash\.\S+).*)$")
_KEY_WITH_COMMENT = re.compile(r"^([a-z_]+):.*?#\s*(.+)$")
WIDTH = 100


def main(app: str) -> None:
    """`python -m dflash.<app>`: its help when the command line asks for it, else `dflash.cli.<app>.main()`
    (imported only then: the help answers without importing the apps' dependencies)."""
    exit_on_help(app)
    importlib.import_module(f"dflash.cli.{app}").main()


def exit_on_help(app: str, argv: list[str] | None = None) -> None:
    """Print the app's help and exit 0 when the command line asks for it (`--help`, `-h`)."""
    args = sys.argv[1:] if argv is None else argv
    if "--help" in args or "-h" in args:
        print(app_help(app))
        sys.exit(0)


def app_help(app: str) -> str:
    """The help text of the app whose primary config is dflash/conf/`app`.yaml."""
    text = (CONF_DIR / f"{app}.yaml").read_text()
    header = _header(text)
    about = " ".join(line for line in header if not _EXAMPLE.match(f"# {line}") and not line.startswith(" "))
    examples = [m.group(1).split("  #")[0].rstrip() for line in text.splitlines() if (m := _EXAMPLE.match(line))][:2]
    lines = [f"python -m dflash.{app} [key=value ...]", "", *textwrap.wrap(_first_sentences(about, 2), WIDTH), ""]
    groups = _groups(app, yaml.safe_load(text) or {})
    if groups:
        lines.append("Config groups (pick an option with group=OPTION, set one key with group.key=value):")
        for group, default in groups:
            lines.append(f"  {group:<13} {GROUPS.get(group, '')}")
            for option, description in _options(group):
                mark = "*" if option == default else " "
                lines.append(_clip(f"      {mark} {option:<22} {description}"))
    keys = [(key, comment) for key, comment in _top_level_keys(text) if key not in dict(groups)]
    if keys:
        lines += ["", "Keys (key=value):"]
        lines += [_clip(f"  {key:<22} {comment}") for key, comment in keys]
    lines += ["", "Examples:", *(f"  {example}" for example in examples)]
    lines += [
        "",
        "More: --cfg job prints the composed config; --config-dir DIR adds your own config files;",
        "-m sweeps (key=a,b); --hydra-help is Hydra's own help. (* marks the default option.)",
    ]
    return "\n".join(lines)


def _header(text: str) -> list[str]:
    """The comment lines before the first YAML line, without their `#`."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].removeprefix(" ") if not line.startswith("#  ") else line[1:])
    return lines


def _groups(app: str, config: dict) -> list[tuple[str, str | None]]:
    """(group, default option) of the app's defaults list, internal entries left out."""
    groups = []
    for entry in config.get("defaults") or []:
        if not isinstance(entry, dict):
            continue
        for name, option in entry.items():
            group = name.removeprefix("optional ").strip()
            if group.startswith(("override", "hydra", "_")) or not (CONF_DIR / group).is_dir():
                continue
            groups.append((group, option))
    return groups


def _options(group: str) -> list[tuple[str, str]]:
    return [
        (path.stem, _first_sentences(" ".join(_description(path)), 1))
        for path in sorted((CONF_DIR / group).glob("*.yaml"))
        if not path.name.startswith("_")
    ]


def _description(path) -> list[str]:
    """The comment lines that open an option file (after `# @package`), up to the first example."""
    lines = [line for line in _header(path.read_text()) if not line.startswith("@package")]
    out = []
    for line in lines:
        if _EXAMPLE.match(f"# {line.strip()}") or line.startswith(" "):
            break
        out.append(line)
    return out[:3]


def _top_level_keys(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for line in text.splitlines() if (m := _KEY_WITH_COMMENT.match(line))]


def _first_sentences(text: str, count: int) -> str:
    parts = re.split(r"(?<=[.;])(?<!al\.)\s+", text.strip())
    return " ".join(parts[:count]).rstrip(":;")


def _clip(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 3].rstrip() + "..."
