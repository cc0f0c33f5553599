"""Shared test doubles and helpers; test files import them as `helpers` (pytest puts tests/ on
sys.path: `pythonpath` in pyproject.toml). Test files never import each other: what two of
them share lives here, fixtures shared across folders in tests/conftest.py.

- helpers.decoding: proposer doubles (oracles, random drafter), flawed and lossy verifiers,
  HF greedy reference, prompts;
- helpers.stats: chi-square p-values and the target's exact sampling distribution;
- helpers.apps: the train config as the app composes it, the evaluate app in a subprocess,
  chat data files;
- helpers.training: training-module and loss-block doubles, killing and resuming a run;
- helpers.tables: synthetic sweep results on disk and fake wandb runs;
- helpers.loader_probe: a script (torch and transformers only) that loads drafter
  directories as other programs do, run under transformers 4.57 too.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root."""
