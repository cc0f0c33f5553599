"""Shared plumbing of the Hydra entry points.

Every app reports a bad config or input the same way: one line
`error: <key>: <message>` on stderr and exit status 2, no traceback. That covers
`ConfigError` raised by library code, missing mandatory values, and command-line
overrides that Hydra rejects (an unknown key, in struct mode, or an unknown option of
a config group): those are checked by composing the config once before Hydra runs.
"""

from __future__ import annotations

import functools
import sys
import types
import typing
from pathlib import Path
from typing import Callable, NoReturn

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from dflash.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
EXIT_CONFIG_ERROR = 2
_MULTIRUN_FLAGS = ("-m", "--multirun")


def fail(err: ConfigError) -> NoReturn:
    """Print `error: <key>: <message>` as one line on stderr and exit with status 2."""
    message = " ".join(str(err).split())
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG_ERROR)


def exits_on_config_error(task: Callable) -> Callable:
    """Decorate a Hydra task function so that a ConfigError ends the run via `fail`.

    Hydra prints a traceback for exceptions escaping the task; `SystemExit` passes
    through it untouched.
    """

    @functools.wraps(task)
    def wrapper(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except ConfigError as err:
            fail(err)

    return wrapper


def run_app(hydra_main: Callable[[], None], config_name: str, argv: list[str] | None = None) -> None:
    """Check the command-line overrides, then run `hydra_main` (a `@hydra.main` function)."""
    try:
        check_overrides(config_name, sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        fail(err)
    hydra_main()


def to_spec(cls, node: DictConfig, group: str):
    """Dataclass `cls` from config group `node` (resolved); unknown or missing keys are ConfigErrors."""
    try:
        data = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise _omegaconf_error(err, group) from None
    from dflash.specs import spec_from_dict  # not at the top: override errors are reported before torch loads

    check_field_types(cls, data, group)
    return spec_from_dict(cls, data, group)


def resolved_config(cfg: DictConfig) -> dict:
    """The whole config as a plain dict with interpolations resolved (for results files)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise _omegaconf_error(err, "config") from None


def set_cpu_threads(threads) -> None:
    """Apply config key `cpu_threads` (torch intra-op threads; None keeps torch's default)."""
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError("cpu_threads", f"must be a positive integer or null, got {threads!r}")
    import torch

    torch.set_num_threads(threads)


def check_overrides(config_name: str, args: list[str]) -> None:
    """Compose `config_name` with the command-line overrides; ConfigError naming the bad one.

    Command lines with Hydra flags other than --multirun (--cfg, --help, --config-name,
    ...) are left to Hydra. Sweeps are checked with their first value; a sweep over a
    config group's options is checked option by option (a bad key fails for any value,
    a bad option only for itself).
    """
    if any(arg.startswith("-") and arg not in _MULTIRUN_FLAGS for arg in args):
        return
    choices = [_override_values(arg) for arg in args if arg not in _MULTIRUN_FLAGS]
    if None in choices:  # a glob or interval sweep: only Hydra can expand it
        return
    base = [values[0] for values in choices]
    if _compose_error(config_name, base) is not None:
        for count in range(1, len(base) + 1):
            err = _compose_error(config_name, base[:count])
            if err is not None:
                raise _override_error(config_name, base[: count - 1], base[count - 1], err)
    for i, values in enumerate(choices):
        others = base[:i] + base[i + 1 :]
        for value in values[1:]:
            err = _compose_error(config_name, [*others, value])
            if err is not None:
                raise _override_error(config_name, others, value, err)


def _override_values(arg: str) -> list[str] | None:
    """`arg` itself, or for a sweep its first value, plus every other value when it sweeps a
    config group; None for sweeps that cannot be enumerated here (glob, interval)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        override = OverridesParser.create().parse_override(arg)
    except HydraException as err:
        raise ConfigError(arg.split("=", 1)[0], f"cannot parse override {arg!r}: {_first_line(err)}") from None
    if not override.is_sweep_override():
        return [arg]
    try:
        values = [f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]
    except HydraException:
        return None
    return values if (CONF_DIR / override.key_or_group).is_dir() else values[:1]


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=config_name):
        return compose(config_name, overrides=overrides, return_hydra_config=True)


def _compose_error(config_name: str, overrides: list[str]) -> Exception | None:
    try:
        _compose(config_name, overrides)
    except Exception as err:  # noqa: BLE001 - any composition failure is reported, with its override
        return err
    return None


def _override_error(config_name: str, good: list[str], bad: str, err: Exception) -> ConfigError:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import MissingConfigException

    override = OverridesParser.create().parse_override(bad)
    key = override.key_or_group
    if isinstance(err, MissingConfigException) and err.options:
        options = sorted(o for o in err.options if not o.startswith("_"))
        return ConfigError(key, f"unknown option {override.value()!r}; choose one of {options}")
    if isinstance(err.__cause__, (ConfigAttributeError, ConfigKeyError)):
        parent_key, _, _ = key.rpartition(".")
        parent = OmegaConf.select(_compose(config_name, good), parent_key) if parent_key else None
        valid = f"; valid keys here: {sorted(parent.keys())}" if isinstance(parent, DictConfig) else ""
        return ConfigError(key, f"unknown config key{valid} (to add a new key, use +{bad})")
    return ConfigError(key, _first_line(err))


def check_field_types(cls, data: dict, group: str | None) -> None:
    """ConfigError for a value whose type does not fit the dataclass field (e.g. "abc" for an int).

    group: the config group holding the keys (None: top-level keys).
    """
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        if name in hints and not _fits(value, hints[name]):
            key = f"{group}.{name}" if group else name
            raise ConfigError(key, f"expected {_type_name(hints[name])}, got {value!r}")


def _fits(value, hint) -> bool:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(value, option) for option in typing.get_args(hint))
    base = typing.get_origin(hint) or hint
    if base is type(None):
        return value is None
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, base) if isinstance(base, type) else True


def _type_name(hint) -> str:
    name = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
    return name.replace("NoneType", "null")


def _omegaconf_error(err: OmegaConfBaseException, group: str) -> ConfigError:
    key = getattr(err, "full_key", None) or group
    if isinstance(err, MissingMandatoryValue):
        return ConfigError(key, "missing mandatory value; set it on the command line")
    return ConfigError(key, _first_line(err))


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
