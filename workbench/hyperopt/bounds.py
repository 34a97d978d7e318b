"""Search bounds from TOML (``config/training/dqn-hyperopt.toml``): one table per parameter.

Each ``[bounds.NAME]`` has ``type`` (float | int | choice), and ``low``/``high`` with ``scale``
(linear | log) for numbers, or ``values`` for a choice. NAME is a key of ``[training]`` (see
``config/training/dqn.toml``) or a size of the GPU profile (hidden, atoms, batch, n_envs; applied
through the run's ``[gpu]`` table). Every parameter is searched on the unit interval: numbers map
linearly or logarithmically onto [low, high] (ints rounded), choices map to equal-width slots.
Adjusting a range never needs a code change; unknown keys are errors that name the key.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from ..agent.train_config import TrainConfig
from ..config import GpuOverrides
from ..settings import read_toml
from ..errors import ConfigError
from ..resources import config_file

TRAINING_KEYS = {f.name for f in dataclasses.fields(TrainConfig)}
GPU_KEYS = {f.name for f in dataclasses.fields(GpuOverrides)}  # sizes: searched through the run's [gpu] table


@dataclass(frozen=True)
class Bound:
    name: str
    type: str
    low: float = 0.0
    high: float = 0.0
    scale: str = "linear"
    values: tuple = ()

    def decode(self, u: float):
        """Unit-interval coordinate -> parameter value."""
        u = min(max(float(u), 0.0), 1.0)
        if self.type == "choice":
            return self.values[min(int(u * len(self.values)), len(self.values) - 1)]
        if self.scale == "log":
            x = math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        else:
            x = self.low + u * (self.high - self.low)
        return int(round(x)) if self.type == "int" else x

    def encode(self, value) -> float:
        if self.type == "choice":
            return (self.values.index(value) + 0.5) / len(self.values)
        if self.scale == "log":
            return (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        return (value - self.low) / (self.high - self.low) if self.high > self.low else 0.5


def _bound(name: str, spec: dict, source: str) -> Bound:
    where = f"{source}: bounds.{name}"
    if name not in TRAINING_KEYS | GPU_KEYS:
        raise ConfigError(f"{where}: unknown parameter '{name}'",
                          "bounds name keys of [training] (dqn.toml) or the sizes hidden, atoms, batch, n_envs")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a table")
    known = {"type", "low", "high", "scale", "values"}
    for key in spec:
        if key not in known:
            raise ConfigError(f"{where}: unknown key '{key}'", f"known keys: {', '.join(sorted(known))}")
    kind = spec.get("type", "float")
    if kind == "choice":
        values = spec.get("values")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: a choice needs a non-empty 'values' list")
        return Bound(name, "choice", values=tuple(values))
    if kind not in ("float", "int"):
        raise ConfigError(f"{where}: type must be float, int or choice, got {kind!r}")
    for key in ("low", "high"):
        if not isinstance(spec.get(key), (int, float)) or isinstance(spec.get(key), bool):
            raise ConfigError(f"{where}: '{key}' must be a number")
    low, high, scale = float(spec["low"]), float(spec["high"]), spec.get("scale", "linear")
    if scale not in ("linear", "log"):
        raise ConfigError(f"{where}: scale must be linear or log, got {scale!r}")
    if not low < high:
        raise ConfigError(f"{where}: low ({low}) must be below high ({high})")
    if scale == "log" and low <= 0:
        raise ConfigError(f"{where}: a log scale needs low > 0")
    return Bound(name, kind, low, high, scale)


@dataclass(frozen=True)
class SwarmSettings:
    particles: int = 8
    inertia: float = 0.7
    cognitive: float = 1.5
    social: float = 1.5
    seed: int = 0
    boundary: str = "reflect"
    folds: tuple[int, ...] = ()


class HyperoptProfile:
    """Bounds and swarm settings of one TOML file."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else config_file("training", "dqn-hyperopt.toml")
        raw = read_toml(self.path)
        for key in raw:
            if key not in ("swarm", "bounds"):
                raise ConfigError(f"{self.path}: unknown table '{key}'", "expected [swarm] and [bounds.*]")
        swarm = raw.get("swarm", {})
        fields = {f.name for f in dataclasses.fields(SwarmSettings)}
        for key in swarm:
            if key not in fields:
                raise ConfigError(f"{self.path}: unknown key 'swarm.{key}'", f"known keys: {', '.join(sorted(fields))}")
        if "folds" in swarm:
            swarm = {**swarm, "folds": tuple(swarm["folds"])}
        self.swarm = SwarmSettings(**swarm)
        if self.swarm.boundary not in ("reflect", "clip"):
            raise ConfigError(f"{self.path}: swarm.boundary must be reflect or clip")
        if self.swarm.particles < 2:
            raise ConfigError(f"{self.path}: swarm.particles must be >= 2")
        self.bounds = {name: _bound(name, spec, str(self.path)) for name, spec in raw.get("bounds", {}).items()}
        if not self.bounds:
            raise ConfigError(f"{self.path}: no [bounds.*] tables")

    def fix(self, names) -> list[str]:
        """Take ``names`` out of the search (their values come from the base config); returns those
        that were searched. A search needs at least one parameter left."""
        fixed = [n for n in names if n in self.bounds]
        if fixed and len(fixed) == len(self.bounds):
            raise ConfigError(f"--set fixes every searched parameter ({', '.join(fixed)}): nothing left to search",
                              "drop a --set, or run python -m workbench.walkforward with those values")
        for n in fixed:
            del self.bounds[n]
        return fixed

    def bound(self, name: str, default: Bound | None = None) -> Bound | None:
        """The TOML's bound for ``name``, or ``default`` when the file has none."""
        return self.bounds.get(name, default)

    @property
    def names(self) -> list[str]:
        return list(self.bounds)

    def decode(self, u) -> dict:
        return {n: self.bounds[n].decode(x) for n, x in zip(self.names, u)}
