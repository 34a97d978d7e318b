"""``workbench.cublaslt``'s planning on a machine without a GPU: nvmath-python's cuBLASLt bindings replaced by a
recording stand-in, so what the GPU path asks of cuBLASLt (the heuristic once per problem, the SM count target,
which of the heuristic's algorithms runs, the ``PICKS`` experiments) is checked in CI."""
from __future__ import annotations

import ctypes
import sys
import types
from enum import IntEnum

import numpy as np
import pytest

from workbench import cublaslt
from workbench.cublaslt import PLAIN, RELU_BIAS, CublasLt, EpilogueUnavailable

ITEM = 1024  # the stand-in's bytes per heuristic result (cuBLASLt's struct is smaller: any size will do)


class FakeLt(types.ModuleType):
    """The calls of ``nvmath.bindings.cublasLt`` that ``CublasLt`` makes, recorded; its heuristic offers
    ``offers`` algorithms."""

    MatmulPreferenceAttribute = IntEnum("MatmulPreferenceAttribute", "MAX_WORKSPACE_BYTES")
    MatmulDescAttribute = IntEnum("MatmulDescAttribute", "TRANSA TRANSB EPILOGUE BIAS_POINTER BIAS_DATA_TYPE "
                                                         "SM_COUNT_TARGET EPILOGUE_AUX_POINTER EPILOGUE_AUX_LD")
    Epilogue = IntEnum("Epilogue", "DEFAULT RELU_BIAS RELU_AUX_BIAS BIAS DRELU_BGRAD")
    matmul_heuristic_result_dtype = np.dtype((np.void, ITEM))

    def __init__(self, offers: int):
        super().__init__("nvmath.bindings.cublasLt")
        self.offers, self.asked, self.runs, self.descs = offers, [], [], []

    class MatmulHeuristicResult:
        def __init__(self, n):
            self.buf = np.zeros(n * ITEM, np.uint8)
            self.ptr = self.buf.ctypes.data

    def create(self):
        return 1

    def matmul_preference_create(self):
        return 2

    def matmul_desc_create(self, compute, scale):
        self.descs.append({})
        return len(self.descs) - 1

    def matrix_layout_create(self, *shape):
        return shape

    def get_matmul_preference_attribute_dtype(self, attr):
        return np.uint64

    get_matmul_desc_attribute_dtype = get_matmul_preference_attribute_dtype

    def matmul_preference_set_attribute(self, obj, attr, ptr, nbytes):
        pass

    def matmul_desc_set_attribute(self, desc, attr, ptr, nbytes):
        self.descs[desc][attr.name] = int(np.frombuffer(ctypes.string_at(ptr, nbytes), np.uint64)[0])

    def matmul_algo_get_heuristic(self, handle, desc, a, b, c, d, pref, requested, results, count):
        self.asked.append((desc, requested))
        ctypes.c_int32.from_address(count).value = min(requested, self.offers)

    def matmul(self, handle, desc, alpha, a, la, b, lb, beta, c, lc, d, ld, algo, ws, ws_size, stream):
        self.runs.append((desc, algo))

    def matrix_layout_destroy(self, lay):
        pass

    matmul_desc_destroy = matmul_preference_destroy = matrix_layout_destroy


@pytest.fixture
def lt(monkeypatch):
    """A ``CublasLt`` on the stand-in (three algorithms offered), with an empty heuristic cache and no picks."""
    fake = FakeLt(offers=3)
    cublas = types.SimpleNamespace(ComputeType=IntEnum("ComputeType", "COMPUTE_32F COMPUTE_32F_FAST_TF32"))
    bindings = types.SimpleNamespace(cublas=cublas, cublasLt=fake)
    monkeypatch.setitem(sys.modules, "nvmath", types.SimpleNamespace(bindings=bindings))
    monkeypatch.setitem(sys.modules, "nvmath.bindings", bindings)
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cublasLt", fake)
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cublas", cublas)
    monkeypatch.setattr(cublaslt, "_HEURISTICS", {})
    monkeypatch.setattr(cublaslt, "PICKS", {})
    monkeypatch.setattr(cublaslt, "device_pointer", lambda a: a.ctypes.data)
    device = types.SimpleNamespace(info=types.SimpleNamespace(name="Fake GPU", multiprocessors=132), raw_stream=0)
    return CublasLt(device, np.zeros(64, np.uint8), "tf32"), fake


def _operands(M=64, N=32, K=16):
    return np.zeros((M, K), np.float32), np.zeros((K, N), np.float32), np.zeros((M, N), np.float32)


def test_the_heuristics_first_algorithm_once_per_problem(lt):
    blas, fake = lt
    A, B, C = _operands()
    for _ in range(2):
        blas.matmul(A, B, C, 0, 0, PLAIN, None, target=16)
    assert fake.asked == [(0, 1)]  # one question for one algorithm
    assert [algo for _, algo in fake.runs] == [blas.plans[next(iter(blas.plans))][4].ptr] * 2  # the first result
    blas.matmul(*_operands(), 0, 0, PLAIN, None, target=16)  # another agent's buffers: a plan of their own,
    assert len(blas.plans) == 2 and fake.asked == [(0, 1)]  # the problem's algorithm asked for once per process
    assert fake.descs[0]["SM_COUNT_TARGET"] == 16 and fake.descs[0]["EPILOGUE"] == FakeLt.Epilogue.DEFAULT
    bias = np.zeros(32, np.float32)
    blas.matmul(A, B, C, 0, 0, RELU_BIAS, bias, target=16)  # another epilogue: another problem
    assert fake.asked[-1] == (2, 1) and fake.descs[2]["EPILOGUE"] == FakeLt.Epilogue.RELU_BIAS


def test_picks_choose_a_problems_target_and_algorithm(lt):
    blas, fake = lt
    A, B, C = _operands()
    cublaslt.PICKS[("tf32", 64, 32, 16)] = (33, 2)
    blas.matmul(A, B, C, 0, 0, PLAIN, None, target=16)
    (desc, requested), = fake.asked
    assert requested == 3 and fake.descs[desc]["SM_COUNT_TARGET"] == 33
    results = blas.plans[next(iter(blas.plans))][4]
    assert fake.runs == [(desc, results.ptr + 2 * ITEM)]  # the third algorithm
    cublaslt.PICKS[("tf32", 64, 32, 16)] = (None, 1)  # the caller's target, the second algorithm
    blas.matmul(A, B, C, 0, 0, PLAIN, None, target=16)
    desc = fake.asked[-1][0]
    second = next(plan for key, plan in blas.plans.items() if key[10] == 1)  # the plan key's pick index
    assert fake.descs[desc]["SM_COUNT_TARGET"] == 16 and fake.runs[-1] == (desc, second[4].ptr + ITEM)
    A2, B2, C2 = _operands(M=128)  # a problem without a pick: the first algorithm
    blas.matmul(A2, B2, C2, 0, 0, PLAIN, None, target=8)
    assert fake.asked[-1][1] == 1


def test_a_pick_past_the_heuristics_list_is_refused(lt):
    blas, fake = lt
    A, B, C = _operands()
    cublaslt.PICKS[("tf32", 64, 32, 16)] = (None, 3)  # the stand-in offers three: indices 0..2
    with pytest.raises(EpilogueUnavailable, match="the heuristic returned 3"):
        blas.matmul(A, B, C, 0, 0, PLAIN, None, target=16)
    assert not fake.runs
