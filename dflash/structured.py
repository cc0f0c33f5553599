"""Plain config nodes and dicts into the library's dataclasses, through OmegaConf's
schema checks, with every error one `ConfigError` naming the full key.

The one adapter between library checks and user keys: a dataclass's `__post_init__`
names the field (`require(..., "num_layers", ...)`), and `build` / `config_key` put the
group in front (`drafter.num_layers`). Used by the entry points (`dflash.schema`)
and by library code that takes a free-form block of a config (e.g. `target.build`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from dflash.errors import ConfigError, first_line


@contextlib.contextmanager
def config_key(prefix: str):
    """Prefix the key of a `ConfigError` raised in the block with `prefix.` (the adapter
    between library checks, which name a field, and the user's full config key)."""
    try:
        yield
    except ConfigError as err:
        if not prefix:
            raise
        raise ConfigError(full_key(prefix, err.key), str(err)[len(err.key) + 2 :]) from None


def full_key(prefix: str, key: str) -> str:
    """`prefix.key`; a key that already starts with the group's own name (`decoding.top_p`, as
    checks outside the schemas still write it) is re-rooted under `prefix` (`eval.decoding.top_p`)."""
    if key == prefix or key.startswith(prefix + ".") or key.startswith(prefix + "["):
        return key
    group = prefix.rpartition(".")[2]
    if key == group:
        return prefix
    if key.startswith(group + ".") or key.startswith(group + "["):
        key = key[len(group) :].lstrip(".")
    return f"{prefix}{key}" if key.startswith("[") else f"{prefix}.{key}"


def build(node: DictConfig | ListConfig, key: str):
    """The object of config node `node` at full key `key` (`OmegaConf.to_object`): a
    dataclass for a typed group, plain containers otherwise. Nested typed nodes are built
    first under their own keys, so a range check names e.g. `eval.decoding.top_p`; missing
    values and failed interpolations name their key too."""
    if isinstance(node, DictConfig) and not node._is_none() and not node._is_missing():
        for name in node.keys():
            child = node._get_node(name)
            if isinstance(child, (DictConfig, ListConfig)):
                build(child, f"{key}.{name}" if key else str(name))
    elif isinstance(node, ListConfig) and not node._is_none() and not node._is_missing():
        for index in range(len(node)):
            child = node._get_node(index)
            if isinstance(child, (DictConfig, ListConfig)):
                build(child, f"{key}[{index}]")
    check_known_keys(node, key)
    missing = sorted(OmegaConf.missing_keys(node))
    if missing:  # to_object would quietly use the dataclass default
        raise ConfigError(full_key(key, missing[0]) if key else missing[0], "missing mandatory value; set it on the command line")
    with config_key(key):
        try:
            return OmegaConf.to_object(node)
        except OmegaConfBaseException as err:
            raise omegaconf_error(err, key) from None


def check_known_keys(node: DictConfig, key: str = "", skip: tuple[str, ...] = ()) -> None:
    """ConfigError naming the first key of `node` (recursively) that its schema has no field
    for. Composition refuses such keys, except those added with `+key=value`: OmegaConf
    stores them, then `OmegaConf.to_object` drops them, so the run would go on without them.
    skip: top-level keys not checked (`hydra`)."""
    if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
        return
    schema = OmegaConf.get_type(node)
    fields = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    for name in node.keys():
        if name in skip:
            continue
        child_key = f"{key}.{name}" if key else str(name)
        if fields is not None and name not in fields:
            raise ConfigError(child_key, f"unknown key: no setting reads it; valid keys here: {sorted(fields)}")
        check_known_keys(node._get_node(name), child_key)


def typed(cls, data: dict, key: str):
    """Dataclass `cls` from a plain dict through its OmegaConf schema (unknown keys and
    wrong types are ConfigErrors naming `key.<field>`), for configs that are not a group of
    an app (e.g. a `target.build` block)."""
    try:
        node = OmegaConf.merge(OmegaConf.structured(cls), data)
    except OmegaConfBaseException as err:
        name, reason = describe_omegaconf_error(err)
        if name and "." not in name and "[" not in name and name not in data:  # a leaf inside a list: find it
            name = _locate(data, name, getattr(err, "value", None)).lstrip(".") or name
        raise ConfigError(full_key(key, name) if key else name or "config", reason) from None
    return build(node, key)


def check_arguments(function, data: dict, key: str) -> None:
    """ConfigError naming `key.<name>` unless `data` fits the keyword arguments of `function`
    (names and annotated types): a config block passed to a function as keywords."""
    import inspect

    fields = [
        (
            name,
            Any if param.annotation is inspect.Parameter.empty else _resolve(param.annotation, function),
            MISSING if param.default is inspect.Parameter.empty else param.default,
        )
        for name, param in inspect.signature(function).parameters.items()
        if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
    ]
    typed(dataclasses.make_dataclass(f"{function.__name__}_arguments", fields), data, key)


def _resolve(hint, function):
    """An annotation that `from __future__ import annotations` left as a string, evaluated."""
    return eval(hint, function.__globals__) if isinstance(hint, str) else hint  # noqa: S307 - the function's own annotation


def omegaconf_error(err: OmegaConfBaseException, prefix: str = "") -> ConfigError:
    """One-line ConfigError for an OmegaConf error: the full key (prefixed with `prefix`
    when the node was made outside the app's config) and the reason."""
    key, reason = describe_omegaconf_error(err)
    if prefix and key and not key.startswith(prefix + ".") and key != prefix:
        key = f"{prefix}.{key}" if not key.startswith("[") else f"{prefix}{key}"
    return ConfigError(key or prefix or "config", reason)


def describe_omegaconf_error(err: OmegaConfBaseException) -> tuple[str, str]:
    """(full key, reason) of an OmegaConf error, the reason in the project's words:
    `expected int, got 'abc'`, `unknown key; valid keys: [...]`, `missing mandatory value ...`."""
    from omegaconf.errors import ConfigTypeError, ValidationError

    key = getattr(err, "full_key", None) or ""
    message = first_line(err)
    if isinstance(err, MissingMandatoryValue):
        return key, "missing mandatory value; set it on the command line"
    if isinstance(err, (ConfigAttributeError, ConfigKeyError)):
        object_type = getattr(err, "object_type", None)
        if dataclasses.is_dataclass(object_type):
            return key, f"unknown key; valid keys: {sorted(f.name for f in dataclasses.fields(object_type))}"
        return key, message
    if isinstance(err, (ValidationError, ConfigTypeError)):
        for pattern, expected in _EXPECTED:
            if pattern in message:
                value = getattr(err, "value", None)
                return key, f"expected {expected}, got {value!r}" if value is not None else f"expected {expected}"
    return key, message


_EXPECTED = (  # OmegaConf's validation messages -> the type the key needs
    ("converted to Integer", "int"),
    ("converted to Float", "float"),
    ("valid bool", "bool"),
    ("to string", "str"),
    ("ListConfig", "a list"),
    ("to Dict", "a mapping"),
    ("DictConfig", "a mapping"),
)


def _locate(value, leaf: str, bad) -> str:
    """Path from an override's value (a list or dict) to the entry `leaf` holding `bad`, e.g.
    `[0].limit` (OmegaConf names only the leaf of a container assigned at once)."""
    if isinstance(value, dict):
        for name, item in value.items():
            if name == leaf and (bad is None or item == bad):
                return f".{name}"
            found = _locate(item, leaf, bad) if isinstance(item, (dict, list)) else None
            if found:
                return f".{name}{found}"
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _locate(item, leaf, bad) if isinstance(item, (dict, list)) else None
            if found:
                return f"[{index}]{found}"
    return ""
