"""DQN hyper-parameters (``config/training/dqn.toml``), a frozen dataclass like every config here."""
from __future__ import annotations

from dataclasses import dataclass

from .._fields import _f
from ..errors import ConfigError


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = _f(8, "training epochs per fold; the best by the validation statistic (select_by) is kept")
    max_steps_per_epoch: int = _f(400, "gradient updates per epoch (the training phase's length)")
    rollout_steps: int = _f(64, "env steps per epoch in the experience phase (each of n_envs envs)")
    episode_len: int = _f(1024, "bars per training episode (random start inside the train range)")
    gamma: float = _f(0.99, "discount per bar")
    n_step: int = _f(3, "n-step return horizon (bars)")
    lr: float = _f(1e-4, "Adam learning rate")
    adam_beta1: float = _f(0.9, "Adam beta1")
    adam_beta2: float = _f(0.999, "Adam beta2")
    adam_eps: float = _f(1.5e-4, "Adam epsilon")
    weight_decay: float = _f(0.0, "decoupled L2 on the parameters")
    grad_clip: float = _f(10.0, "global gradient-norm clip (0 = off)")
    tau: float = _f(0.005, "Polyak rate of the target network per update")
    per_alpha: float = _f(0.6, "PER priority exponent")
    per_beta: float = _f(0.4, "PER importance-weight exponent")
    per_eps: float = _f(1e-3, "PER priority floor")
    eps_start: float = _f(1.0, "epsilon-greedy exploration at the first epoch")
    eps_end: float = _f(0.05, "epsilon at and after eps_decay_epochs")
    eps_decay_epochs: int = _f(5, "epochs over which epsilon decays linearly")
    v_min: float = _f(-10.0, "C51 support minimum (scaled reward units)")
    v_max: float = _f(10.0, "C51 support maximum")
    reward_scale: float = _f(0.01, "reward = net USD PnL of the bar x reward_scale")
    max_position: int = _f(3, "largest position in contracts (size branch 1..3)")
    replay_capacity: int = _f(1_000_000, "replay ring capacity (also capped by the GPU profile's memory share)")
    learning_starts: int = _f(4096, "transitions in replay before the first update")
    q_limit: float = _f(1e4, "the guard trips when |Q| exceeds this")
    select_by: str = _f("bar_t", "epoch selection statistic on the validation range: 'bar_t' (t-statistic of the mean "
                        "per-bar PnL), 'daily_sharpe' or 'pnl' (workbench/agent/selection.py)")

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


def load_train_config(path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Defaults, then ``config/training/dqn.toml`` (or ``path``), then ``key=value`` overrides."""
    from .. import config as _config
    from ..resources import config_file

    values = _config.read_toml(path or config_file("training", "dqn.toml"))
    values = _config.merge_overrides(values, overrides or [])
    return validate(_config.build(TrainConfig, values, prefix="training."))
