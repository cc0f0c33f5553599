"""Shared plumbing of the Hydra entry points: the command line checked in one pass before Hydra runs.

Every app reports a bad config or input as one line `error: <key>: <message>` on stderr, exit status 2,
no traceback. `run_app` checks, before Hydra starts (and makes a run directory): the flags, read by
Hydra's own parser; the overrides, composed once (a composition Hydra refuses names the override, key
or group option its error names; a key no schema reads is refused after); the directories the app
writes; every group built into its schema's dataclass (`dflash.schema`, whose `__post_init__` range
checks run); then the app's own checks of what needs no model (a missing `data.path`). A ConfigError
raised later, inside the Hydra task, removes the run directory Hydra made when it holds only Hydra's files.

Invariant: nothing here imports torch, Lightning or the engine, and the apps import them inside their
Hydra task, so a bad value is answered before they load.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from dflash import CONF_DIR
from dflash.errors import ConfigError, check_writable_dir, first_line, require
from dflash.layout import HYDRA_CONFIG, HYDRA_OVERRIDES, HYDRA_RUN_CONFIG
from dflash.structured import _locate, build, check_known_keys, omegaconf_error
from dflash.usage import exit_on_help

HYDRA_FILES = {HYDRA_CONFIG, HYDRA_RUN_CONFIG, HYDRA_OVERRIDES}


def fail(err: ConfigError) -> NoReturn:
    """Print `error: <key>: <message>` as one line on stderr and exit with status 2."""
    print(f"error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
    sys.exit(2)


def exits_on_config_error(task: Callable) -> Callable:
    """Make a ConfigError end a Hydra task via `fail`, removing the run directory Hydra made for it
    when it holds only Hydra's files (Hydra prints a traceback for any other exception)."""

    @functools.wraps(task)
    def wrapper(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except ConfigError as err:
            from hydra.core.hydra_config import HydraConfig

            # None when the task is called without Hydra running it (a test; the singleton may be left from an earlier run)
            run_dir = OmegaConf.select(HydraConfig.get(), "runtime.output_dir") if HydraConfig.initialized() else None
            if run_dir:
                remove_hydra_only_dir(run_dir)
            fail(err)

    return wrapper


def remove_hydra_only_dir(directory: str) -> bool:
    """Remove `directory` if it holds only Hydra's files (.hydra/*.yaml and the job's .log);
    never the working directory, nor one with any other file (a lock another job holds,
    checkpoints of an earlier start). Returns whether it was removed."""
    directory = os.path.abspath(directory)
    if directory == os.getcwd() or not os.path.isdir(directory):
        return False
    files = [os.path.relpath(os.path.join(parent, name), directory) for parent, _, names in os.walk(directory) for name in names]
    if any(name not in HYDRA_FILES and (os.sep in name or not name.endswith(".log")) for name in files):
        return False
    for name in files:
        os.remove(os.path.join(directory, name))
    for parent, _, _ in sorted(os.walk(directory), key=lambda entry: -len(entry[0])):
        os.rmdir(parent)
    return True


def run_app(
    hydra_main: Callable[[], None],
    config_name: str,
    argv: list[str] | None = None,
    output_dirs: tuple[str, ...] = (),
    check: Callable | None = None,
) -> None:
    """Check the command line (module docstring), then run `hydra_main` (a `@hydra.main` function).
    `--help` prints the app's own help (`dflash.usage`) and exits.

    output_dirs: config keys of the directories the app writes, checked in this order before
        Hydra's own (so `paths.artifacts` is named when it is the culprit, not the `hydra.run.dir`
        made from it); null values are skipped.
    check: the app's own check of its config object (its schema's dataclass) for what needs no
        model, or what needs Hydra's compose API, which cannot run inside a Hydra app.
    """
    argv = sys.argv[1:] if argv is None else argv
    exit_on_help(config_name, argv)
    try:
        cfg = check_overrides(config_name, argv)
        line = parse_command_line(config_name, argv)
        if cfg is not None and not (line.cfg or line.info):  # only printing: nothing is read or written
            check_output_dirs(cfg, output_dirs, line.multirun)
            app = app_config(cfg)
            if check is not None:
                check(app)
    except ConfigError as err:
        fail(err)
    hydra_main()


def parse_command_line(config_name: str, args: list[str]) -> argparse.Namespace:
    """`args` as Hydra's parser reads them (`hydra._internal.utils.get_args_parser`): `overrides`,
    `config_name` (this app's unless `--config-name`), `multirun`, `help`, ...; and `searchpath`, the
    `hydra.searchpath` override that stands for `--config-dir` when composing, and `left_to_hydra`, a
    flag only Hydra acts on. ConfigError naming a flag the parser refuses or a `--config-dir` that is
    no directory."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    known = sorted(option for action in parser._actions for option in action.option_strings if option.startswith("--"))
    parser.error = functools.partial(_flag_error, known)  # one line, instead of argparse's usage and exit
    line = parser.parse_args(args)
    line.config_name, line.searchpath = line.config_name or config_name, None
    line.left_to_hydra = bool(line.hydra_help or line.shell_completion or line.config_path or line.experimental_rerun)
    if line.config_dir:  # Hydra adds it to the search path; composing here, an override does
        directory = Path(line.config_dir).expanduser().resolve()
        require(directory.is_dir(), "--config-dir", f"{str(directory)!r} is not a directory")
        entries = [f"file://{directory}"]
        for arg in [arg for arg in line.overrides if arg.partition("=")[0].lstrip("+~") == "hydra.searchpath"]:
            line.overrides.remove(arg)
            entries += [str(entry) for entry in _parse_override(arg).value() or []]
        line.searchpath = "hydra.searchpath=[" + ",".join(repr(entry) for entry in entries) + "]"
    return line


def _flag_error(known: list[str], message: str) -> NoReturn:
    flag = re.match(r"argument (\S+?)[/:]", message)
    if flag:
        raise ConfigError(flag.group(1), "needs a value" if "expected one argument" in message else message.partition(": ")[2])
    unknown = message.removeprefix("unrecognized arguments: ").split() or ["command line"]
    if unknown[0].startswith("-"):
        raise ConfigError(unknown[0], f"unknown flag; flags: {known} (config values are key=value, without dashes)")
    raise ConfigError(unknown[0], "give the key=value overrides together, before or after the flags")


def _parse_override(arg: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_override(arg)
    except HydraException as err:
        raise ConfigError(arg.split("=", 1)[0], f"cannot parse override {arg!r}: {first_line(err)}") from None


def check_overrides(config_name: str, args: list[str]) -> DictConfig | None:
    """The config `config_name` composed once with the command line `args` (hydra node included; a
    sweep at its first value, every option of a sweep over a group checked), or a ConfigError naming
    the bad flag or override, also a key no schema reads (`+training.lr=1`, which would go unused).
    None for command lines left to Hydra: a flag only Hydra acts on, glob or interval sweeps."""
    from hydra.errors import HydraException

    line, first, swept = parse_command_line(config_name, args), [], {}
    for arg in line.overrides:
        override = _parse_override(arg)
        if override.is_sweep_override():
            require(line.multirun, override.get_key_element(), "sweeps over values with -m (--multirun); a list is key=[a,b]")
            try:
                values = list(override.sweep_string_iterator())
            except HydraException:
                return None
            arg, swept[override.key_or_group] = f"{override.get_key_element()}={values[0]}", values[1:]
        first.append(arg)
    if line.left_to_hydra:
        return None
    try:
        cfg = _compose(line.config_name, first, line.searchpath, swept)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - a composition Hydra refuses: one line naming the override
        raise _refusal(err, first) from None
    check_known_keys(cfg, skip=("hydra",))
    return cfg


def _compose(config_name: str, overrides: list[str], searchpath: str | None = None, swept: dict | None = None) -> DictConfig:
    """`config_name` composed as the app composes it; searchpath: the override that stands for
    `--config-dir` (`parse_command_line`); swept: group -> more options a sweep takes, checked."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import dflash.schema  # noqa: F401 - registers the apps' schemas in Hydra's ConfigStore

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=config_name):
        cfg = compose(config_name, overrides=[searchpath, *overrides] if searchpath else overrides, return_hydra_config=True)
        for group, values in (swept or {}).items():
            options = [o for o in GlobalHydra.instance().config_loader().get_group_options(group) if not o.startswith("_")]
            for value in values:
                require(not options or value in options, group, f"unknown option {value!r}; choose one of {options}")
    return cfg


