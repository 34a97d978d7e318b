"""Which epoch's weights a fold keeps: the validation statistic and the rule, one place for both backends.

The validation range of a fold is a few days, so a Sharpe of its daily PnL rests on a handful of
numbers (consecutive epochs of one fold read -20.95, -2.73, +12.79 on the H200). The default statistic
(``training.select_by``) uses every validation bar instead:

- ``bar_t`` (default): the t-statistic of the mean per-bar validation PnL, mean / std (ddof 1) x
  sqrt(bars); observations = the validation range's bars (thousands for minute data).
- ``daily_sharpe``: the annualised Sharpe of daily validation PnL (252 days); observations = its days.
- ``pnl``: net validation PnL in USD.

Rule: the highest statistic among epochs whose weights have been trained (at least one update so far
in the fold, the guard not tripped) wins; an epoch with untrained weights is chosen only while no
trained one exists, so a fold never keeps its initial weights when training happened.
"""
from __future__ import annotations

import math

SELECT_RULES = {
    "bar_t": ("val_bar_t", "t-statistic of the mean per-bar validation PnL (observations: validation bars)"),
    "daily_sharpe": ("val_sharpe", "annualised Sharpe of daily validation PnL (observations: validation days)"),
    "pnl": ("val_pnl_usd", "net validation PnL in USD"),
}


def describe(rule: str) -> str:
    return SELECT_RULES[rule][1]


class EpochSelector:
    """Offer every epoch's log in order; ``offer`` says whether its weights become the fold's choice."""

    def __init__(self, rule: str):
        if rule not in SELECT_RULES:
            raise ValueError(f"unknown selection rule {rule!r}: {', '.join(SELECT_RULES)}")
        self.key = SELECT_RULES[rule][0]
        self.best_epoch, self.best_score, self.best_trained = -1, -math.inf, False
        self.updates = 0

    def offer(self, log) -> bool:
        self.updates += log.updates if not log.guard_tripped else 0
        trained = self.updates > 0
        score = getattr(log, self.key)
        if log.guard_tripped or not math.isfinite(score):
            return False
        better = (trained and not self.best_trained) or (trained == self.best_trained and score > self.best_score)
        if better:
            self.best_epoch, self.best_score, self.best_trained = log.epoch, float(score), trained
        return better
