"""Epoch selection: the statistic, and never the untrained weights while trained ones exist (#12)."""
from __future__ import annotations

import math

import pytest

from workbench.agent.selection import EpochSelector
from workbench.agent.trainer import EpochLog


def _log(epoch, updates, t, sharpe=0.0, tripped=False):
    return EpochLog(epoch, 0.1, 100, updates, 0.0, 0.0, 1.0, tripped, sharpe, 0.0, 5, 0.0, t, 1000)


def test_untrained_weights_are_never_kept_while_trained_ones_exist():
    s = EpochSelector("bar_t")
    assert s.offer(_log(1, 0, 3.0))        # nothing trained yet: the only candidate
    assert not s.offer(_log(2, 0, 2.0))    # still untrained, and worse
    assert s.offer(_log(3, 400, -1.0))     # trained beats untrained whatever the statistic
    assert s.best_epoch == 3
    # an epoch without updates after training holds weights trained earlier: a candidate on its statistic
    assert s.offer(_log(4, 0, 9.0)) and s.best_epoch == 4


def test_statistic_and_guard():
    s = EpochSelector("bar_t")
    for e, (u, t, tripped) in enumerate([(0, 5.0, False), (400, 1.0, False), (400, 2.5, False), (400, 9.0, True),
                                         (0, 3.0, False), (400, math.nan, False)], start=1):
        s.offer(_log(e, u, t, tripped=tripped))
    assert s.best_epoch == 5 and s.best_score == 3.0  # epoch 1 untrained; 4 tripped; 6 undefined
    d = EpochSelector("daily_sharpe")
    d.offer(_log(1, 400, 9.0, sharpe=-20.9))
    d.offer(_log(2, 400, -1.0, sharpe=12.8))
    assert d.best_epoch == 2
    with pytest.raises(ValueError):
        EpochSelector("luck")