def _refusal(err: Exception, overrides: list[str]) -> ConfigError:
    """The ConfigError of a composition Hydra refused: a missing group option, or the override its
    error names (`Error merging override KEY=VALUE`, `Could not override 'KEY'`), and OmegaConf's error
    under it for the full key and the reason; a group option's file at fault (`In 'experiment/mine'`)."""
    from hydra.errors import MissingConfigException

    message, cause = str(err), err.__cause__ or err.__context__
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options is not None:
        group, _, option = err.missing_cfg_file.rpartition("/")
        options = sorted(o for o in err.options if not o.startswith("_"))
        return ConfigError(group or option, f"unknown option {option!r}; choose one of {options}")
    override = next(
        (o for o in map(_parse_override, overrides) if o.input_line in message or f"'{o.key_or_group}'" in message), None
    )
    key = override.key_or_group if override is not None else "command line"
    if not isinstance(cause, OmegaConfBaseException):
        return ConfigError(key, first_line(err))
    refusal = omegaconf_error(cause)
    bad_key = refusal.key if refusal.key != "config" else key
    if override is not None and not bad_key.startswith(key):  # a list or dict assigned at once: OmegaConf names its leaf
        bad_key = key + _locate(override.value(), bad_key.rpartition(".")[2], getattr(cause, "value", None))
    in_file = re.match(r"In '([^']+)'", message)
    return ConfigError(bad_key, refusal.reason + (f" (in {in_file.group(1)}.yaml)" if in_file else ""))


