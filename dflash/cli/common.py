"""Shared plumbing of the Hydra entry points.

Every app reports a bad config or input as one line `error: <key>: <message>` on stderr, exit status 2,
no traceback: a `ConfigError` from library code (a run directory Hydra made for a refused start is
removed again when it holds only Hydra's files), a missing mandatory value, an override Hydra rejects
(an unknown key, or an unknown option of a config group) or would silently skip (an unknown option of
an optional group such as `experiment`), an output directory that cannot be written. The command line
is checked by composing the config once before Hydra runs (`run_app`). A damaged user file becomes a
ConfigError at its loader (`dflash.errors.reading`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from dflash import CONF_DIR
from dflash.errors import ConfigError, check_writable_dir, first_line, require
from dflash.structured import _locate, check_known_keys, omegaconf_error

EXIT_CONFIG_ERROR = 2
LIGHTNING_TIP_PREFIX = "💡 Tip:"  # Lightning's advertisements for its cloud services


def fail(err: ConfigError) -> NoReturn:
    """Print `error: <key>: <message>` as one line on stderr and exit with status 2."""
    message = " ".join(str(err).split())
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG_ERROR)


def exits_on_config_error(task: Callable) -> Callable:
    """Make a ConfigError end a Hydra task via `fail` (Hydra prints a traceback for any other
    exception escaping the task; `SystemExit` passes through it untouched)."""

    @functools.wraps(task)
    def wrapper(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except ConfigError as err:
            remove_refused_run_dir()
            fail(err)

    return wrapper


HYDRA_FILES = {os.path.join(".hydra", name) for name in ("config.yaml", "hydra.yaml", "overrides.yaml")}


def remove_refused_run_dir() -> None:
    """After a ConfigError inside a Hydra task: remove the run directory Hydra made for it when it holds
    only Hydra's own files, so a refused start leaves nothing `python -m dflash.tables` counts as a run."""
    from hydra.core.hydra_config import HydraConfig

    try:
        directory = HydraConfig.get().runtime.output_dir
    except (ValueError, OmegaConfBaseException):  # not inside a Hydra app (tests calling the task)
        return
    remove_hydra_only_dir(directory)


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
    check: Callable[[DictConfig], None] | None = None,
) -> None:
    """Check the command line, then run `hydra_main` (a `@hydra.main` function).

    `--help` prints the app's own help (`dflash.usage`) and exits. Checked before Hydra starts (and
    creates its run directory): the flags and overrides (`check_overrides`), that the directories the
    app writes are writable, then `check`.
    output_dirs: config keys of the directories the app writes, checked in this order
        before Hydra's own (so `paths.artifacts` is named when it is the culprit, not the
        `hydra.run.dir` made from it); null values are skipped.
    check: the app's own check of the composed config, for what needs Hydra's compose API
        (which cannot run inside a Hydra app), e.g. the demo's overrides for the train app.
    """
    args = sys.argv[1:] if argv is None else argv
    try:
        line = parse_command_line(config_name, args)
        if line.help:
            from dflash.usage import exit_on_help

            exit_on_help(config_name, ["--help"])
        cfg = check_overrides(config_name, args)
        if cfg is not None:
            check_output_dirs(cfg, output_dirs, multirun=line.multirun)
            if check is not None:
                check(cfg)
    except ConfigError as err:
        fail(err)
    hydra_main()


@dataclasses.dataclass
class CommandLine:
    """A Hydra app's command line, read as Hydra reads it (`hydra._internal.utils.get_args_parser`).

    overrides: the `key=value` arguments. config_name: `--config-name` or the app's own.
    searchpath: the `hydra.searchpath=[...]` override that composing needs for `--config-dir`
        (None: no extra search path from flags).
    config_dirs: every directory whose groups the config is composed from: dflash/conf,
        `--config-dir`, then the `file://` and `pkg://` entries of `hydra.searchpath`.
    help: `--help` / `-h`. left_to_hydra: a flag only Hydra acts on (`_HYDRA_ONLY`).
    """

    overrides: list[str]
    config_name: str
    searchpath: str | None = None
    config_dirs: list[Path] = dataclasses.field(default_factory=list)
    multirun: bool = False
    help: bool = False
    left_to_hydra: bool = False


