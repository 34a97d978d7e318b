from __future__ import annotations

import numpy as np
import pytest

from workbench.errors import ConfigError
from workbench.hyperopt.bounds import HyperoptProfile
from workbench.hyperopt.pso import ParticleSwarm


def _run(f, dims, iters, seed=0, **kw):
    pso = ParticleSwarm(dims, seed=seed, **kw)
    for _ in range(iters):
        pso.tell([f(x) for x in pso.ask()])
    return pso.best


@pytest.mark.parametrize("boundary", ["reflect", "clip"])
def test_sphere(boundary):
    target = np.array([0.3, 0.7, 0.55])
    x, fx = _run(lambda x: -np.sum((x - target) ** 2), 3, 60, particles=12, boundary=boundary)
    assert np.allclose(x, target, atol=0.02) and fx > -1e-3


def test_rosenbrock_3d():
    def rosen(u):  # optimum at (1, 1, 1) in [-2, 2]^3, i.e. u = 0.75
        z = 4 * u - 2
        return -np.sum(100 * (z[1:] - z[:-1] ** 2) ** 2 + (1 - z[:-1]) ** 2)

    x, fx = _run(rosen, 3, 300, particles=24, seed=1, inertia=0.6)
    assert np.allclose(4 * x - 2, 1.0, atol=0.1) and fx > -0.05


def test_seeded_and_resumable_from_told_scores():
    f = lambda x: -np.sum((x - 0.4) ** 2)  # noqa: E731
    a = ParticleSwarm(4, seed=7)
    log = []
    for _ in range(5):
        s = [f(x) for x in a.ask()]
        log.append(s)
        a.tell(s)
    b = ParticleSwarm(4, seed=7)  # a resumed search replays the logged scores
    for s in log:
        b.tell(s)
    assert np.array_equal(a.ask(), b.ask()) and a.best[1] == b.best[1]
    c = ParticleSwarm(4, seed=7)
    c.tell([np.nan] * 8)  # failed trials never become a best
    assert c.best[1] == -np.inf


def test_default_bounds_decode_inside_their_ranges():
    h = HyperoptProfile()
    for u in (0.0, 0.37, 1.0):
        vals = h.decode([u] * len(h.names))
        for name, v in vals.items():
            b = h.bound(name)
            if b.type == "choice":
                assert v in b.values
            else:
                assert b.low - 1e-9 <= v <= b.high + 1e-9
                assert isinstance(v, int) == (b.type == "int")
    assert h.bound("nope", None) is None and h.bound("lr").scale == "log"


@pytest.mark.parametrize("text,match", [
    ("[bounds.lrr]\ntype='float'\nlow=1\nhigh=2\n", "unknown parameter 'lrr'"),
    ("[bounds.lr]\ntype='float'\nlow=1\nhigh=2\nstep=3\n", "unknown key 'step'"),
    ("[bounds.lr]\ntype='float'\nlow=2\nhigh=1\n", "low .* must be below high"),
    ("[bounds.lr]\ntype='float'\nlow=0\nhigh=1\nscale='log'\n", "log scale needs low > 0"),
    ("[bounds.lr]\ntype='bogus'\nlow=0\nhigh=1\n", "type must be float, int or choice"),
    ("[bounds.episode_len]\ntype='choice'\nvalues=[]\n", "non-empty 'values'"),
    ("[swarm]\nparticle=3\n[bounds.lr]\nlow=1e-5\nhigh=1e-3\n", "unknown key 'swarm.particle'"),
    ("[swarm]\nboundary='wrap'\n[bounds.lr]\nlow=1e-5\nhigh=1e-3\n", "boundary must be reflect or clip"),
    ("[swarm]\nparticles=4\n", "no \\[bounds"),
])
def test_bad_bounds_files_name_the_key(tmp_path, text, match):
    p = tmp_path / "h.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        HyperoptProfile(p)
