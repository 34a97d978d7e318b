"""Synthetic ES-like 1-minute bars in Databento's OHLCV layout (parent symbology, ``ES.FUT``).

What the generator plants, so every stage downstream has something real to handle:

- Globex hours in exchange time (America/Chicago): Sunday 17:00 to Friday 16:00 with the daily
  16:00-17:00 maintenance halt; minutes with no trade are absent (as in Databento's OHLCV-1m).
- U-shaped intraday volatility and volume (peaks at the 08:30 open and the 15:00 close), a
  three-state volatility regime (Markov switching), Student-t (4 d.o.f.) innovations.
- Prices on the 0.25 tick; quarterly contracts (H, M, U, Z) rolled on the second Thursday of the
  expiry month (eight days before the third Friday), with a new ``instrument_id``. Each contract trades
  at the index plus a carry basis that decays to zero at expiry, so the front series jumps by the
  calendar spread at a roll. Around each roll both outrights and their calendar spread (``ESH4-ESM4``,
  prices can be negative) appear in the same minutes, as in a parent-symbology download.
- A buy/sell volume split (``buy_volume``, ``sell_volume``; not part of Databento's schema).
- ``signal`` (default 0): the planted predictable component. With OFI_t = (buy - sell) / (buy + sell)
  of bar t, the next bar's log return is ``sigma_{t+1} * (eps_{t+1} + signal * OFI_t)``; eps has unit
  variance, so ``signal`` is the predictable share in units of the bar's own volatility (0.05 is weak,
  roughly a 0.05 correlation between OFI_t and the next return).

Prices are written as int64 fixed-point (1e-9 units) and ``ts_event`` as int64 UTC nanoseconds, as
in raw DBN; ``workbench.data.load_bars`` reads this layout.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys

import numpy as np
import pandas as pd

from .errors import WorkbenchError

MONTH_CODES = {3: "H", 6: "M", 9: "U", 12: "Z"}
TICK = 0.25
EXCHANGE_TZ = "America/Chicago"
CARRY_POINTS_PER_DAY = 0.45


def third_friday(year: int, month: int) -> dt.date:
    first = dt.date(year, month, 1)
    return first + dt.timedelta(days=(4 - first.weekday()) % 7 + 14)


def roll_date(year: int, month: int) -> dt.date:
    """Second Thursday of the expiry month: the date volume moves to the next contract."""
    return third_friday(year, month) - dt.timedelta(days=8)


def _contracts(start: dt.date, end: dt.date) -> list[tuple[int, int]]:
    out, y, m = [], start.year, ((start.month - 1) // 3 + 1) * 3
    while True:
        out.append((y, m))
        if third_friday(y, m) > end + dt.timedelta(days=120):
            return out
        m += 3
        if m > 12:
            y, m = y + 1, 3


def contract_symbol(year: int, month: int, root: str = "ES") -> str:
    return f"{root}{MONTH_CODES[month]}{year % 10}"


def globex_minutes(start: pd.Timestamp, days: int) -> pd.DatetimeIndex:
    """Every minute Globex is open between ``start`` and ``start + days`` (UTC index)."""
    idx = pd.date_range(start.tz_convert("UTC"), periods=days * 1440, freq="min").as_unit("ns")
    local = idx.tz_convert(EXCHANGE_TZ)
    minute_of_day = local.hour * 60 + local.minute
    wd = local.day_of_week
    closed = (minute_of_day >= 16 * 60) & (minute_of_day < 17 * 60)
    closed |= (wd == 4) & (minute_of_day >= 16 * 60)
    closed |= wd == 5
    closed |= (wd == 6) & (minute_of_day < 17 * 60)
    return idx[~closed]


def _intraday_shape(local: pd.DatetimeIndex) -> np.ndarray:
    """Volatility multiplier by time of day: low overnight, U-shaped over the 08:30-15:15 session."""
    m = (local.hour * 60 + local.minute).to_numpy().astype(np.float64)
    rth = (m >= 8 * 60 + 30) & (m < 15 * 60 + 15)
    since_open = np.clip(m - (8 * 60 + 30), 0, None)
    to_close = np.clip(15 * 60 - m, 0, None)
    shape = np.where(rth, 1.0 + 1.6 * np.exp(-since_open / 25.0) + 0.8 * np.exp(-to_close / 20.0), 0.4)
    shape += np.where((m >= 7 * 60 + 30) & (m < 7 * 60 + 35), 1.0, 0.0)  # economic releases
    return shape


def _regimes(n: int, rng: np.random.Generator, mean_duration: float = 4000.0) -> np.ndarray:
    levels = np.array([0.7, 1.0, 1.9])
    out = np.empty(n)
    i, state = 0, 1
    while i < n:
        length = int(rng.geometric(1.0 / mean_duration))
        out[i : i + length] = levels[state]
        i += length
        state = int(rng.choice([s for s in range(3) if s != state]))
    return out


def _round_tick(x: np.ndarray) -> np.ndarray:
    return np.round(x / TICK) * TICK


def generate_bars(
    n_bars: int = 60_000,
    seed: int = 0,
    start: str = "2024-02-04 17:00",
    signal: float = 0.0,
    spreads: bool = True,
    start_price: float = 4950.0,
) -> pd.DataFrame:
    """Generate ``n_bars`` front-contract bars (plus back-month and spread rows around rolls).

    Returns a DataFrame in Databento's OHLCV layout, sorted by ``ts_event`` then ``instrument_id``.
    """
    if n_bars < 100:
        raise WorkbenchError(f"--bars must be at least 100, got {n_bars}")
    rng = np.random.default_rng(seed)
    start_ts = pd.Timestamp(start, tz=EXCHANGE_TZ)
    days = int(n_bars / 1380 * 7 / 5 * 1.1) + 7
    minutes = globex_minutes(start_ts, days)
    local = minutes.tz_convert(EXCHANGE_TZ)
    n = len(minutes)

    shape = _intraday_shape(local)
    sigma = 0.00028 * shape * _regimes(n, rng)
    eps = rng.standard_t(4, n) / np.sqrt(2.0)  # t(4) has variance 2
    z = rng.standard_normal(n)
    buy_frac = np.clip(0.5 + 0.25 * np.tanh(eps) + 0.12 * z, 0.03, 0.97)
    ofi = 2.0 * buy_frac - 1.0
    ret = sigma * eps
    ret[1:] += sigma[1:] * signal * ofi[:-1]
    gap_min = np.diff(minutes.asi8, prepend=minutes.asi8[0]) / 60e9
    jumps = np.where(gap_min > 1, rng.standard_normal(n) * 0.00015 * np.sqrt(np.clip(gap_min, 1, 600)), 0.0)
    log_index = np.log(start_price) + np.cumsum(ret + jumps)
    close_idx = np.exp(log_index)
    open_idx = np.exp(log_index - ret)  # the bar opens where the jump left it
    wick = np.abs(rng.standard_normal((2, n))) * sigma * close_idx * 0.6
    high_idx = np.maximum(open_idx, close_idx) + wick[0]
    low_idx = np.minimum(open_idx, close_idx) - wick[1]

    volume = np.maximum(rng.lognormal(np.log(180 * shape**1.6), 0.6), 0).astype(np.int64)
    traded = ~((shape < 0.5) & (rng.random(n) < 0.02))  # a few overnight minutes with no trade

    trade_date = (local + pd.Timedelta(hours=8)).date  # CME trading date (day ends 16:00 CT)
    contracts = _contracts(trade_date[0], trade_date[-1])
    rolls = [roll_date(y, m) for (y, m) in contracts]
    ids = {c: 10_000 + (c[0] % 100) * 100 + c[1] for c in contracts}
    front_k = np.searchsorted(np.array(rolls, dtype="datetime64[D]"), np.array(trade_date, dtype="datetime64[D]"), side="right")
    days_to = {c: (third_friday(*c) - trade_date[0]).days for c in contracts}

    def basis(k: np.ndarray) -> np.ndarray:
        elapsed = (minutes.asi8 - minutes.asi8[0]) / 86_400e9
        dte = np.array([days_to[contracts[j]] for j in k]) - elapsed
        return CARRY_POINTS_PER_DAY * np.clip(dte, 0, None)

    # Around each roll both outrights trade: before the roll the other one is the next contract,
    # after it the expiring one. Its volume is a noisy fraction of the front's.
    day = np.array(trade_date, dtype="datetime64[D]")
    roll_days = np.array(rolls, dtype="datetime64[D]")
    nearest = np.abs(day[:, None] - roll_days[None, :]).astype(int).argmin(axis=1)
    offset = (day - roll_days[nearest]).astype(int)
    near_roll = (offset >= -4) & (offset <= 2)
    other_k = np.where(offset < 0, front_k + 1, np.maximum(front_k - 1, 0))
    frames = []
    for k, keep, vol in (
        (front_k, traded, volume),
        (other_k, traded & near_roll, np.maximum(volume * rng.lognormal(np.log(0.12), 0.7, n), 1).astype(np.int64)),
    ):
        if not spreads and k is other_k:
            continue
        b = basis(k)
        frames.append(_contract_frame(minutes, k, keep, contracts, ids, open_idx + b, high_idx + b,
                                      low_idx + b, close_idx + b, vol, buy_frac))
    df = pd.concat(frames, ignore_index=True)
    if spreads:
        df = pd.concat([df, _spread_rows(df, contracts, ids)], ignore_index=True)
    df = df.sort_values(["ts_event", "instrument_id"], kind="stable").reset_index(drop=True)
    # Trim so that the front series has n_bars bars.
    front_ts = np.unique(minutes.asi8[traded])
    cutoff = front_ts[min(n_bars, len(front_ts)) - 1]
    return df[df["ts_event"] <= cutoff].reset_index(drop=True)


def _contract_frame(minutes, k, keep, contracts, ids, o, h, l, c, vol, buy_frac) -> pd.DataFrame:
    o, h, l, c = (_round_tick(x) for x in (o, h, l, c))
    h = np.maximum.reduce([h, o, c])
    l = np.minimum.reduce([l, o, c])
    buy = np.round(vol * buy_frac).astype(np.int64)
    sym = np.array([contract_symbol(*contracts[j]) for j in range(len(contracts))])
    idarr = np.array([ids[cc] for cc in contracts], dtype=np.uint32)
    return pd.DataFrame({
        "ts_event": minutes.asi8[keep],
        "rtype": np.uint8(33),
        "publisher_id": np.uint16(1),
        "instrument_id": idarr[k[keep]],
        "open": _fixed(o[keep]), "high": _fixed(h[keep]), "low": _fixed(l[keep]), "close": _fixed(c[keep]),
        "volume": vol[keep].astype(np.uint64),
        "symbol": sym[k[keep]],
        "buy_volume": buy[keep].astype(np.uint64),
        "sell_volume": (vol[keep] - buy[keep]).astype(np.uint64),
    })


def _spread_rows(df: pd.DataFrame, contracts, ids) -> pd.DataFrame:
    """Calendar-spread rows (near minus far) in the minutes where both outrights traded."""
    rows = []
    for j in range(len(contracts) - 1):
        near, far = ids[contracts[j]], ids[contracts[j + 1]]
        a = df[df["instrument_id"] == near].set_index("ts_event")
        b = df[df["instrument_id"] == far].set_index("ts_event")
        both = a.index.intersection(b.index)
        if len(both) == 0:
            continue
        a, b = a.loc[both], b.loc[both]
        px = a["close"].to_numpy() - b["close"].to_numpy()
        rows.append(pd.DataFrame({
            "ts_event": both.to_numpy(), "rtype": np.uint8(33), "publisher_id": np.uint16(1),
            "instrument_id": np.uint32(90_000 + j),
            "open": px, "high": px, "low": px, "close": px,
            "volume": np.maximum(a["volume"].to_numpy() // 20, 1).astype(np.uint64),
            "symbol": f"{contract_symbol(*contracts[j])}-{contract_symbol(*contracts[j + 1])}",
            "buy_volume": np.uint64(0), "sell_volume": np.uint64(0),
        }))
    return pd.concat(rows, ignore_index=True) if rows else df.iloc[:0]


def _fixed(x: np.ndarray) -> np.ndarray:
    return np.round(x * 1e9).astype(np.int64)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.synthetic", description=__doc__.split("\n")[0])
    p.add_argument("out", help="output path (.parquet or .csv)")
    p.add_argument("--bars", type=int, default=60_000, help="front-contract bars to write (default 60000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--signal", type=float, default=0.0,
                   help="planted predictability: next return gets signal x sigma x OFI of this bar (default 0)")
    p.add_argument("--start", default="2024-02-04 17:00", help="first minute, exchange time (America/Chicago)")
    p.add_argument("--no-spreads", action="store_true", help="write only the front contract (no back month, no spreads)")
    args = p.parse_args(argv)
    try:
        return _write(args)
    except WorkbenchError as exc:
        print(f"workbench: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code


def _write(args) -> int:
    from pathlib import Path

    from .errors import CantCreateError, UsageError, os_error

    out = Path(args.out)
    if args.bars < 1:
        raise UsageError(f"--bars must be >= 1, got {args.bars}")
    try:
        pd.Timestamp(args.start)
    except (ValueError, TypeError):
        raise UsageError(f"--start {args.start!r} is not a time", "e.g. --start '2024-02-04 17:00'") from None
    if not out.parent.is_dir():
        raise CantCreateError(f"cannot write {out}: the folder {out.parent} does not exist", "create it first")
    if out.is_dir():
        raise CantCreateError(f"cannot write {out}: it is a directory", "name a file (.parquet or .csv)")
    df = generate_bars(args.bars, args.seed, args.start, args.signal, spreads=not args.no_spreads)
    try:
        if args.out.endswith(".csv"):
            df.to_csv(out, index=False)
        else:
            df.to_parquet(out, index=False, compression="zstd")
    except OSError as exc:
        raise os_error(exc, "write", out) from exc
    print(args.out)
    print(f"wrote {len(df)} rows ({df['symbol'].nunique()} symbols) to {args.out}", file=sys.stderr)
    return 0


def console_main() -> None:
    raise SystemExit(main())


if __name__ == "__main__":
    raise SystemExit(main())