# Hydra's flags: those that take a value, those that do not, and those only Hydra acts on.
_VALUE_FLAGS = {"--config-dir": "-cd", "--config-name": "-cn", "--config-path": "-cp", "--cfg": "-c", "--package": "-p"}
_SWITCHES = {"--multirun": "-m", "--run": "-r", "--resolve": None, "--help": "-h"}
_HYDRA_ONLY = {"--hydra-help", "--version", "--shell-completion", "-sc", "--config-path", "-cp", "--experimental-rerun"}
_INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def parse_command_line(config_name: str, args: list[str]) -> CommandLine:
    """The flags and overrides of `args`; ConfigError naming an unknown flag, a flag without
    its value or a `--config-dir` that is no directory."""
    short = {alias: flag for flags in (_VALUE_FLAGS, _SWITCHES) for flag, alias in flags.items() if alias}
    line, values, i = CommandLine(overrides=[], config_name=config_name), {}, 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            line.overrides.append(arg)
            continue
        flag, has_value, value = arg.partition("=")
        flag = short.get(flag, flag)
        if flag in ("--info", "-i"):  # its value is optional
            i += 1 if not has_value and i < len(args) and args[i] in _INFO_CHOICES else 0
            continue
        if flag in _HYDRA_ONLY:
            line.left_to_hydra = True
            continue
        if flag in _VALUE_FLAGS:
            if not has_value:
                if i >= len(args):
                    raise ConfigError(flag, "needs a value")
                value, i = args[i], i + 1
            values[flag] = value
            continue
        if flag not in _SWITCHES or has_value:
            known = sorted({*_VALUE_FLAGS, *_SWITCHES, *_HYDRA_ONLY, "--info"} - {"-sc", "-cp"})
            raise ConfigError(arg, f"unknown flag; flags: {known} (config values are key=value, without dashes)")
        line.multirun = line.multirun or flag == "--multirun"
        line.help = line.help or flag == "--help"
    line.config_name = values.get("--config-name", config_name)
    line.config_dirs = [CONF_DIR]
    entries = []
    if "--config-dir" in values:
        directory = Path(values["--config-dir"]).expanduser().resolve()
        if not directory.is_dir():
            raise ConfigError("--config-dir", f"{str(directory)!r} is not a directory")
        line.config_dirs.append(directory)
        entries.append(f"file://{directory}")
    for arg in line.overrides:
        if arg.partition("=")[0].lstrip("+~") == "hydra.searchpath":
            listed = _parse_override(arg).value()
            entries += [str(entry) for entry in listed] if isinstance(listed, list) else []
    line.config_dirs += [d for d in map(_search_dir, entries[1:] if "--config-dir" in values else entries) if d is not None]
    if "--config-dir" in values:
        line.overrides = [arg for arg in line.overrides if arg.partition("=")[0].lstrip("+~") != "hydra.searchpath"]
        line.searchpath = "hydra.searchpath=[" + ",".join(repr(entry) for entry in entries) + "]"
    return line


def _parse_override(arg: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_override(arg)
    except HydraException as err:
        raise ConfigError(arg.split("=", 1)[0], f"cannot parse override {arg!r}: {first_line(err)}") from None


def _search_dir(entry: str) -> Path | None:
    """The directory of a search path entry (`file://DIR`, `pkg://PACKAGE`); None for others."""
    if entry.startswith("file://"):
        return Path(entry.removeprefix("file://")).expanduser().resolve()
    if entry.startswith("pkg://"):
        import importlib.util

        spec = importlib.util.find_spec(entry.removeprefix("pkg://").replace("/", "."))
        if spec is not None and spec.submodule_search_locations:
            return Path(next(iter(spec.submodule_search_locations)))
    return None


def check_output_dirs(cfg: DictConfig, keys: tuple[str, ...], multirun: bool) -> None:
    """ConfigError naming the first of `keys` (then Hydra's run or sweep dir) that cannot be
    written. Values that cannot be resolved before Hydra runs are left to the app.

    cfg: composed with `return_hydra_config=True`. Hydra's directory is checked only when
    Hydra writes into it (`hydra.output_subdir` set; export and tables write nothing there).
    """
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)  # resolves ${hydra:...} in paths and run names
    if cfg.hydra.output_subdir is not None:
        keys = (*keys, "hydra.sweep.dir" if multirun else "hydra.run.dir")
    for key in keys:
        try:
            path = OmegaConf.select(cfg, key, throw_on_missing=True)
        except OmegaConfBaseException:
            continue
        if path is not None:
            check_writable_dir(key, str(path))


