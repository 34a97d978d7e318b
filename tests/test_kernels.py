"""Every kernel against its NumPy reference on fresh random inputs, outputs poisoned first.

Runs in Numba's CUDA simulator on machines without a GPU (tiny grids) and on the real device where
there is one. The PTX test compiles every kernel for sm_90 with its launch signature.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda

from cuda_kernels import actions, bf16, c51, dense, optim, per, philox, scan
from cuda_kernels.nb import SIMULATOR

from conftest import ROOT

NAN = np.float32(np.nan)


def dev(x):
    return cuda.to_device(np.ascontiguousarray(x))


def poisoned(shape, dtype=np.float32):
    fill = np.nan if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max // 3
    return cuda.to_device(np.full(shape, fill, dtype=dtype))


# ---- bfloat16 ----

def _nearest_bf16(x: np.ndarray) -> np.ndarray:
    """An oracle apart from the reference's bit arithmetic: each finite float32's two bfloat16 neighbours
    (its bits truncated, and the next bfloat16 away from zero), the nearer by float64 distance, a tie to
    the one whose last bit is 0; past the largest finite bfloat16 the next one is infinity, which IEEE
    rounding places at 2^128."""
    u = x.view(np.uint32)
    lo = (u >> 16).astype(np.uint16)
    hi = lo + np.uint16(1)
    mag = lambda h: np.where((h & 0x7FFF) == 0x7F80, 2.0**128,  # noqa: E731
                             np.abs(bf16.from_bf16_ref(h).astype(np.float64)))
    d_lo, d_hi = np.abs(np.abs(x.astype(np.float64)) - mag(lo)), np.abs(mag(hi) - np.abs(x.astype(np.float64)))
    return np.where((d_hi < d_lo) | ((d_hi == d_lo) & (lo & 1 == 1)), hi, lo)


def test_bf16_rounding_reference_and_kernel(rng):
    """float32 -> bfloat16: the reference against the nearest-neighbour oracle, then the kernel against
    the reference (output poisoned) on random bit patterns of every exponent, exact ties, values at the
    overflow edge, subnormals, signed zeros, infinities and NaNs; and bfloat16 -> float32 is exact."""
    bits = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2**16, 500, dtype=np.uint64).astype(np.uint32) << 16) | np.uint32(0x8000)
    edge = np.array([0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x7F7FFFFF, 0xFF7F8000, 0x00000001, 0x00008000,
                     0x80018000, 0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFF800001,
                     0x7F800001, 0x3F808000, 0x3F818000], np.uint32)
    x = np.concatenate([bits, ties, edge]).view(np.float32)
    want = bf16.to_bf16_ref(x)
    finite = np.isfinite(x)
    assert np.array_equal(want[finite], _nearest_bf16(x[finite]))
    assert np.array_equal(want[np.isinf(x)], (x[np.isinf(x)].view(np.uint32) >> 16).astype(np.uint16))
    nan = np.isnan(x)
    assert np.isnan(bf16.from_bf16_ref(want[nan])).all()
    assert np.array_equal(want[nan] >> 15, (x[nan].view(np.uint32) >> 31).astype(np.uint16))  # sign kept
    assert bf16.to_bf16_ref(np.float32([1 + 2**-8, 1 + 3 * 2**-8])).tolist() == [0x3F80, 0x3F82]  # ties to even
    out = poisoned(x.size, np.uint16)
    bf16.to_bf16_kernel[4, 32](dev(x), out, x.size)
    assert np.array_equal(out.copy_to_host(), want)
    back = bf16.from_bf16_ref(want)
    got = poisoned(x.size)
    bf16.from_bf16_kernel[4, 32](out, got, x.size)
    assert np.array_equal(got.copy_to_host().view(np.uint32), back.view(np.uint32))  # NaNs' bits too
    assert np.array_equal(bf16.to_bf16_ref(back[~nan]), want[~nan])  # bfloat16 values convert back exactly
    assert not (back.view(np.uint32) & 0xFFFF).any()  # a bfloat16 is a float32 with a zero lower half


# ---- Philox ----

KAT = [  # Random123 kat_vectors, philox4x32-10: counter (4 words), key (2 words) -> output
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def test_philox_known_answers_reference_and_kernel():
    ctr = np.array([k[0] for k in KAT], np.uint32)
    key = np.array([k[1] for k in KAT], np.uint32)
    want = np.array([k[2] for k in KAT], np.uint32)
    assert (philox.philox4x32_10_ref(ctr, key) == want).all()
    out = poisoned((3, 4), np.uint32)
    philox.philox_words_kernel[1, 32](dev(ctr), dev(key), out)
    assert (out.copy_to_host() == want).all()


def test_philox_uniforms_match_reference_and_look_uniform(rng):
    n, step, tag, k0, k1 = 40, int(rng.integers(0, 2**32)), 7, int(rng.integers(0, 2**32)), 99
    out = poisoned(4 * n)
    philox.philox_uniform_kernel[2, 16](out, step, tag, k0, k1, n)
    got = out.copy_to_host()
    assert np.array_equal(got, philox.philox_uniform_ref(n, step, tag, k0, k1))
    assert (got >= 0).all() and (got < 1).all()
    big = philox.philox_uniform_ref(20000, 1, 2, 3, 4)
    assert abs(big.mean() - 0.5) < 0.01 and abs(big.var() - 1 / 12) < 0.003


# ---- scan ----

@pytest.mark.parametrize("n,threads,fill", [(1, 32, 1), (127, 32, 127), (1000, 32, 1000), (4500, 64, 4500),
                                            (128, 32, 128), (257, 64, 257), (300, 8, 300), (1000, 32, 333),
                                            (4500, 64, 0)])
def test_scan_any_n(rng, n, threads, fill):
    """The three levels read back as the full inclusive prefix sum; each tile's sub level is the inclusive
    scan of its 32-element sub-tiles' totals; the tile level the scanned tile totals. Elements at or past
    ``fill`` (a ring's empty slots) count as zero whatever they hold."""
    x_dev = rng.uniform(0.01, 2.0, n).astype(np.float32)
    x = x_dev.copy()
    x[fill:] = 0.0
    totals = poisoned(scan.n_subs(n, threads), np.float64)
    sub = poisoned(scan.n_subs(n, threads), np.float64)
    tiles = poisoned(scan.n_tiles(n, threads), np.float64)
    arrivals = dev(np.zeros(1, np.int32))
    scan.launch_scan(dev(x_dev), totals, sub, tiles, n, threads, arrivals, dev(np.array([fill])))
    assert arrivals.copy_to_host()[0] == 0  # left at zero for the next launch
    got_sub, got_tiles = sub.copy_to_host(), tiles.copy_to_host()
    np.testing.assert_allclose(scan.three_level_ref(x, got_sub, got_tiles, threads), scan.inclusive_scan_ref(x),
                               rtol=1e-12)
    spt, padded = scan.subs_per_tile(threads), np.zeros(scan.n_subs(n, threads) * scan.SUB)
    padded[:n] = x
    sub_totals = padded.reshape(-1, scan.SUB).sum(axis=1).reshape(-1, spt)
    np.testing.assert_allclose(got_sub, np.cumsum(sub_totals, axis=1).reshape(-1), rtol=1e-12)
    np.testing.assert_allclose(got_tiles, np.cumsum(sub_totals.sum(axis=1)), rtol=1e-12)
    np.testing.assert_allclose(totals.copy_to_host(), sub_totals.reshape(-1), rtol=1e-12)


def _full_scan(x, n, threads, fill):
    """A full scan of ``x`` (host float32) into fresh poisoned levels: (totals, sub, tiles) on the device."""
    lv = (poisoned(scan.n_subs(n, threads), np.float64), poisoned(scan.n_subs(n, threads), np.float64),
          poisoned(scan.n_tiles(n, threads), np.float64))
    scan.launch_scan(dev(x), *lv, n, threads, dev(np.zeros(1, np.int32)), dev(np.array([fill])))
    return lv


@pytest.mark.parametrize("n,threads,fill,batch", [(1000, 32, 1000, 40), (4500, 64, 3000, 96), (300, 8, 257, 16),
                                                  (127, 32, 127, 8), (5000, 32, 5000, 1)])
def test_rescan_after_a_batch_matches_a_full_scan_bit_for_bit(rng, n, threads, fill, batch):
    """An update's rescan (the totals of the sub-tiles holding the batch's slots recomputed, the levels
    scanned from the totals) writes the levels and totals a full scan of the new priorities writes, bit for
    bit, over three batches in turn; the batch has duplicates and slots outside the ring, which are skipped."""
    x = np.zeros(n, np.float32)
    x[:fill] = rng.uniform(0.01, 3.0, fill)
    totals, sub, tiles = _full_scan(x, n, threads, fill)
    arrivals, fill_dev = dev(np.zeros(1, np.int32)), dev(np.array([fill]))
    for _ in range(3):
        idx = rng.integers(0, fill, batch)
        idx[rng.integers(0, batch, max(1, batch // 8))] = idx[0]  # duplicates
        if batch > 2:
            idx[1], idx[2] = -5, n + 7  # outside the ring: skipped
        live = idx[(idx >= 0) & (idx < n)]
        x[live] = rng.uniform(0.01, 3.0, len(live)).astype(np.float32)
        x_dev = dev(x)
        sub.copy_to_device(np.full(sub.shape, np.nan))  # the levels are written afresh; only the totals carry over
        tiles.copy_to_device(np.full(tiles.shape, np.nan))
        scan.launch_rescan(x_dev, dev(idx.astype(np.int64)), batch, totals, sub, tiles, n, threads, arrivals, fill_dev)
        assert arrivals.copy_to_host()[0] == 0
        want = [a.copy_to_host() for a in _full_scan(x, n, threads, fill)]
        for name, got, w in zip(("totals", "sub", "tiles"), (totals, sub, tiles), want):
            assert np.array_equal(got.copy_to_host(), w), f"{name} differ from a full scan's"


def test_scan_refuses_a_block_it_cannot_split():
    with pytest.raises(ValueError, match="multiple of 8"):
        scan.launch_scan(dev(np.ones(10, np.float32)), poisoned(4, np.float64), poisoned(4, np.float64),
                         poisoned(4, np.float64), 10, 12, dev(np.zeros(1, np.int32)), dev(np.array([10])))


# ---- PER ----

@cuda.jit
def _first_above_probe(level, los, his, spans, base, thrs, out):
    """One search of ``per._first_above`` per group of ``nb.VOTE`` threads (as the draw's warps)."""
    lanes = per.VOTE
    g = cuda.grid(1)
    k = min(g // lanes, los.shape[0] - 1)  # the block's last groups repeat the last search: every lane votes
    r = per._first_above(level, los[k], his[k], spans[k], base, thrs[k], g % lanes, lanes,
                         per._levels(spans[k], lanes))
    if g % lanes == 0 and g // lanes < los.shape[0]:
        out[g // lanes] = r


def test_the_draws_many_lane_search_finds_what_a_binary_search_finds(rng):
    """``_first_above`` (the draw's 32-ary search; 8-ary in the simulator) on a non-decreasing level with
    runs of ties: for ranges of every length up to three levels deep and thresholds below, on, between
    and above its values, the first index in [lo, hi) whose base + value exceeds the threshold, else hi."""
    n = 700
    level = np.cumsum(rng.integers(0, 3, n)).astype(np.float64)  # steps of 0 make ties
    base = 0.5
    los, his, thrs = [], [], []
    for _ in range(96):
        lo = int(rng.integers(0, n))
        hi = int(rng.integers(lo, min(n, lo + per.VOTE ** 3)))
        pick = rng.integers(0, 4)
        v = base + level[int(rng.integers(lo, hi + 1)) if hi < n else lo]
        thrs.append([base + level[lo] - 1, v, v + 0.5, base + level[hi] + 1][pick] if hi < n else v)
        los.append(lo)
        his.append(hi)
    los, his, thrs = (np.array(x) for x in (los, his, thrs))
    spans = np.array([int(h - lo + 1 + rng.integers(0, 5)) for lo, h in zip(los, his)])  # a span may exceed
    out = poisoned(len(los), np.int64)
    tpb = 4 * per.VOTE
    _first_above_probe[(len(los) * per.VOTE + tpb - 1) // tpb, tpb](dev(level), dev(los), dev(his), dev(spans), base,
                                                                   dev(thrs), out)
    want = [next((i for i in range(lo, hi) if base + level[i] > t), hi) for lo, hi, t in zip(los, his, thrs)]
    got = out.copy_to_host()
    wrong = [(lo, hi, t, g, w) for lo, hi, t, g, w in zip(los, his, thrs, got, want) if g != w]
    assert not wrong, wrong


@pytest.mark.parametrize("threads", [8, 32])
def test_per_sampling_weights_and_bounds(rng, threads):
    """Sampling from the scan's three levels (tiles of 32 and 128 priorities, sub-tiles of 32, over a
    257-slot fill): the same indices as the reference's search of the full prefix sum."""
    cap, size, batch = 300, 257, 64
    prio = np.zeros(cap, np.float32)
    prio[:size] = rng.uniform(0.05, 3.0, size)
    prio[rng.integers(0, size, 5)] = 0.0  # empty slots inside the fill are never drawn
    sub, tiles = poisoned(scan.n_subs(cap, threads), np.float64), poisoned(scan.n_tiles(cap, threads), np.float64)
    arrivals, prio_dev = dev(np.zeros(2, np.int32)), dev(prio)
    scan.launch_scan(prio_dev, poisoned(scan.n_subs(cap, threads), np.float64), sub, tiles, cap, threads,
                     arrivals[0:1], dev(np.array([size])))
    idx, w = poisoned(batch, np.int64), poisoned(batch)
    k0, k1, step = int(rng.integers(0, 2**32)), 5, int(rng.integers(0, 1000))
    step_dev = dev(np.array([step]))
    per.per_sample_kernel[per.sample_launch(batch)](prio_dev, sub, tiles, scan.subs_per_tile(threads),
                                                    dev(np.array([size])), batch, 0.4, k0, k1, step_dev,
                                                    dev(np.zeros(1, np.int32)), idx, w, arrivals[1:2])
    assert not arrivals.copy_to_host().any()
    assert step_dev.copy_to_host()[0] == step + 1  # the draw advanced the update counter and used its new value
    ref_idx, ref_w = per.per_sample_ref(prio, size, batch, 0.4, k0, k1, step + 1)
    got_idx = idx.copy_to_host()
    assert (got_idx >= 0).all() and (got_idx < size).all()
    assert np.array_equal(got_idx, ref_idx)
    assert (prio[got_idx] > 0).all()
    np.testing.assert_allclose(w.copy_to_host(), ref_w, rtol=1e-5)


def test_priority_update_duplicates_and_out_of_range(rng):
    cap, batch = 50, 32
    prio0 = rng.uniform(0.1, 1.0, cap).astype(np.float32)
    idx = rng.integers(0, cap, batch).astype(np.int64)
    idx[3] = idx[20]  # a duplicate: batch position 20 must win
    idx[5], idx[9] = -1, cap + 4  # out of range: skipped and counted
    td = rng.normal(0, 2, batch).astype(np.float32)
    p, owner, bad, mx = dev(prio0), dev(np.full(cap, -1, np.int32)), dev(np.zeros(1, np.int32)), dev(np.zeros(1, np.float32))
    tripped = dev(np.ones(1, np.int32))
    per.priority_update_kernel[1, 16](p, dev(idx), dev(td), owner, batch, cap, 0.6, 1e-3, mx, tripped, bad)
    assert np.array_equal(p.copy_to_host(), prio0) and mx.copy_to_host()[0] == 0  # the guard tripped: no write
    assert (owner.copy_to_host() == -1).all() and bad.copy_to_host()[0] == 2
    # 16 threads for 32 samples: each thread claims, writes and releases two, the phases between barriers
    per.priority_update_kernel[1, 16](p, dev(idx), dev(td), owner, batch, cap, 0.6, 1e-3, mx, dev(np.zeros(1, np.int32)),
                                      bad)
    want, want_bad = per.priority_update_ref(prio0, idx, td, 0.6, 1e-3)
    np.testing.assert_allclose(p.copy_to_host(), want, rtol=1e-6)
    ring = prio0.copy()  # the CPU trainer's form: written into its own ring, the same priorities
    assert per.priority_update_ref(ring, idx, td, 0.6, 1e-3, out=ring)[0] is ring and np.array_equal(ring, want)
    assert not np.array_equal(want, prio0)  # the default left its input as it was
    assert bad.copy_to_host()[0] == 2 * want_bad == 4
    assert (owner.copy_to_host() == -1).all()
    winners = {int(j): i for i, j in enumerate(idx) if 0 <= j < cap}  # the last batch position of each index
    written = np.array(sorted(winners.values()))
    assert 3 not in written and winners[int(idx[20])] >= 20
    assert mx.copy_to_host()[0] == pytest.approx(((np.abs(td[written]) + 1e-3) ** 0.6).max(), rel=1e-6)


def test_replay_ring_insert_wraps(rng):
    cap, n_new = 10, 4
    ints, floats = poisoned((cap, 3), np.int32), poisoned((cap, 2))
    prio, mx = poisoned(cap), dev(np.array([2.5], np.float32))
    ptr, size = dev(np.array([8])), dev(np.array([8]))
    new_i = rng.integers(0, 1000, (n_new, 3)).astype(np.int32)
    new_f = rng.normal(size=(n_new, 2)).astype(np.float32)
    per.replay_insert_kernel[1, 32](ints, floats, dev(new_i), dev(new_f), prio, mx, ptr, size, n_new, cap)
    per.replay_advance_kernel[1, 1](ptr, size, n_new, cap)
    slots = [8, 9, 0, 1]
    assert (ints.copy_to_host()[slots] == new_i).all() and np.allclose(floats.copy_to_host()[slots], new_f)
    assert (prio.copy_to_host()[slots] == 2.5).all()
    assert ptr.copy_to_host()[0] == 2 and size.copy_to_host()[0] == 10


# ---- optimiser ----

def _norm_guard(g, loss, w, q, q_limit, guard, stats, blocks=4, threads=32, max_norm=5.0):
    """grad_norm_guard_kernel on fresh (poisoned) partials and clip; returns (clip, arrivals) on the host."""
    parts, clip, arrivals = poisoned(blocks, np.float64), poisoned(2), dev(np.zeros(1, np.int32))
    optim.grad_norm_guard_kernel[blocks, threads](dev(g), len(g), parts, arrivals, max_norm, clip, dev(loss), dev(w),
                                                  len(loss), dev(q), q.shape[0], q_limit, guard, stats)
    return clip.copy_to_host(), arrivals.copy_to_host()


def test_grad_norm_adam_ema(rng):
    n = 1000
    g = rng.normal(0, 3, n).astype(np.float32)
    loss, w = rng.uniform(0, 2, 8).astype(np.float32), rng.uniform(0.1, 1, 8).astype(np.float32)
    got, arrivals = _norm_guard(g, loss, w, rng.normal(size=(8, 9)).astype(np.float32), 100.0,
                                dev(np.zeros(1, np.int32)), dev(np.zeros(4, np.float32)))
    norm, scale = optim.grad_norm_ref(g, 5.0)
    assert got[0] == pytest.approx(norm, rel=1e-6) and got[1] == pytest.approx(scale, rel=1e-6) and scale < 1
    assert arrivals[0] == 0  # left at zero for the next launch
    clip = dev(got)
    p0, m0 = rng.normal(size=n).astype(np.float32), rng.normal(0, 0.1, n).astype(np.float32)
    v0 = rng.uniform(0, 0.1, n).astype(np.float32)
    t0 = rng.normal(size=n).astype(np.float32)
    p, m, v, t, step = dev(p0), dev(m0), dev(v0), dev(t0), dev(np.array([6]))
    optim.step_increment_kernel[1, 1](step)
    guard_on = dev(np.ones(1, np.int32))
    optim.adam_kernel[2, 32](p, dev(g), m, v, n, dev(np.array([1e-3], np.float32)), 0.9, 0.999, 1e-8, 1e-4, step, clip,
                             guard_on, t, 0.005)
    assert np.array_equal(p.copy_to_host(), p0) and np.array_equal(m.copy_to_host(), m0)  # guard tripped: no update
    assert np.array_equal(t.copy_to_host(), t0)
    optim.adam_kernel[2, 32](p, dev(g), m, v, n, dev(np.array([1e-3], np.float32)), 0.9, 0.999, 1e-8, 1e-4, step, clip,
                             dev(np.zeros(1, np.int32)), t, 0.005)
    rp, rm, rv = optim.adam_ref(p0, g, m0, v0, 1e-3, 0.9, 0.999, 1e-8, 1e-4, 7, got[1])
    np.testing.assert_allclose(p.copy_to_host(), rp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.copy_to_host(), rm, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(v.copy_to_host(), rv, rtol=1e-5, atol=1e-8)
    # the target averages the weights Adam just wrote. atol: where t and p nearly cancel the GPU's fused
    # multiply-add rounds once, the float64 reference's float32 result twice (seen on the H200: 2.3e-10
    # apart at a value of -2.9e-5, operands ~1)
    np.testing.assert_allclose(t.copy_to_host(), optim.ema_ref(t0, p.copy_to_host(), 0.005), rtol=1e-6, atol=1e-7)


def test_adam_bf16_writes_the_float32_update_and_its_bfloat16_copies(rng):
    """``adam_bf16_kernel``: the weights, moments and target exactly what ``adam_kernel`` writes from the
    same inputs, and the bfloat16 copies (poisoned first) exactly the new weights and target rounded
    (``to_bf16_ref``); with the guard tripped nothing is written, the copies included."""
    n = 1000
    g = rng.normal(0, 3, n).astype(np.float32)
    p0, m0 = rng.normal(size=n).astype(np.float32), rng.normal(0, 0.1, n).astype(np.float32)
    v0, t0 = rng.uniform(0, 0.1, n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    lr, clip = dev(np.array([1e-3], np.float32)), dev(np.array([4.0, 0.5], np.float32))
    out = {}
    for kind in ("float32", "bf16", "bf16 tripped"):
        p, m, v, t, step = dev(p0), dev(m0), dev(v0), dev(t0), dev(np.array([7]))
        guard = dev(np.array([int(kind == "bf16 tripped")], np.int32))
        args = (p, dev(g), m, v, n, lr, 0.9, 0.999, 1e-8, 1e-4, step, clip, guard, t, 0.005)
        if kind == "float32":
            optim.adam_kernel[2, 32](*args)
        else:
            p16, t16 = poisoned(n, np.uint16), poisoned(n, np.uint16)
            optim.adam_bf16_kernel[2, 32](*args, p16, t16)
        out[kind] = [a.copy_to_host() for a in (p, m, v, t)] + ([p16.copy_to_host(), t16.copy_to_host()]
                                                               if kind != "float32" else [])
    for a, b in zip(out["float32"], out["bf16"]):
        assert np.array_equal(a, b)
    assert not np.array_equal(out["bf16"][0], p0)  # the update moved the weights
    assert np.array_equal(out["bf16"][4], bf16.to_bf16_ref(out["bf16"][0]))
    assert np.array_equal(out["bf16"][5], bf16.to_bf16_ref(out["bf16"][3]))
    tripped = out["bf16 tripped"]
    assert all(np.array_equal(a, b) for a, b in zip(tripped[:4], (p0, m0, v0, t0)))
    assert np.array_equal(tripped[4], poisoned(n, np.uint16).copy_to_host())  # the copies left as they were


def test_the_draw_stops_the_update_counter_once_the_guard_trips(rng):
    """The PER draw advances the update counter (its Philox counter) by one per update, in the launch's
    last block, unless the guard has tripped: then it keeps it and draws with it as it stands."""
    cap, size, batch, threads = 64, 64, 16, 32
    prio = dev(rng.uniform(0.1, 1.0, cap).astype(np.float32))
    sub, tiles = poisoned(scan.n_subs(cap, threads), np.float64), poisoned(scan.n_tiles(cap, threads), np.float64)
    arrivals, fill = dev(np.zeros(2, np.int32)), dev(np.array([size]))
    scan.launch_scan(prio, poisoned(scan.n_subs(cap, threads), np.float64), sub, tiles, cap, threads, arrivals[0:1],
                     fill)
    step, draws = dev(np.array([41], np.int64)), []
    for guard in (0, 1, 0):
        idx = poisoned(batch, np.int64)
        per.per_sample_kernel[per.sample_launch(batch)](prio, sub, tiles, scan.subs_per_tile(threads), fill, batch, 0.4,
                                                        3, 5, step, dev(np.array([guard], np.int32)), idx,
                                                        poisoned(batch), arrivals[1:2])
        draws.append((int(step.copy_to_host()[0]), idx.copy_to_host()))
    assert [d[0] for d in draws] == [42, 42, 43]  # after a trip an update changes nothing that lasts
    assert np.array_equal(draws[0][1], draws[1][1]) and not np.array_equal(draws[1][1], draws[2][1])


def test_training_guard(rng):
    """The guard, run by the grad norm's last block: the step's statistics when all is finite, a trip (and
    nothing accumulated) on a non-finite loss, a non-finite gradient or |Q| over the limit."""
    B, n_q = 16, 8
    g = rng.normal(0, 1, 300).astype(np.float32)
    loss = rng.uniform(0, 2, B).astype(np.float32)
    w = rng.uniform(0.1, 1, B).astype(np.float32)
    q = rng.normal(size=(n_q, 9)).astype(np.float32)
    guard, stats = dev(np.zeros(1, np.int32)), dev(np.zeros(4, np.float32))
    clip, _ = _norm_guard(g, loss, w, q, 100.0, guard, stats, blocks=3)
    st = stats.copy_to_host()
    assert guard.copy_to_host()[0] == 0
    assert st[0] == pytest.approx(np.sum(w * loss) / B, rel=1e-5) and st[1] == clip[0] and st[2] == 1.0
    assert clip[0] == pytest.approx(optim.grad_norm_ref(g, 5.0)[0], rel=1e-6)
    assert st[3] == pytest.approx(np.abs(q).max())
    loss[4] = np.inf
    _norm_guard(g, loss, w, q, 100.0, guard, stats)
    assert guard.copy_to_host()[0] == 1 and stats.copy_to_host()[2] == 1.0  # tripped, nothing accumulated
    loss[4] = 1.0
    g2 = dev(np.zeros(1, np.int32))
    _norm_guard(g, loss, w, q * 1e3, 100.0, g2, stats)
    assert g2.copy_to_host()[0] == 1  # exploding Q
    g3, bad_g = dev(np.zeros(1, np.int32)), g.copy()
    bad_g[7] = np.nan
    _norm_guard(bad_g, loss, w, q, 100.0, g3, stats)
    assert g3.copy_to_host()[0] == 1 and stats.copy_to_host()[2] == 1.0  # a non-finite gradient


# ---- dense ----

@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1)])
def test_gemm_transposes_and_beta(rng, ta, tb):
    M, N, K = 70, 9, 37  # ragged on every axis, 2x1 tiles
    A = rng.normal(size=(K, M) if ta else (M, K)).astype(np.float32)
    B = rng.normal(size=(N, K) if tb else (K, N)).astype(np.float32)
    C0 = rng.normal(size=(M, N)).astype(np.float32)
    C = dev(C0)
    dense.gemm_kernel[dense.gemm_grid(M, N), dense.THREADS](dev(A), dev(B), C, M, N, K, ta, tb, 0.7, 0.5)
    np.testing.assert_allclose(C.copy_to_host(), dense.gemm_ref(A, B, C0, ta, tb, 0.7, 0.5), rtol=1e-4, atol=1e-4)
    P = poisoned((M, N))
    dense.gemm_kernel[dense.gemm_grid(M, N), dense.THREADS](dev(A), dev(B), P, M, N, K, ta, tb, 1.0, 0.0)
    np.testing.assert_allclose(P.copy_to_host(), dense.gemm_ref(A, B, C0, ta, tb, 1.0, 0.0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1)])
def test_gemm_on_bf16_operands(rng, ta, tb):
    """The Numba GEMM on bfloat16 operands (uint16 bits) equals the float32 GEMM of the same values widened
    (each bfloat16 is a float32 exactly), so the float64 product of the rounded inputs to float32's error;
    the same GEMM on float32 operands from the same register tiles."""
    M, N, K = 70, 9, 37
    A = rng.normal(size=(K, M) if ta else (M, K)).astype(np.float32)
    B = rng.normal(size=(N, K) if tb else (K, N)).astype(np.float32)
    A16, B16 = bf16.to_bf16_ref(A), bf16.to_bf16_ref(B)
    wide_a, wide_b = bf16.from_bf16_ref(A16), bf16.from_bf16_ref(B16)
    zero = np.zeros((M, N), np.float32)
    P = poisoned((M, N))
    dense.gemm_bf16_kernel[dense.gemm_grid(M, N), dense.THREADS](dev(A16), dev(B16), P, M, N, K, ta, tb, 1.0, 0.0)
    got = P.copy_to_host()
    np.testing.assert_allclose(got, dense.gemm_ref(wide_a, wide_b, zero, ta, tb, 1.0, 0.0), rtol=1e-4, atol=1e-4)
    Q = poisoned((M, N))
    dense.gemm_kernel[dense.gemm_grid(M, N), dense.THREADS](dev(wide_a), dev(wide_b), Q, M, N, K, ta, tb, 1.0, 0.0)
    assert np.array_equal(got, Q.copy_to_host())  # the same sums in the same order
    assert not np.allclose(got, dense.gemm_ref(A, B, zero, ta, tb, 1.0, 0.0), rtol=1e-4, atol=1e-4)  # bf16 inputs
    if (ta, tb) == (0, 0):  # the GEMM backend's contract picks the kernel by the operands' type
        from workbench.agent.gemm import NumbaGemm
        from workbench.device import Device

        R = poisoned((M, N))
        NumbaGemm(Device()).gemm(dev(A16), dev(B16), R)
        assert np.array_equal(R.copy_to_host(), got)


def test_bias_relu_to_bf16_and_backward_from_bf16(rng):
    """A bf16 layer's unfused epilogues: bias + ReLU of a float32 GEMM output written as bfloat16 (one
    rounding, of the float32 result: the reference's bits exactly), and the backward reading those
    bfloat16 activations for the ReLU's gradient, which then equals the float32 kernel's on the same
    values widened bit for bit (dY in place and the bias gradient), zeros and negatives included."""
    M, N = 45, 21
    Y0 = rng.normal(size=(M, N)).astype(np.float32)
    Y0[rng.random((M, N)) < 0.1] = 0.0
    b = rng.normal(size=N).astype(np.float32)
    out = poisoned((M, N), np.uint16)
    grid, tpb = dense.bias_act_launch(M, N, SIMULATOR)
    dense.bias_act_bf16_kernel[grid, tpb](dev(Y0), dev(b), out, M, N, dense.ACT_RELU)
    h16 = out.copy_to_host()
    assert np.array_equal(h16, bf16.to_bf16_ref(np.maximum(Y0 + b, np.float32(0))))
    wide = bf16.from_bf16_ref(h16)
    grid, block = dense.bias_backward_launch(N, SIMULATOR)
    arrivals = dev(np.zeros(grid[0], np.int32))
    dY0 = rng.normal(size=(M, N)).astype(np.float32)
    got = {}
    for name, k, y in (("bf16", dense.bias_act_backward_bf16_kernel, dev(h16)),
                       ("fp32", dense.bias_act_backward_kernel, dev(wide))):
        dY, db, partial = dev(dY0), poisoned(N), poisoned((grid[1], N))
        k[grid, block](dY, y, db, M, N, dense.ACT_RELU, partial, arrivals)
        got[name] = (dY.copy_to_host(), db.copy_to_host())
    want_d, want_db = dense.bias_act_backward_ref(dY0, wide, dense.ACT_RELU)
    np.testing.assert_allclose(got["bf16"][0], want_d, rtol=1e-6)
    np.testing.assert_allclose(got["bf16"][1], want_db, rtol=1e-5, atol=1e-6)
    for a, c in zip(got["bf16"], got["fp32"]):
        assert np.array_equal(a, c)


@pytest.mark.parametrize("bwd_launch", [None, ((4, 16), 2), ((8, 2), 5)])  # the launch's own; other shapes
def test_bias_relu_and_backward(rng, bwd_launch):
    """Bias + ReLU, and its backward: the ReLU's gradient in place and the bias gradient, summed over row
    slices by blocks of their own and added by the last block of each column tile; the arrival counts
    are left at zero, so a second launch (a graph replayed) gives the same sums bit for bit."""
    M, N = 45, 21
    Y0 = rng.normal(size=(M, N)).astype(np.float32)
    b = rng.normal(size=N).astype(np.float32)
    Y = dev(Y0)
    grid, tpb = dense.bias_act_launch(M, N, SIMULATOR)
    dense.bias_act_kernel[grid, tpb](Y, dev(b), M, N, dense.ACT_RELU)
    post = Y.copy_to_host()
    np.testing.assert_allclose(post, dense.bias_act_ref(Y0, b, dense.ACT_RELU), rtol=1e-6)
    grid, block = dense.bias_backward_launch(N, SIMULATOR)
    if bwd_launch is not None:
        block, slices = bwd_launch
        grid = ((N + block[0] - 1) // block[0], slices)
    arrivals = dev(np.zeros(grid[0], np.int32))
    for act in (dense.ACT_RELU, dense.ACT_IDENTITY):  # 45 rows: unrolled chains and tails both run
        dY0 = rng.normal(size=(M, N)).astype(np.float32)
        want_d, want_db = dense.bias_act_backward_ref(dY0, post, act)
        sums = []
        for _ in range(2):
            dY, db, partial = dev(dY0), poisoned(N), poisoned((grid[1], N))
            dense.bias_act_backward_kernel[grid, block](dY, dev(post), db, M, N, act, partial, arrivals)
            np.testing.assert_allclose(dY.copy_to_host(), want_d, rtol=1e-6)
            np.testing.assert_allclose(db.copy_to_host(), want_db, rtol=1e-5, atol=1e-6)
            assert not arrivals.copy_to_host().any()
            sums.append(db.copy_to_host())
        assert np.array_equal(sums[0], sums[1])


# ---- C51 head and loss ----

BRANCHES = np.array([3, 3, 3], np.int32)
OFFSETS = np.array([0, 3, 6], np.int32)


def _head(rng, B, atoms):
    return rng.normal(0, 1.5, (B, atoms * (1 + BRANCHES.sum()))).astype(np.float32)


@pytest.mark.parametrize("atoms", [11, 51, 101])  # a lane holds 1, 2 or 4 atoms
def test_dueling_head_matches_reference(rng, atoms):
    B = 4
    head = _head(rng, B, atoms)
    bias = rng.normal(0, 0.5, head.shape[1]).astype(np.float32)  # the head layer's bias (the GEMM's epilogue adds it)
    support = np.linspace(-2, 2, atoms).astype(np.float32)
    logp, q = poisoned((B, 9, atoms)), poisoned((B, 9))
    grid, block = c51.head_launch(B, atoms, 3)
    c51.head_kernel(atoms, BRANCHES)[grid, block](dev(head + bias), B, dev(support), logp, 1, q)
    rl, rq = c51.dueling_head_ref((head + bias).astype(np.float64), list(BRANCHES), atoms, support)
    np.testing.assert_allclose(logp.copy_to_host(), rl, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(q.copy_to_host(), rq, rtol=1e-4, atol=1e-5)
    # acting reads Q alone: no log-probabilities written (the array passed is never touched), the same Q
    unused, q2 = poisoned((1, 1, 1)), poisoned((B, 9))
    c51.head_kernel(atoms, BRANCHES)[grid, block](dev(head + bias), B, dev(support), unused, 0, q2)
    assert np.isnan(unused.copy_to_host()).all()
    assert np.array_equal(q2.copy_to_host(), q.copy_to_host())


def _dueling_head_plain(head, branch_sizes, atoms, support):
    """The dueling head's formula, branch by branch, as first written: the spec ``c51.dueling_head_ref``
    (the CPU backend's head, in a faster form) must equal bit for bit."""
    B = head.shape[0]
    V = head[:, :atoms]
    A_tot = sum(branch_sizes)
    adv = head[:, atoms:].reshape(B, A_tot, atoms)
    logp = np.empty((B, A_tot, atoms), np.float64)
    off = 0
    for n in branch_sizes:
        a = adv[:, off:off + n]
        logits = V[:, None, :] + a - a.mean(axis=1, keepdims=True)
        mx = logits.max(axis=2, keepdims=True)
        logp[:, off:off + n] = logits - mx - np.log(np.exp(logits - mx).sum(axis=2, keepdims=True))
        off += n
    return logp, (np.exp(logp) * support).sum(axis=2)


def test_the_dueling_head_reference_is_its_plain_formula_bit_for_bit(rng):
    shapes = [(21, (3, 3, 3)), (51, (3, 3, 3)), (2, (1,)), (8, (2, 5)), (101, (4, 4)), (9, (3, 1, 2, 4))]
    for atoms, sizes in shapes + [(int(rng.integers(2, 60)), tuple(int(x) for x in rng.integers(1, 6, rng.integers(1, 5))))
                                  for _ in range(20)]:
        rows = int(rng.choice([1, 3, 64, 700]))
        head = rng.normal(0, rng.choice([1e-3, 1.0, 30.0]), (rows, atoms * (1 + sum(sizes))))
        support = np.linspace(-rng.uniform(1, 20), rng.uniform(1, 20), atoms).astype(rng.choice([np.float32, np.float64]))
        want, got = _dueling_head_plain(head, sizes, atoms, support), c51.dueling_head_ref(head, list(sizes), atoms, support)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (atoms, sizes, rows)


def _head_loss(head_pair, bias, head_t, bias_t, acts, reward, done, gamma_n, v_min, v_max, atoms, w, sizes, offs,
               support, width):
    """The shape's ``head_loss_kernel`` on poisoned outputs: (online Q of s' [B, A], dhead [B, width], loss [B]);
    the heads' biases added in float32 first (what the head GEMM's epilogue does)."""
    B = head_t.shape[0]
    assert np.array_equal(offs, np.cumsum(sizes) - sizes)  # the kernel derives the offsets from the sizes
    q, dhead, loss = poisoned((B, int(sizes.sum()))), poisoned((B, width)), poisoned(B)
    c51.head_loss_kernel(atoms, tuple(sizes))[c51.loss_launch(B, atoms, len(sizes))](
        dev(head_pair + bias), dev(head_t + bias_t), dev(acts), dev(reward), dev(done), gamma_n, v_min, v_max,
        dev(w), dev(support.astype(np.float32)), 1.0 / B, q, dhead, loss, B)
    return q.copy_to_host(), dhead.copy_to_host(), loss.copy_to_host()


def test_c51_head_loss_unequal_branches_and_padded_rows(rng):
    """Branches of 2, 4 and 3 actions side by side in the block, and gradient rows padded past the last
    action's columns (as the GPU's 16-byte-aligned head): every column written, the padding zero; the
    heads (online on s and s', target on s', each with its bias) computed in the same launch."""
    sizes = np.array([2, 4, 3], np.int32)
    offs = np.array([0, 2, 6], np.int32)
    B, atoms, v_min, v_max, gamma_n = 4, 11, -2.0, 2.0, 0.9
    support = np.linspace(v_min, v_max, atoms)
    W = atoms * (1 + sizes.sum())
    pad = np.zeros((B, 3), np.float32)  # the head GEMM's padding columns: never read
    head, head_next, head_t = (rng.normal(0, 1.5, (B, W)).astype(np.float32) for _ in range(3))
    bias, bias_t = (rng.normal(0, 0.5, W + 3).astype(np.float32) for _ in range(2))
    logp, _ = c51.dueling_head_ref((head + bias[:W]).astype(np.float64), list(sizes), atoms, support)
    _, q_next = c51.dueling_head_ref((head_next + bias[:W]).astype(np.float64), list(sizes), atoms, support)
    logp_t, _ = c51.dueling_head_ref((head_t + bias_t[:W]).astype(np.float64), list(sizes), atoms, support)
    acts = np.stack([rng.integers(0, n, B) for n in sizes], 1).astype(np.int32)
    reward = rng.normal(0, 1.5, B).astype(np.float32)
    done = (rng.random(B) < 0.3).astype(np.float32)
    w = rng.uniform(0.2, 1.0, B).astype(np.float32)
    pair = np.concatenate([np.hstack([head, pad]), np.hstack([head_next, pad])])
    q, got, loss = _head_loss(pair, bias, np.hstack([head_t, pad]), bias_t, acts, reward, done, gamma_n, v_min, v_max,
                              atoms, w, sizes, offs, support, W + 3)
    rd, rloss = c51.c51_loss_ref(logp, q_next, logp_t, acts, reward, done, gamma_n, v_min, v_max, atoms, w,
                                 list(sizes), 1.0 / B)
    np.testing.assert_allclose(q, q_next, rtol=1e-4, atol=1e-5)  # the guard's |Q|: the online network's on s'
    np.testing.assert_allclose(loss, rloss, rtol=1e-4)
    np.testing.assert_allclose(got[:, :W], rd, rtol=1e-3, atol=1e-6)
    assert np.all(got[:, W:] == 0)
    with pytest.raises(ValueError, match="1..4 branches"):  # one shared row per branch
        c51.loss_launch(B, atoms, 5)


def test_head_loss_kernel_is_built_once_a_shape_and_refuses_shapes_it_cannot_hold():
    """One kernel a shape, whatever sequence or integer type names it; a shape past the kernel's shared
    rows or with an empty branch is refused where the kernel is asked for, with the limits named."""
    k = c51.head_loss_kernel(51, (3, 3, 3))
    assert c51.head_loss_kernel(np.int64(51), [3, 3, np.int32(3)]) is k
    assert c51.head_loss_kernel(51, (2, 4, 3)) is not k
    assert k.__name__ == "c51_head_loss_a51_b3x3x3"
    for atoms, sizes, match in ((51, (3, 3, 3, 3, 3), "1..4 branches"), (129, (3,), "at most 128 atoms"),
                                (51, (3, 0), "at least one action"), (1, (3,), "at least 2 atoms")):
        with pytest.raises(ValueError, match=match):
            c51.head_loss_kernel(atoms, sizes)


def test_c51_head_loss_matches_the_head_kernel_bit_for_bit(rng):
    """What the fused launch computes of the heads is what ``head_kernel`` computes (the same device
    functions in the same order): its Q of s' bit for bit, and its loss the one the head's log-probabilities
    give (the reference, fed the head kernel's own float32 outputs)."""
    B, atoms, v_min, v_max, gamma_n = 6, 51, -3.0, 3.0, 0.97
    support = np.linspace(v_min, v_max, atoms).astype(np.float32)
    W = atoms * 10
    pair, head_t = rng.normal(0, 2, (2 * B, W)).astype(np.float32), rng.normal(0, 2, (B, W)).astype(np.float32)
    bias, bias_t = rng.normal(0, 1, W).astype(np.float32), rng.normal(0, 1, W).astype(np.float32)
    outs = []
    for h, bb, rows in ((pair, bias, 2 * B), (head_t, bias_t, B)):
        logp, q = poisoned((rows, 9, atoms)), poisoned((rows, 9))
        grid, block = c51.head_launch(rows, atoms, 3)
        c51.head_kernel(atoms, BRANCHES)[grid, block](dev(h + bb), rows, dev(support), logp, 1, q)
        outs.append((logp.copy_to_host(), q.copy_to_host()))
    (lp, qh), (lpt, _) = outs
    acts = rng.integers(0, 3, (B, 3)).astype(np.int32)
    reward = rng.normal(0, 1.5, B).astype(np.float32)
    done = (rng.random(B) < 0.3).astype(np.float32)
    w = rng.uniform(0.2, 1.0, B).astype(np.float32)
    q, dhead, loss = _head_loss(pair, bias, head_t, bias_t, acts, reward, done, gamma_n, v_min, v_max, atoms, w,
                                BRANCHES, OFFSETS, support, W)
    assert np.array_equal(q.view(np.uint32), qh[B:].view(np.uint32))
    rd, rloss = c51.c51_loss_ref(lp[:B].astype(np.float64), qh[B:], lpt.astype(np.float64), acts, reward, done,
                                 gamma_n, v_min, v_max, atoms, w, list(BRANCHES), 1.0 / B)
    # the kernel projects r + gamma z onto the atoms in float32, the reference in float64: near an atom the
    # split of a probability between two neighbours moves by ~eps32 * (v_max - v_min) / dz, times the gap
    # between their log-probabilities (a few nats here): ~1e-5 of a small loss (seed 2987255932: 2.1e-5 at
    # a loss of 2.11), so an absolute allowance on the batch's scale as for dhead below
    np.testing.assert_allclose(loss, rloss, rtol=1e-5, atol=5e-5 * np.abs(rloss).max())
    # a gradient entry is a difference of probabilities (p - m), so float32 rounding is relative to the
    # largest entries, not to the entry itself: up to 7.7e-6 of the largest over 60 seeds
    np.testing.assert_allclose(dhead, rd, rtol=1e-4, atol=5e-5 * np.abs(rd).max())


def test_c51_loss_gradient_matches_reference_and_finite_differences(rng):
    B, atoms, v_min, v_max, gamma_n = 5, 11, -2.0, 2.0, 0.97
    support = np.linspace(v_min, v_max, atoms)
    head, head_next, head_t = _head(rng, B, atoms), _head(rng, B, atoms), _head(rng, B, atoms)
    zero = np.zeros(head.shape[1], np.float32)  # biases: zero here (the test above adds them)
    logp, _ = c51.dueling_head_ref(head.astype(np.float64), list(BRANCHES), atoms, support)
    _, q_next = c51.dueling_head_ref(head_next.astype(np.float64), list(BRANCHES), atoms, support)
    logp_t, _ = c51.dueling_head_ref(head_t.astype(np.float64), list(BRANCHES), atoms, support)
    acts = rng.integers(0, 3, (B, 3)).astype(np.int32)
    acts[0, 1] = 7  # out of range: clamped to 2
    reward = rng.normal(0, 1.5, B).astype(np.float32)  # some targets fall outside [v_min, v_max]
    done = (rng.random(B) < 0.3).astype(np.float32)
    w = rng.uniform(0.2, 1.0, B).astype(np.float32)
    _, got, loss = _head_loss(np.concatenate([head, head_next]), zero, head_t, zero, acts, reward, done, gamma_n, v_min,
                              v_max, atoms, w, BRANCHES, OFFSETS, support, head.shape[1])
    rd, rloss = c51.c51_loss_ref(logp, q_next, logp_t, acts, reward, done, gamma_n, v_min, v_max, atoms, w,
                                 list(BRANCHES), 1.0 / B)
    np.testing.assert_allclose(loss, rloss, rtol=1e-4)
    np.testing.assert_allclose(got, rd, rtol=1e-3, atol=1e-6)

    def total(h):  # the scalar whose gradient the kernel writes: mean_b w_b * loss_b
        lp, _ = c51.dueling_head_ref(h, list(BRANCHES), atoms, support)
        _, l = c51.c51_loss_ref(lp, q_next, logp_t, acts, reward, done, gamma_n, v_min, v_max, atoms, w,
                                list(BRANCHES), 1.0 / B)
        return float(np.sum(w * l) / B)

    h0 = head.astype(np.float64)
    for _ in range(6):
        i, j = rng.integers(0, B), rng.integers(0, head.shape[1])
        e = np.zeros_like(h0)
        e[i, j] = 1e-5
        fd = (total(h0 + e) - total(h0 - e)) / 2e-5
        assert rd[i, j] == pytest.approx(fd, rel=1e-4, abs=1e-7)


# ---- actions and Q stats ----

def test_eps_greedy_greedy_random_and_clamped(rng):
    N = 40
    q = rng.normal(size=(N, 9)).astype(np.float32)
    acts, joint = poisoned((N, 3), np.int32), poisoned(N, np.int32)
    step = dev(np.array([3]))
    actions.eps_greedy_kernel[2, 32](dev(q), 3, dev(BRANCHES), dev(OFFSETS), dev(np.array([0.0], np.float32)),
                                     1, 2, step, acts, joint, N)
    got = acts.copy_to_host()
    assert (got == actions.greedy_ref(q, list(BRANCHES))).all()
    assert (actions.decode_joint_ref(joint.copy_to_host(), list(BRANCHES)) == got).all()
    actions.eps_greedy_kernel[2, 32](dev(q), 3, dev(BRANCHES), dev(OFFSETS), dev(np.array([1.0], np.float32)),
                                     1, 2, step, acts, joint, N)
    rnd = acts.copy_to_host()
    assert (rnd >= 0).all() and (rnd <= 2).all() and len(np.unique(rnd)) == 3
    assert (joint.copy_to_host() >= 0).all() and (joint.copy_to_host() < 27).all()


def test_q_stats(rng):
    q = rng.normal(size=(37, 9)).astype(np.float32)
    out = poisoned(4)
    actions.q_stats_kernel[1, 32](dev(q), 37, 9, dev(BRANCHES), dev(OFFSETS), 3, out)
    # the mean of 333 unit-scale values may lie near zero: its float32 rounding is absolute, about 1e-8 of
    # the values' scale, not relative to the mean (seed 2215607016: a mean of -3.5e-4 off by 5e-9)
    np.testing.assert_allclose(out.copy_to_host(), actions.q_stats_ref(q, list(BRANCHES)), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_every_kernel_compiles_to_sm90_ptx():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    p = subprocess.run([sys.executable, "-m", "cuda_kernels.ptx_check"], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert " 0 failed" in p.stdout
