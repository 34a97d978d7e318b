"""Particle swarm optimisation on the unit cube, maximising, seeded, with an ask/tell interface.

Each iteration every particle is evaluated once (``ask`` returns the positions, ``tell`` takes their
scores), then velocities move: ``v = inertia * v + cognitive * r1 * (own best - x) + social * r2 *
(swarm best - x)`` with r1, r2 ~ U(0, 1) per coordinate from the seeded generator, and ``x += v``.
Boundary handling: ``reflect`` mirrors a coordinate that leaves [0, 1] back inside and flips that
velocity component; ``clip`` stops it at the edge and zeroes the component. Non-finite scores count
as -inf (a failed trial never becomes a best). Because every draw comes from one seeded generator in a
fixed order, replaying the told scores of a trial log reproduces the swarm exactly (resume).
"""
from __future__ import annotations

import numpy as np


class ParticleSwarm:
    def __init__(self, dims: int, particles: int = 8, inertia: float = 0.7, cognitive: float = 1.5,
                 social: float = 1.5, seed: int = 0, boundary: str = "reflect", v_max: float = 0.25):
        if boundary not in ("reflect", "clip"):
            raise ValueError("boundary must be 'reflect' or 'clip'")
        self.rng = np.random.default_rng(seed)
        self.x = self.rng.random((particles, dims))
        self.v = self.rng.uniform(-v_max, v_max, (particles, dims))
        self.inertia, self.cognitive, self.social = inertia, cognitive, social
        self.boundary, self.v_max = boundary, v_max
        self.best_x = self.x.copy()
        self.best_f = np.full(particles, -np.inf)
        self.g_x, self.g_f = self.x[0].copy(), -np.inf
        self.iteration = 0

    def ask(self) -> np.ndarray:
        return self.x.copy()

    def tell(self, scores) -> None:
        f = np.where(np.isfinite(scores), np.asarray(scores, dtype=np.float64), -np.inf)
        better = f > self.best_f
        self.best_f[better], self.best_x[better] = f[better], self.x[better]
        k = int(np.argmax(self.best_f))
        if self.best_f[k] > self.g_f:
            self.g_f, self.g_x = float(self.best_f[k]), self.best_x[k].copy()
        r1, r2 = self.rng.random(self.x.shape), self.rng.random(self.x.shape)
        self.v = (self.inertia * self.v + self.cognitive * r1 * (self.best_x - self.x)
                  + self.social * r2 * (self.g_x - self.x))
        self.v = np.clip(self.v, -self.v_max, self.v_max)
        x = self.x + self.v
        if self.boundary == "reflect":
            for _ in range(2):  # a step of at most v_max leaves the cube on one side only
                low, high = x < 0, x > 1
                x = np.where(low, -x, np.where(high, 2 - x, x))
                self.v = np.where(low | high, -self.v, self.v)
        else:
            out = (x < 0) | (x > 1)
            self.v = np.where(out, 0.0, self.v)
        self.x = np.clip(x, 0.0, 1.0)
        self.iteration += 1

    @property
    def best(self) -> tuple[np.ndarray, float]:
        return self.g_x.copy(), self.g_f
