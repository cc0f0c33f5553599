"""Hydra entry points: turn config groups into dataclasses and call library functions.

Importing the package registers the apps' config schemas in Hydra's ConfigStore (`dflash.schema`);
anything else composing the app configs (the sweep driver, tests, scripts) imports `dflash.schema` first.
"""

from dflash import schema as _schema  # noqa: F401 - registers the schemas