def check_output_dirs(cfg: DictConfig, keys: tuple[str, ...], multirun: bool) -> None:
    """ConfigError naming the first of `keys` (then Hydra's run or sweep dir) that cannot be
    written (values that cannot be resolved before Hydra runs are left to the app). Sets Hydra's
    config, with its run directory as the job's output directory, so `${hydra:...}` resolves.

    cfg: composed with the hydra node. Hydra's directory is checked only when Hydra writes into
    it (`hydra.output_subdir` set; export and tables write nothing there).
    """
    from hydra.core.hydra_config import HydraConfig

    run_dir = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    HydraConfig.instance().set_config(cfg)
    OmegaConf.set_readonly(cfg.hydra, False)
    with open_dict(cfg.hydra):
        cfg.hydra.runtime.output_dir = OmegaConf.select(cfg, run_dir, default=None, throw_on_resolution_failure=False)
    HydraConfig.instance().set_config(cfg)
    for key in (*keys, run_dir) if cfg.hydra.output_subdir is not None else keys:
        path = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        if path is not None:  # also None where missing or not resolvable before Hydra runs
            check_writable_dir(key, str(path))


def app_config(cfg: DictConfig):
    """The app's config object (its schema's dataclass, `dflash.schema`), every group built under
    its key by `dflash.structured.build`, so every range check of the schemas runs."""
    if "hydra" in cfg:
        cfg = cfg.copy()
        with open_dict(cfg):
            del cfg["hydra"]
    return build(cfg, "")


def resolved_config(cfg: DictConfig) -> dict:
    """The whole config as a plain dict with interpolations resolved (for results files)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise omegaconf_error(err) from None


def set_cpu_threads(threads: int | None) -> None:
    """Apply config key `cpu_threads` (torch intra-op threads, >= 1 by the app's schema; None keeps torch's default)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
