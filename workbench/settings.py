"""The ground floor of every setting: the field helper, TOML reading, ``key=value`` overrides, building a
frozen dataclass from a nested dict (unknown keys named, values type-checked, non-finite numbers refused)
and writing one back. Imports nothing of the workbench but its errors, so every layer can use it: the
run schema (``config.py``), the training schema (``agent/train_config.py``), market specs and GPU profiles.
"""
from __future__ import annotations

import copy
import dataclasses
import tomllib
import typing
from dataclasses import field
from pathlib import Path
from typing import Any

from .errors import ConfigError


def _f(default: Any, doc: str):
    """A dataclass field with a default and a one-line doc (``doc`` metadata)."""
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for sequence defaults")
    return field(default=default, metadata={"doc": doc})


def _check_value(key: str, value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        (elem, _ellipsis) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        return tuple(_check_value(f"{key}[{i}]", v, elem) for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"config key '{key}' must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # sizes like train = 20000 may be written as numbers
        if not isinstance(value, str):
            raise ConfigError(f"config key '{key}' must be a string, got {value!r}")
        return value
    raise ConfigError(f"config key '{key}' has an unsupported type")


def build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested dict, rejecting unknown keys by name."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(f"unknown config key '{prefix}{key}'", f"known keys here: {known}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        hint, value = hints[f.name], values[f.name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{prefix}{f.name}' must be a table")
            kwargs[f.name] = build(hint, value, f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = _check_value(prefix + f.name, value, hint)
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict of a config dataclass (tuples as lists)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        out[f.name] = to_dict(v) if dataclasses.is_dataclass(v) else (list(v) if isinstance(v, tuple) else v)
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float):
        return repr(v) if v == v and abs(v) != float("inf") else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def to_toml(cfg: Any) -> str:
    """Serialise a config dataclass to TOML that :func:`load_config` reads back to an equal object."""
    d = to_dict(cfg)
    lines = [f"{k} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines.extend(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items())
    return "\n".join(lines) + "\n"


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value``; the value is read as TOML, falling back to a bare string."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not key=value", "e.g. --set splits.train=30000")
    key, raw = text.split("=", 1)
    key, raw = key.strip(), raw.strip()
    if not key:
        raise ConfigError(f"override '{text}' has no key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def merge_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides onto a nested dict (a copy)."""
    out = copy.deepcopy(values)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{text}': '{part}' is not a table")
        node[path[-1]] = value
    return out


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file with errors that name the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc


def describe(cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(key, default, doc) for every field, for ``--help-config`` and the docs."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            rows.extend(describe(hints[f.name], f"{prefix}{f.name}."))
        else:
            rows.append((prefix + f.name, f.default, f.metadata.get("doc", "")))
    return rows
