"""The front month: one contract per trading session, chosen by session volume, never rolled back.

Rule (per trading session, in time order; a session is the market's trading day: Globex's runs from
17:00 to 16:00 Chicago time):

- The measure of a contract in a session is its open interest at the session's last bar where the file
  has an ``open_interest`` column with values for every contract of the session, else its session volume.
- The first session's front is the contract with the largest measure.
- Roll: at the first session in which a later-expiring contract's measure exceeds the front's, the
  front becomes the later contract with the largest measure. Never back to an earlier expiry.
- A thin session (total volume under a quarter of the median of the up to 20 sessions before it: a
  holiday or a half day) decides no roll; the front carries over.
- A session in which the front has no bars (it expired) rolls to the later contract with the largest
  measure in that session, thin or not.

Every bar of a session comes from its front; the other contracts' rows are dropped and counted. The
session's own total volume decides its front: that tells the series which contract's prices to use,
not where prices go, and is what a trader knows in practice from the roll calendar.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .bars_io import utc_index
from .markets import MarketSpec

THIN_SHARE = 0.25
THIN_LOOKBACK = 20


def session_ids(ts_ns: np.ndarray, spec: MarketSpec) -> np.ndarray:
    """int64 trading-date id (days since 1970) of each UTC-ns timestamp, in the market's time zone."""
    local = utc_index(ts_ns).tz_convert(spec.session_tz) + spec.day_end_offset()
    return (local.tz_localize(None).normalize().asi8 // 86_400_000_000_000).astype(np.int64)


def select_front(df: pd.DataFrame, spec: MarketSpec, expiry: dict[int, int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Keep the front contract's rows of each session.

    Parameters
    ----------
    df : canonical rows of one product (``ts``, ``instrument_id``, ``volume``, optionally
        ``open_interest``), sorted by time.
    spec : the market, for its trading sessions.
    expiry : instrument_id -> sortable expiry key (later expiry = larger).

    Returns
    -------
    (rows kept, sessions): one row per session with its ``session`` date, ``front`` instrument_id,
    ``measure`` ('volume' or 'open_interest'), ``front_measure``, ``best_other_measure`` and ``thin``.
    """
    sess = session_ids(df["ts"].to_numpy(), spec)
    ids = df["instrument_id"].to_numpy()
    contracts = np.array(sorted(set(ids.tolist()), key=lambda i: (expiry[i], i)))
    col = pd.Index(contracts).get_indexer(ids)  # column of each row, columns in expiry order
    days, row_day = np.unique(sess, return_inverse=True)
    S, C = len(days), len(contracts)
    vol = np.zeros((S, C))
    np.add.at(vol, (row_day, col), np.nan_to_num(df["volume"].to_numpy(dtype=np.float64)))
    rows = np.zeros((S, C), np.int64)
    np.add.at(rows, (row_day, col), 1)
    oi = np.full((S, C), np.nan)
    if "open_interest" in df.columns:
        v = df["open_interest"].to_numpy(dtype=np.float64)
        ok = np.isfinite(v)
        oi[row_day[ok], col[ok]] = v[ok]  # rows are in time order: the session's last value stays
    front = np.full(S, -1, np.int64)
    thin = np.zeros(S, bool)
    used_oi = np.zeros(S, bool)
    f_meas = np.full(S, np.nan)
    o_meas = np.full(S, np.nan)
    totals: list[float] = []
    cur = -1
    for s in range(S):
        present = rows[s] > 0
        total = vol[s].sum()
        hist = totals[-THIN_LOOKBACK:]
        thin[s] = bool(hist) and total < THIN_SHARE * float(np.median(hist))
        later = present & (np.arange(C) > cur)
        if np.isfinite(oi[s][present]).all():
            meas, used_oi[s] = oi[s], True
        else:
            meas = vol[s]
        if cur < 0:
            cur = int(np.flatnonzero(present)[np.argmax(meas[present])])
        elif not present[cur]:
            if later.any():
                cur = int(np.flatnonzero(later)[np.argmax(meas[later])])
            else:  # only contracts that expire before the front trade here: nothing to keep
                totals.append(total)
                continue
        elif not thin[s]:
            cand = later & (np.arange(C) != cur)
            if cand.any():
                best = int(np.flatnonzero(cand)[np.argmax(meas[cand])])
                if meas[best] > meas[cur]:
                    cur = best
        front[s] = cur
        f_meas[s] = meas[cur]
        others = present & (np.arange(C) != cur)
        o_meas[s] = meas[others].max() if others.any() else np.nan
        totals.append(total)
    keep = front[row_day] == col
    sessions = pd.DataFrame({
        "session": pd.to_datetime(days * 86_400_000_000_000),
        "front": np.where(front >= 0, contracts[np.maximum(front, 0)], -1),
        "measure": np.where(used_oi, "open_interest", "volume"),
        "front_measure": f_meas, "best_other_measure": o_meas, "thin": thin,
        "total_volume": vol.sum(axis=1),
    })
    return df[keep], sessions
