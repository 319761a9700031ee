"""--mixed_precision=auto decides from the CPU's features."""

import pytest

from nmt_tf import hardware


@pytest.mark.parametrize("flags, policy", [
    ({"avx2", "avx512f", "avx512_bf16"}, "mixed_bfloat16"),     # AMD EPYC Zen 4
    ({"avx2", "avx512f", "amx_bf16", "amx_tile"}, "mixed_bfloat16"),   # Intel Sapphire Rapids
    ({"avx2", "fma"}, "float32"),                                # AVX2 only: bfloat16 would be emulated
    ({"avx2", "avx512f", "avx512_vnni"}, "float32"),             # AVX-512 without bf16
    (set(), "float32"),                                          # no /proc/cpuinfo
])
def test_auto_is_bfloat16_only_where_the_cpu_has_bfloat16_instructions(monkeypatch, flags, policy):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    chosen, why = hardware.resolve_precision("auto")
    assert chosen == policy
    assert why.startswith("--mixed_precision=auto: " + policy)


@pytest.mark.parametrize("requested, policy", [
    ("none", "float32"), ("mixed_bfloat16", "mixed_bfloat16"), ("mixed_float16", "mixed_float16")])
def test_explicit_choices_are_kept_whatever_the_cpu(monkeypatch, requested, policy):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset())
    assert hardware.resolve_precision(requested)[0] == policy


def test_the_cpu_flags_are_read_from_cpuinfo():
    import os

    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo on this system")
    flags = hardware.cpu_flags()
    assert flags and all(" " not in f for f in flags)
    assert set(hardware.vector_flags()) <= flags
