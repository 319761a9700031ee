"""The precision a model computes in, decided in one place: what
--mixed_precision asks for on this machine (`resolve`, `chosen`), and Keras'
dtype policy set for a block (`dtype_policy`) or for good (`set_globally`).

Training uses --mixed_precision (auto: bfloat16 where the CPU has bfloat16
instructions); search (export, evaluate) computes in float32 unless it is
given. Weights and checkpoints are float32 either way.
"""

from __future__ import annotations

import contextlib

from nmt_tf.core import hardware


def resolve(requested: str) -> tuple[str, str]:
    """(Keras dtype policy, why) for --mixed_precision=`requested`.

    "auto" is mixed_bfloat16 on a CPU with bfloat16 instructions and no GPU
    (1.3-1.5x the float32 training speed measured on AMD EPYCs with
    avx512_bf16, BUILD_NOTES.md), float32 everywhere else; a GPU gets
    float32 too (choose mixed_float16 or mixed_bfloat16 for it yourself).
    "none" is float32; the others are Keras' policies of the same name.
    """
    if requested != "auto":
        return ("float32" if requested == "none" else requested), f"--mixed_precision={requested}"
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return "float32", "--mixed_precision=auto: float32, a GPU is visible (auto decides for CPUs only)"
    found = hardware.bf16_cpu_flags()
    if found:
        return "mixed_bfloat16", f"--mixed_precision=auto: mixed_bfloat16, this CPU has {' and '.join(found)}"
    return "float32", ("--mixed_precision=auto: float32, this CPU has no bfloat16 instructions "
                       f"({' or '.join(hardware.BF16_CPU_FLAGS)}), where bfloat16 would be emulated and slower")


def chosen(requested: str, log=None) -> str:
    """The Keras dtype policy --mixed_precision=`requested` gives here; `log`
    gets what auto chose."""
    policy, why = resolve(requested)
    if log is not None and requested == "auto":
        log(why + ".")
    return policy


@contextlib.contextmanager
def dtype_policy(name: str):
    """Keras' global dtype policy set to `name` ("float32", "mixed_bfloat16",
    ...) inside the block and restored after it. Layers take the policy when
    they are made, so a model built inside keeps it."""
    import keras

    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_dtype_policy(previous)


def set_globally(requested: str, log=None) -> str:
    """Sets Keras' global dtype policy to `chosen(requested)` for good and
    returns it (for a process that only trains: the benchmarks, --dry_run;
    training sets it for the run only, with `dtype_policy`)."""
    import keras

    policy = chosen(requested, log)
    keras.mixed_precision.set_dtype_policy(policy)
    return policy
