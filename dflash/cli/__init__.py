"""Hydra entry points: turn config groups into dataclasses and call library functions.

Importing the package registers the apps' config schemas in Hydra's ConfigStore
(`dflash.cli.schema`), which dflash/conf/train.yaml, evaluate.yaml and regenerate.yaml
start from: anything composing them (apps, tests, scripts) imports `dflash.cli` first.
"""

from dflash.cli import schema as _schema  # noqa: F401 - registers the schemas
