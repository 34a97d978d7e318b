"""workbench: GPU walk-forward backtesting of a DQN futures agent, with honest futures accounting.

The notebook API, imported lazily so ``python -m workbench.synthetic`` and friends stay light::

    from workbench import WalkForward, load_bars, load_config
    bars = load_bars("data/es_sample.parquet")
    result = WalkForward(load_config(None, ["training.epochs=4"])).run(bars)
    result.plot(); result.to_html("report.html")
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "WalkForward": "workbench.engine",
    "WalkForwardResult": "workbench.results",
    "FoldResult": "workbench.results",
    "load_bars": "workbench.data",
    "validate_bars": "workbench.data",
    "Bars": "workbench.data",
    "load_config": "workbench.config",
    "RunConfig": "workbench.config",
    "walk_forward_splits": "workbench.splits",
    "build_features": "workbench.features",
    "RunDir": "workbench.rundir",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
