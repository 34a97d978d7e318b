import pytest

from workbench.errors import ConfigError
from workbench.gpu_profile import GpuProfile, load_profile, select_profile


def test_profile_chosen_by_device_name_and_override(monkeypatch):
    monkeypatch.delenv("WORKBENCH_GPU_PROFILE", raising=False)
    assert select_profile("NVIDIA H200").name == "h200"
    assert select_profile("NVIDIA GeForce RTX 3050 Laptop GPU").name == "rtx3050"
    assert select_profile("Some Future GPU").name == "default"
    monkeypatch.setenv("WORKBENCH_GPU_PROFILE", "a100")
    assert select_profile("NVIDIA H200").name == "a100"
    monkeypatch.setenv("WORKBENCH_GPU_PROFILE", "nope")
    with pytest.raises(ConfigError, match="unknown GPU profile 'nope'"):
        select_profile("NVIDIA H200")
    assert load_profile("h200").hidden == 512 and load_profile("h200").atoms == 51


def test_gemm_math_is_a_profile_setting_and_a_run_override(tmp_path):
    """``math`` (fp32 | tf32 | bf16) in a profile TOML and as ``gpu.math`` for one run; anything else is
    refused with a one-line error naming the choices, before any work. A bf16 profile never batches its
    GEMMs (the batched GEMM is a float32 SGEMM)."""
    from workbench.agent.backend import Backend
    from workbench.config import GpuOverrides, load_config

    text = (tmp_path / "p.toml")
    text.write_text('name = "p"\nmath = "tf32"\n')
    assert load_profile(str(text)).math == "tf32"
    text.write_text('name = "p"\nmath = "fp16"\n')
    with pytest.raises(ConfigError, match=r"math fp32\|tf32\|bf16"):
        load_profile(str(text))
    b = Backend("cpu")
    assert b.sized(GpuOverrides(math="fp32")).math == "fp32"
    assert b.sized(load_config(None, ['gpu.math="tf32"']).gpu).math == "tf32"
    assert b.sized(GpuOverrides()).math == b.profile.math
    with pytest.raises(ConfigError, match="gpu.math must be one of fp32, tf32, bf16, got 'fp16'"):
        b.sized(GpuOverrides(math="fp16"))
    batched = dict(gemm="cublas", batched_gemm=True)
    assert GpuProfile(**batched, math="tf32").batches_gemms
    assert not GpuProfile(**batched, math="bf16").batches_gemms
    assert not GpuProfile(gemm="numba", batched_gemm=True).batches_gemms


def test_sm_target_counts_a_gemms_large_tiles_whatever_the_population():
    """A population's GEMM is planned for as many SMs as its output has large tiles (128 x 256 TF32,
    128 x 128 fp32), whatever the number of agents (so an agent's results do not depend on it); a GEMM
    with a tile for every SM, or a single tile (W1's gradient: what crashed cuBLASLt's heuristic with
    SIGFPE when asked for one SM), keeps cuBLAS's own choice (0)."""
    from workbench.cublaslt import sm_target

    assert sm_target(2048, 512, 132, "tf32") == 32
    assert sm_target(1024, 512, 132, "tf32") == 16
    assert sm_target(512, 512, 132, "tf32") == 8
    assert sm_target(1024, 510, 132, "tf32") == 16  # a part tile counts
    assert sm_target(1024, 512, 132, "fp32") == 32
    assert sm_target(4096, 4096, 132, "tf32") == 0  # more tiles than SMs: every SM
    assert sm_target(24, 512, 132, "tf32") == sm_target(20, 512, 132, "fp32") == 0  # one tile: cuBLAS's choice


def test_a_backend_started_early_is_made_on_its_own_thread_and_handed_over_once(monkeypatch):
    """``start_backend`` (the CLIs call it before reading the bars) makes the backend on another thread;
    ``make_backend`` for the same choice takes that one, once, and raises in the caller what making it
    raised; ``cpu``, unknown choices and the simulator start nothing."""
    import threading

    import cuda_kernels.nb as nb
    from workbench.agent import backend as B

    made = []

    class Made:
        kind = "cpu"

    def fake_make(choice):
        if choice == "gpu":
            raise ConfigError("device 'gpu' asked for, but no CUDA device is available")
        made.append(threading.current_thread().name)
        return Made()

    monkeypatch.setattr(B, "_make", fake_make)
    monkeypatch.setattr(B, "_started", {})
    monkeypatch.setattr(nb, "SIMULATOR", False)
    B.start_backend("auto")
    first = B.make_backend("auto")
    assert isinstance(first, Made) and made == ["workbench-backend"]
    assert B.make_backend("auto") is not first and made[-1] == threading.current_thread().name  # taken once
    B.start_backend("gpu")
    with pytest.raises(ConfigError, match="no CUDA device"):
        B.make_backend("gpu")
    B.start_backend("cpu")
    B.start_backend("tpu")
    assert B._started == {}
    B.start_backend("auto")  # never taken (the run stopped first): waited for at exit, its result dropped
    B._settle()
    assert B._started == {} and made[-1] == "workbench-backend"
    monkeypatch.setattr(nb, "SIMULATOR", True)
    B.start_backend("auto")
    assert B._started == {}
