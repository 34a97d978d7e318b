"""Run directory: the resolved config, folds, per-fold results and the stitched series.

Layout::

    RUN/config.toml            resolved config (reproduces the run with --config)
    RUN/data_report.json       validation report of the input
    RUN/folds.parquet|json     the folds table
    RUN/fold_001/              metrics.json, trades.parquet, bars.parquet; for the agent also
                               epochs.json (per-epoch phase timings, losses, validation) and
                               weights.npy (the selected epoch's flat parameters); written atomically
    RUN/summary.json           stitched out-of-sample metrics, per-fold table, annualisation
    RUN/oos_equity.parquet     stitched out-of-sample per-bar series

Every file is written to a temporary name and renamed into place; a fold directory appears only
once all its files are complete, so an interrupted run leaves finished folds intact.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import UsageError


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if hasattr(obj, "item"):
        return _clean(obj.item())
    if isinstance(obj, pd.Timestamp):
        return obj.isoformat()
    return obj


def dumps(obj) -> str:
    return json.dumps(_clean(obj), indent=2, default=str)


class RunDir:
    def __init__(self, path: str | Path, force: bool = False, resume: bool = False, marker: str = "config.toml"):
        self.path = Path(path)
        self.resume = resume
        if resume:  # ``marker``: the file every directory of this kind starts with
            if not (self.path / marker).is_file():
                raise UsageError(f"cannot resume {self.path}: no {marker} there", "is it a run directory?")
            return
        if self.path.exists() and any(self.path.iterdir()):
            if not force:
                raise UsageError(f"run directory {self.path} exists and is not empty",
                                 "pass --force to overwrite it or choose another --out")
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)

    def write_text(self, name: str, text: str) -> Path:
        dest = self.path / name
        tmp = dest.with_name(f".{dest.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, dest)
        return dest

    def write_json(self, name: str, obj) -> Path:
        return self.write_text(name, dumps(obj) + "\n")

    def write_parquet(self, name: str, df: pd.DataFrame, directory: Path | None = None) -> Path:
        dest = (directory or self.path) / name
        tmp = dest.with_name(f".{dest.name}.tmp")
        df.to_parquet(tmp)
        os.replace(tmp, dest)
        return dest

    def write_fold(self, fold: int, metrics: dict, trades: pd.DataFrame, bars: pd.DataFrame, extra: dict | None = None,
                   files: dict | None = None) -> Path:
        final = self.path / f"fold_{fold:03d}"
        tmp = self.path / f".fold_{fold:03d}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        (tmp / "metrics.json").write_text(dumps({"fold": fold, **metrics, **(extra or {})}) + "\n")
        trades.to_parquet(tmp / "trades.parquet")
        bars.to_parquet(tmp / "bars.parquet")
        for name, obj in (files or {}).items():
            if name.endswith(".npy"):
                np.save(tmp / name, obj)
            else:
                (tmp / name).write_text(dumps(obj) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def finished_fold(self, k: int):
        """The k-th fold (from 0; its directory and number count from 1) as written by an earlier run
        (``None`` if absent or incomplete)."""
        from .results import FoldResult

        fold = k + 1
        d = self.path / f"fold_{fold:03d}"
        if not (d / "metrics.json").is_file():
            return None
        meta = json.loads((d / "metrics.json").read_text())
        ranges, strategy = meta.pop("ranges", {}), meta.pop("strategy", "")
        meta.pop("fold", None)
        res = FoldResult(fold, strategy, pd.read_parquet(d / "bars.parquet"), pd.read_parquet(d / "trades.parquet"),
                         meta, ranges)
        if (d / "epochs.json").is_file():
            res.epochs = json.loads((d / "epochs.json").read_text())["epochs"]
            res.params = np.load(d / "weights.npy")
        return res