def quiet_third_party_logs() -> None:
    """Print each Lightning log line once, and without its advertisements.

    On import, `lightning` attaches its own console handler to the `lightning` logger, which also
    propagates to the root logger Hydra's job_logging set up: every line would print twice. Inside a
    Hydra app that handler goes, so lines come only through Hydra's handlers (console and the run's
    .log file). Dropped: Lightning's "💡 Tip: ... try installing litlogger/litmodels" lines; the
    deprecation warning Lightning's own code triggers in torch's pytree (nothing a user can fix);
    under DDP or FSDP, its advice to log `val/...` (and the `val_...` copies checkpoint file names
    use) with `sync_dist=True`: the validation metrics are summed over ranks before dividing
    (`dflash.training.metrics`) and `val/tau_real` is rank 0's value broadcast, so every rank logs
    the global value already.
    """
    import logging
    import warnings

    import lightning  # noqa: F401 - attaches the handler that is removed below

    if logging.getLogger().hasHandlers():
        lightning_logger = logging.getLogger("lightning")
        for handler in list(lightning_logger.handlers):
            if type(handler) is logging.StreamHandler:
                lightning_logger.removeHandler(handler)
    tips = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _drop_lightning_tips not in tips.filters:
        tips.addFilter(_drop_lightning_tips)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self\.log\('val[/_].*sync_dist=True")


def _drop_lightning_tips(record) -> bool:
    return not str(record.msg).startswith(LIGHTNING_TIP_PREFIX)


def resolved_config(cfg: DictConfig) -> dict:
    """The whole config as a plain dict with interpolations resolved (for results files)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise omegaconf_error(err) from None


def set_cpu_threads(threads) -> None:
    """Apply config key `cpu_threads` (torch intra-op threads, an int or None; None keeps torch's default)."""
    if threads is not None:
        require(threads >= 1, "cpu_threads", f"must be a positive integer or null, got {threads!r}")
        import torch

        torch.set_num_threads(threads)


def check_overrides(config_name: str, args: list[str]) -> DictConfig | None:
    """Compose `config_name` with the command line; ConfigError naming the bad override.

    args: the whole command line, Hydra's flags and the overrides (`parse_command_line`). Returns the
    composed config (hydra node included; sweeps at their first value), or None for command lines left
    to Hydra: a flag only Hydra acts on (`--hydra-help`, `--config-path`, ...), glob or interval sweeps.
    A sweep over a config group's options is checked option by option (a bad key fails for any value, a
    bad option only for itself). Also errors: an unknown option of an optional group (`experiment=nope`,
    which Hydra would silently skip) and a key no schema reads (`+training.lr=1`, which would go unused).
    """
    import dflash.schema  # noqa: F401 - registers the apps' schemas, which their configs start from

    line = parse_command_line(config_name, args)
    if line.left_to_hydra:
        return None
    compose = functools.partial(_compose, line.config_name, searchpath=line.searchpath)
    choices = [_override_values(arg, line.config_dirs) for arg in line.overrides]
    if None in choices:  # a glob or interval sweep: only Hydra can expand it
        return None
    base = [values[0] for values in choices]
    try:
        cfg = compose(base)
    except Exception as failed:  # noqa: BLE001 - the first override that breaks composition is named below
        if len(base) == 1:  # that one override (composing it again would fail the same way)
            raise _override_error(compose, [], base[0], failed, line.config_dirs) from None
        for count in range(1, len(base) + 1):
            err = _compose_error(compose, base[:count])
            if err is not None:
                raise _override_error(compose, base[: count - 1], base[count - 1], err, line.config_dirs) from None
        raise  # no overrides: the shipped config itself does not compose, a bug
    check_known_keys(cfg, skip=("hydra",))
    for i, values in enumerate(choices):
        others = base[:i] + base[i + 1 :]
        for value in values[1:]:
            err = _compose_error(compose, [*others, value])
            if err is not None:
                raise _override_error(compose, others, value, err, line.config_dirs)
    return cfg


def _override_values(arg: str, config_dirs: list[Path]) -> list[str] | None:
    """`arg` itself, or for a sweep its first value, plus every other value when it sweeps a
    config group; None for sweeps that cannot be enumerated here (glob, interval)."""
    from hydra.errors import HydraException

    override = _parse_override(arg)
    if override.is_sweep_override():
        try:
            options = list(override.sweep_string_iterator())
        except HydraException:
            return None
        values = [f"{override.get_key_element()}={option}" for option in options]
    else:
        options, values = [override.value()], [arg]
    group = override.key_or_group
    if group.startswith("hydra") or not any((directory / group).is_dir() for directory in config_dirs):
        return values[:1]  # a value, or one of Hydra's own groups (their options live outside these dirs)
    for option in options:
        _check_group_option(group, config_dirs, option)
    return values


def _check_group_option(group: str, config_dirs: list[Path], option) -> None:
    """ConfigError listing the options of `group` unless `option` is one of them (or null)."""
    if option in (None, "null") or not isinstance(option, str):
        return
    if any((directory / group / f"{option}.yaml").is_file() for directory in config_dirs):
        return
    options = sorted({p.stem for d in config_dirs for p in (d / group).glob("*.yaml") if not p.name.startswith("_")})
    raise ConfigError(group, f"unknown option {option!r}; choose one of {options}")


def _compose(config_name: str, overrides: list[str], searchpath: str | None = None) -> DictConfig:
    """`config_name` composed as the app composes it; searchpath: the `hydra.searchpath`
    override that stands for `--config-dir` (`parse_command_line`)."""
    from hydra import compose, initialize_config_dir

    import dflash.schema  # noqa: F401 - registers the apps' schemas in Hydra's ConfigStore

    overrides = [searchpath, *overrides] if searchpath else overrides
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=config_name):
        return compose(config_name, overrides=overrides, return_hydra_config=True)


def _compose_error(compose: Callable[[list[str]], DictConfig], overrides: list[str]) -> Exception | None:
    try:
        compose(overrides)
    except Exception as err:  # noqa: BLE001 - any composition failure is reported, with its override
        return err
    return None


def _override_error(
    compose: Callable[[list[str]], DictConfig], good: list[str], bad: str, err: Exception, config_dirs: list[Path]
) -> ConfigError:
    from hydra.errors import MissingConfigException

    override = _parse_override(bad)
    key = override.key_or_group
    if isinstance(err, MissingConfigException) and err.options:
        options = sorted(o for o in err.options if not o.startswith("_"))
        return ConfigError(key, f"unknown option {override.value()!r}; choose one of {options}")
    cause = err.__cause__ or err.__context__
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and (getattr(cause, "full_key", None) or key) == key:
        parent_key, _, _ = key.rpartition(".")
        parent = OmegaConf.select(compose(good), parent_key) if parent_key else None
        valid = f"; valid keys here: {sorted(parent.keys())}" if isinstance(parent, DictConfig) else ""
        if isinstance(parent, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(parent)):
            return ConfigError(key, f"unknown config key{valid}")  # no schema reads a key added with +
        return ConfigError(key, f"unknown config key{valid} (to add a new key, use +{bad})")
    if isinstance(cause, OmegaConfBaseException):  # a wrong type or an unknown key, here or in a group option's file
        bad_key, reason = getattr(cause, "full_key", None) or "", omegaconf_error(cause).reason
        if not bad_key.startswith(key) and not any((d / key.split("@")[0]).is_dir() for d in config_dirs):
            # a list or dict assigned at once: OmegaConf names only the leaf inside it
            path = _locate(override.value(), bad_key.rpartition(".")[2], getattr(cause, "value", None))
            bad_key = key + path
        if reason.startswith("expected") and ", got " not in reason:
            reason = f"{reason}, got {override.value()!r}"
        if bad_key and not bad_key.startswith(key) and isinstance(override.value(), str):
            reason = f"{reason} (in {key.split('@')[0]}/{override.value()}.yaml)"  # a group option's file is wrong
        return ConfigError(bad_key or key, reason)
    return ConfigError(key, first_line(err))
