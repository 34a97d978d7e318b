"""What ``--resume`` checks before it keeps a run's finished folds: the same input, the same folds, the
same config. Each refusal says what differs."""
from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import numpy as np

from .config import to_dict, to_toml
from .errors import ConfigError, DataError


def fingerprint(prep) -> dict:
    """The input's identity: a content hash of the canonical bars (timestamps, prices, volume, contract
    ids, so a re-saved or renamed copy of the same data matches) and a hash of the folds' positions."""
    f = prep.bars.frame
    h = hashlib.sha256()
    for arr in (prep.bars.ts, f[["open", "high", "low", "close"]].to_numpy(np.float64),
                np.nan_to_num(f["volume"].to_numpy(np.float64), nan=-1.0), f["instrument_id"].to_numpy(np.int64)):
        h.update(np.ascontiguousarray(arr).tobytes())
    cols = [c for c in prep.folds.columns if c.endswith(("_start", "_stop"))]
    folds = hashlib.sha256(np.ascontiguousarray(prep.folds[cols].to_numpy(np.int64)).tobytes()).hexdigest()
    return {"source": Path(prep.bars.source).name if prep.bars.source else "<DataFrame>", "bars": len(f),
            "first": str(f.index[0]) if len(f) else "", "last": str(f.index[-1]) if len(f) else "",
            "data_sha256": h.hexdigest(), "folds": len(prep.folds), "folds_sha256": folds}


def _describe(fp: dict) -> str:
    return f"{fp['source']} ({fp['bars']:,} bars, {fp['first']} .. {fp['last']}, sha256 {fp['data_sha256'][:12]})"


def check_fingerprint(saved: dict, now: dict, run: Path) -> None:
    if saved.get("data_sha256") != now["data_sha256"]:
        raise DataError(f"cannot resume {run}: its data differ: the run read {_describe(saved)}, this is {_describe(now)}",
                        "resume with the run's own data file, or start a new run")
    if saved.get("folds_sha256") != now["folds_sha256"]:
        raise ConfigError(f"cannot resume {run}: its folds differ ({saved.get('folds')} folds then, {now['folds']} now)",
                          "resume with the run's own config")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


# Settings that change how a run is scheduled, never its results: a resume may change them.
RESULT_NEUTRAL = frozenset({"gpu.population"})


def check_config(saved_text: str, cfg, run: Path) -> None:
    """Refuse a resume whose config differs from the run's, naming every changed key: old -> new (keys
    in :data:`RESULT_NEUTRAL` may differ). A key the saved config lacks was added after the run was
    saved: it counts as its default, which is the behaviour the run had."""
    if saved_text == to_toml(cfg):
        return
    try:
        old = _flat(tomllib.loads(saved_text))
    except tomllib.TOMLDecodeError:
        old = {}
    if old:
        old = {**_flat(to_dict(type(cfg)())), **old}
    new = _flat(to_dict(cfg))
    changed = [f"{k}: {old.get(k, '(absent)')!r} -> {new.get(k, '(absent)')!r}" for k in sorted(set(old) | set(new))
               if old.get(k) != new.get(k) and not (isinstance(old.get(k), list) and tuple(old[k]) == new.get(k))
               and k not in RESULT_NEUTRAL]
    if not changed:
        return
    raise ConfigError(f"cannot resume {run}: the config differs from the run's: " + ("; ".join(changed) or "format"),
                      "resume with --config RUN/config.toml and no other overrides")
