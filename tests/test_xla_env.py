"""The tests' XLA_FLAGS (tests/xla_env.py): the lowest LLVM level only where the tests run on the CPU alone."""
from xla_env import xla_flags


def test_the_lowest_llvm_level_only_on_the_cpu_alone(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert xla_flags(2) == "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0"
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert "--xla_backend_optimization_level=0" in xla_flags(8)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")  # .ci/gpu_check.sh: the device's tests compile as users do
    assert xla_flags(8) == "--xla_force_host_platform_device_count=8"
