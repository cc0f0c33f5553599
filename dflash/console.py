"""The `dflash` console script: `dflash <command> [args]` runs `python -m dflash.<command>
[args]` in this process (same flags, same config, same exit status).

Commands are modules found by name and imported only when run: `dflash --help` imports
nothing else, and a command whose module is absent is one error line. Lightning's DDP
launcher re-runs the command as `python -m dflash.<command>` (runpy puts the module in
`__main__`), so multi-GPU runs started here work as they do from `python -m`.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys

COMMANDS = {
    "train": "train a drafter (dflash/conf/train.yaml)",
    "evaluate": "measure tau and speed-up of drafters against the target",
    "regenerate": "answer training prompts with the target itself",
    "export": "write a checkpoint's drafter directory, with its model card",
    "sweep": "run an ablation sweep (dflash/conf/sweep/)",
    "tables": "tables and figures from result directories or wandb",
    "demo": "the offline end-to-end demo on SmolLM2-135M (CPU)",
    "bench": "speed benchmarks of the decoding engine",
}


def usage() -> str:
    lines = ["usage: dflash <command> [key=value ...]   (`dflash <command> --help` for its options)", "", "commands:"]
    lines += [f"  {name:<11} {about}" for name, about in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0 if args else 2)
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"error: command: unknown {command!r}; choose one of {list(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    module = f"dflash.{command}"
    if importlib.util.find_spec(module) is None:
        print(f"error: command: {command!r} needs the module {module}, which this install does not have", file=sys.stderr)
        sys.exit(2)
    sys.argv = [sys.argv[0], *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
