import pytest

from workbench.errors import ConfigError
from workbench.gpu_profile import load_profile, select_profile


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
