"""DQN hyper-parameters, a frozen dataclass like every config here.

``config/training/dqn.toml`` is the one source of the defaults (documented there, key by key); the
fields read them at import, so the dataclass and the file cannot disagree.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..resources import config_file
from ..settings import _f, read_toml

_DEFAULTS = read_toml(config_file("training", "dqn.toml"))


def _d(key: str):
    if key not in _DEFAULTS:
        raise ConfigError(f"config/training/dqn.toml has no default for '{key}'")
    return _DEFAULTS[key]


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = _f(_d("epochs"), "training epochs per fold; the best by the validation statistic (select_by) is kept")
    max_steps_per_epoch: int = _f(_d("max_steps_per_epoch"), "gradient updates per epoch (the training phase's length)")
    rollout_steps: int = _f(_d("rollout_steps"), "env steps per epoch in the experience phase (each of n_envs envs)")
    episode_len: int = _f(_d("episode_len"), "bars per training episode (random start inside the train range)")
    gamma: float = _f(_d("gamma"), "discount per bar")
    n_step: int = _f(_d("n_step"), "n-step return horizon (bars)")
    lr: float = _f(_d("lr"), "Adam learning rate")
    adam_beta1: float = _f(_d("adam_beta1"), "Adam beta1")
    adam_beta2: float = _f(_d("adam_beta2"), "Adam beta2")
    adam_eps: float = _f(_d("adam_eps"), "Adam epsilon")
    weight_decay: float = _f(_d("weight_decay"), "decoupled L2 on the parameters")
    grad_clip: float = _f(_d("grad_clip"), "global gradient-norm clip (0 = off)")
    tau: float = _f(_d("tau"), "Polyak rate of the target network per update")
    per_alpha: float = _f(_d("per_alpha"), "PER priority exponent")
    per_beta: float = _f(_d("per_beta"), "PER importance-weight exponent")
    per_eps: float = _f(_d("per_eps"), "PER priority floor")
    eps_start: float = _f(_d("eps_start"), "epsilon-greedy exploration at the first epoch")
    eps_end: float = _f(_d("eps_end"), "epsilon at and after eps_decay_epochs")
    eps_decay_epochs: int = _f(_d("eps_decay_epochs"), "epochs over which epsilon decays linearly")
    v_min: float = _f(_d("v_min"), "C51 support minimum (scaled reward units)")
    v_max: float = _f(_d("v_max"), "C51 support maximum")
    reward_scale: float = _f(_d("reward_scale"), "reward = net USD PnL of the bar x reward_scale")
    max_position: int = _f(_d("max_position"), "largest position in contracts (size branch 1..3)")
    replay_capacity: int = _f(_d("replay_capacity"), "replay ring capacity (also capped by the GPU profile's memory share)")
    learning_starts: int = _f(_d("learning_starts"), "transitions in replay before the first update")
    q_limit: float = _f(_d("q_limit"), "the guard trips when |Q| exceeds this")
    select_by: str = _f(_d("select_by"), "epoch selection statistic on the validation range: 'bar_t' (t-statistic of the mean "
                        "per-bar PnL), 'daily_sharpe' or 'pnl' (workbench/agent/selection.py)")
    seeds: int = _f(_d("seeds"), "agents trained per fold, each with its own seed; > 1: the fold's test range is traded by "
                    "their ensemble (mean of the seeds' expected Q per action), each seed reported beside it "
                    "(workbench/agent/ensemble.py)")

    def epsilon(self, epoch: int) -> float:
        if self.eps_decay_epochs <= 0:
            return self.eps_end
        frac = min(1.0, epoch / self.eps_decay_epochs)
        return self.eps_start + (self.eps_end - self.eps_start) * frac


def validate(cfg: TrainConfig) -> TrainConfig:
    checks = [
        (cfg.epochs >= 1, "epochs must be >= 1"), (cfg.max_steps_per_epoch >= 0, "max_steps_per_epoch must be >= 0"),
        (cfg.rollout_steps >= 1, "rollout_steps must be >= 1"), (0 < cfg.gamma <= 1, "gamma must be in (0, 1]"),
        (1 <= cfg.n_step <= 32, "n_step must be in [1, 32]"), (cfg.lr > 0, "lr must be > 0"),
        (cfg.v_min < cfg.v_max, "v_min must be < v_max"), (0 <= cfg.tau <= 1, "tau must be in [0, 1]"),
        (cfg.max_position == 3, "max_position must be 3 (the size branch has 3 actions)"),
        (cfg.episode_len >= cfg.n_step + 2, "episode_len must exceed n_step + 1"),
        (cfg.replay_capacity >= 1024, "replay_capacity must be >= 1024"),
        (1 <= cfg.seeds <= 64, "seeds must be in [1, 64]"),
        (cfg.select_by in ("bar_t", "daily_sharpe", "pnl"), "select_by must be 'bar_t', 'daily_sharpe' or 'pnl'"),
        (0 <= cfg.adam_beta1 < 1 and 0 <= cfg.adam_beta2 < 1 and cfg.adam_eps > 0, "Adam betas must be in [0, 1), eps > 0"),
        (cfg.weight_decay >= 0 and cfg.grad_clip >= 0, "weight_decay and grad_clip must be >= 0"),
        (0 <= cfg.per_alpha <= 1 and 0 <= cfg.per_beta <= 1 and cfg.per_eps > 0, "per_alpha, per_beta in [0, 1], per_eps > 0"),
        (cfg.reward_scale > 0 and cfg.q_limit > 0, "reward_scale and q_limit must be > 0"),
        (cfg.learning_starts >= 0 and cfg.eps_decay_epochs >= 0, "learning_starts and eps_decay_epochs must be >= 0"),
        (0 <= cfg.eps_end <= 1 and 0 <= cfg.eps_start <= 1, "epsilons must be in [0, 1]"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(f"training config: {msg}")
    return cfg
