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
from typing import get_origin

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    ConfigTypeError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

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
        raise ConfigError(full_key(prefix, err.key), err.reason) from None


def full_key(prefix: str, key: str) -> str:
    """`prefix.key` (`prefix[0]` for a list index); a key already under `prefix` stays
    (a nested node built first names its own full key)."""
    if key == prefix or key.startswith(prefix + ".") or key.startswith(prefix + "["):
        return key
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
            raise ConfigError(child_key, unknown_key(fields))
        check_known_keys(node._get_node(name), child_key)


def typed(cls, data: dict, key: str):
    """Dataclass `cls` from a plain dict through its OmegaConf schema (unknown keys and
    wrong types are ConfigErrors naming `key.<field>`), for configs that are not a group of
    an app (e.g. a `target.build` block)."""
    try:
        node = OmegaConf.merge(OmegaConf.structured(cls), data)
    except OmegaConfBaseException as err:
        name, reason = getattr(err, "full_key", None) or "", _reason(err)
        if name and "." not in name and "[" not in name and name not in data:  # a leaf inside a list: find it
            name = _locate(data, name, getattr(err, "value", None)).lstrip(".") or name
        raise ConfigError(full_key(key, name) if key else name or "config", reason) from None
    return build(node, key)


def omegaconf_error(err: OmegaConfBaseException, prefix: str = "") -> ConfigError:
    """The one translation of an OmegaConf error: a ConfigError naming the full key (under
    `prefix` when the node was made outside the app's config), with the reason in the
    project's words, read from the error's nodes, not from OmegaConf's English:
    `expected int, got 'abc'`, `unknown key: ...; valid keys here: [...]`, `missing mandatory value ...`."""
    key = getattr(err, "full_key", None) or ""
    return ConfigError(full_key(prefix, key) if prefix and key else key or prefix or "config", _reason(err))


def _reason(err: OmegaConfBaseException) -> str:
    if isinstance(err, MissingMandatoryValue):
        return "missing mandatory value; set it on the command line"
    owner = getattr(err, "object_type", None)
    if isinstance(err, (ConfigAttributeError, ConfigKeyError)):
        if dataclasses.is_dataclass(owner):
            return unknown_key(f.name for f in dataclasses.fields(owner))
        return "unknown key; to add one, prefix the override with +"
    if isinstance(err, (ValidationError, ConfigTypeError)):
        child, parent = getattr(err, "child_node", None), getattr(err, "parent_node", None)
        hint = child._metadata.ref_type if child is not None else getattr(getattr(parent, "_metadata", None), "element_type", None)
        expected = _EXPECTED.get(get_origin(hint) or hint)
        if expected is not None:
            value = getattr(err, "value", None)
            return f"expected {expected}, got {value!r}" if value is not None else f"expected {expected}"
    return first_line(err)


def unknown_key(fields) -> str:
    return f"unknown key: no setting reads it; valid keys here: {sorted(fields)}"


_EXPECTED = {int: "int", float: "float", bool: "bool", str: "str", list: "a list", tuple: "a list", dict: "a mapping"}


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
