"""Hydra entry points: turn config groups into dataclasses and call library functions.

The apps' config schemas are registered in Hydra's ConfigStore by importing `dflash.schema`,
which `dflash.cli.common.run_app` does once the command line asks for more than `--help`
(so `--help` answers without importing torch): anything else composing the apps' configs
(the sweep driver, tests, scripts) imports `dflash.schema` first.
"""
