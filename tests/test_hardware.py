"""--mixed_precision=auto decides from the CPU's features; training chooses its CPU kernels."""

import pytest

from nmt_tf.core import hardware, precision


@pytest.mark.parametrize("flags, policy", [
    ({"avx2", "avx512f", "avx512_bf16"}, "mixed_bfloat16"),     # AMD EPYC Zen 4
    ({"avx2", "avx512f", "amx_bf16", "amx_tile"}, "mixed_bfloat16"),   # Intel Sapphire Rapids
    ({"avx2", "fma"}, "float32"),                                # AVX2 only: bfloat16 would be emulated
    ({"avx2", "avx512f", "avx512_vnni"}, "float32"),             # AVX-512 without bf16
    (set(), "float32"),                                          # no /proc/cpuinfo
])
def test_auto_is_bfloat16_only_where_the_cpu_has_bfloat16_instructions(monkeypatch, flags, policy):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    chosen, why = precision.resolve("auto")
    assert chosen == policy
    assert why.startswith("--mixed_precision=auto: " + policy)


@pytest.mark.parametrize("requested, policy", [
    ("none", "float32"), ("mixed_bfloat16", "mixed_bfloat16"), ("mixed_float16", "mixed_float16")])
def test_explicit_choices_are_kept_whatever_the_cpu(monkeypatch, requested, policy):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset())
    assert precision.resolve(requested)[0] == policy


def test_the_cpu_flags_are_read_from_cpuinfo():
    import os

    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo on this system")
    flags = hardware.cpu_flags()
    assert flags and all(" " not in f for f in flags)
    assert set(hardware.vector_flags()) <= flags


def make_train(tmp_path, python_body: str, *arguments):
    """`make train` (with `arguments`) where the Makefile's $(PY) is a Python
    running `python_body` (after `import sys`), FLAGFILE unset."""
    import os
    import shutil
    import subprocess
    import sys

    from conftest import REPO

    if not shutil.which("make"):
        pytest.skip("no make on this system")
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\nimport sys\n{python_body}")
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "FLAGFILE"}
    return subprocess.run(["make", *arguments, "train", f"PY={python}"], cwd=REPO, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": REPO}, timeout=60)


@pytest.mark.parametrize("flags, recipe", [
    ("avx2 avx512f avx512_bf16", "rnnsearch.flags"),              # AMD EPYC Zen 4
    ("avx2 avx512f amx_bf16 amx_tile", "rnnsearch.flags"),        # Intel Sapphire Rapids
    ("avx2 fma", "rnnsearch_float32.flags"),                      # AVX2 only: float32
])
def test_make_train_chooses_its_recipe_by_the_cpus_bfloat16(tmp_path, flags, recipe):
    """The Makefile's choice runs `$(PY) -c ...` with nmt_tf.core.hardware: here a
    Python whose hardware.cpu_flags() are `flags`, through `make -n`."""
    done = make_train(tmp_path, f"from nmt_tf.core import hardware\n"
                                f"hardware.cpu_flags = lambda: frozenset({flags.split()!r})\n"
                                "assert sys.argv[1] == '-c'\nexec(sys.argv[2])\n", "-n", "-B")
    assert done.returncode == 0, done.stderr
    assert f"-m nmt_tf.train --flagfile=pipelines/multi30k_en_fr/{recipe} " in done.stdout, done.stdout


def test_make_train_stops_with_one_clear_error_when_the_cpu_check_fails(tmp_path):
    """A Python that fails the Makefile's `$(PY) -c ...` leaves FLAGFILE the
    recipes' folder alone: make train stops before training and names it."""
    (tmp_path / ".installed").touch()           # the venv is up to date: make setup installs nothing
    # This Python fails the CPU check; `-m nmt_tf.presets --build` (make setup) succeeds.
    done = make_train(tmp_path, "sys.exit('no nmt_tf here' if sys.argv[1] == '-c' else 0)\n", f"VENV={tmp_path}")
    assert done.returncode != 0
    assert "make train: no recipe file 'pipelines/multi30k_en_fr/'" in done.stderr, done.stderr
    assert "nmt_tf.train" not in done.stdout, done.stdout


def test_the_float32_recipe_is_the_recipe_with_less_dropout(monkeypatch):
    """rnnsearch_float32.flags takes everything from rnnsearch.flags, the
    conditional GRU decoder included, but the three dropout rates, each 0.1
    lower, and the learning-rate schedule: the plateau one, which
    rnnsearch.flags had before its hold-then-decay schedule (issue 42's
    choices for the ~6,160-6,700 updates of a float32 CPU)."""
    from conftest import REPO
    from nmt_tf import flags

    def config(name):
        try:
            flags.FLAGS(["train", f"--flagfile=pipelines/multi30k_en_fr/{name}"])
            return flags.config_from_flags().as_dict()
        finally:
            flags.FLAGS.unparse_flags()

    monkeypatch.chdir(REPO)     # the nested --flagfile is relative to the repository, like the corpora
    recipe, float32 = config("rnnsearch.flags"), config("rnnsearch_float32.flags")
    changed = {name: (recipe[name], float32[name]) for name in recipe if recipe[name] != float32[name]}
    assert changed == {"dropout": (0.4, 0.3), "annotation_dropout": (0.5, 0.4), "recurrent_dropout": (0.2, 0.1),
                       "lr_schedule": ("linear", "plateau"), "lr_decay_fraction": (0.2, 1.0),
                       "decay_factor": (1.0, 0.5), "patience": (0, 8)}
    assert float32["decoder"] == "cgru"


def choose_in_a_fresh_process(env_value):
    """choose_training_kernels() in a Python without TensorFlow imported:
    (what it says, TF_ENABLE_ONEDNN_OPTS afterwards)."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    env = {k: v for k, v in os.environ.items() if k != hardware.ONEDNN_ENV}
    if env_value is not None:
        env[hardware.ONEDNN_ENV] = env_value
    env["PYTHONPATH"] = REPO
    script = ("import os; from nmt_tf.core import hardware; print(hardware.choose_training_kernels()); "
              "print(hardware.training_kernels()); print(os.environ.get(hardware.ONEDNN_ENV))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    said, again, value = result.stdout.splitlines()
    assert said == again
    return said, value


def test_training_turns_on_onednn_on_x86_cpus_where_the_user_did_not_choose():
    import platform

    said, value = choose_in_a_fresh_process(None)
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"oneDNN is chosen on x86 CPUs only; this is {platform.machine()}")
    assert value == "1"
    assert said.startswith("CPU kernels: oneDNN,") and "TF_ENABLE_ONEDNN_OPTS=0 chooses Eigen" in said


@pytest.mark.parametrize("value, kind", [("0", "Eigen"), ("false", "Eigen"), ("1", "oneDNN"), ("TRUE", "oneDNN")])
def test_the_users_tf_enable_onednn_opts_is_kept(value, kind):
    said, kept = choose_in_a_fresh_process(value)
    assert kept == value
    kind = "Eigen (no oneDNN)" if kind == "Eigen" else kind
    assert said == f"CPU kernels: {kind}, as TF_ENABLE_ONEDNN_OPTS={value} in the environment asks."


def test_the_kernels_cannot_be_chosen_once_tensorflow_is_imported():
    import tensorflow  # noqa: F401  (the test process has it imported already)

    with pytest.raises(RuntimeError, match="before TensorFlow is imported"):
        hardware.choose_training_kernels()


@pytest.mark.parametrize("flags, onednn, transposed", [
    ({"avx2", "fma"}, True, True),                   # AVX2 only, oneDNN: the measured case
    ({"avx2", "fma"}, False, False),                 # Eigen: the stored transposes are the slow layout
    ({"avx2", "avx512f", "avx512_bf16"}, True, False),   # AVX-512: not measured, left as stored
    (set(), True, False),                            # not x86
])
def test_transposed_step_products_only_with_onednn_on_avx2(monkeypatch, flags, onednn, transposed):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(hardware, "onednn_enabled", lambda: onednn)
    hardware.transposed_step_products.cache_clear()
    try:
        assert hardware.transposed_step_products() is transposed
        assert ("stored transposes" in hardware.step_products_choice()) is transposed
    finally:
        hardware.transposed_step_products.cache_clear()


def test_onednn_enabled_says_what_tensorflow_runs():
    """In a fresh process (TensorFlow reads TF_ENABLE_ONEDNN_OPTS when imported)."""
    import os
    import subprocess
    import sys

    for value, want in (("0", "False"), ("1", "True")):
        result = subprocess.run([sys.executable, "-c", "from nmt_tf.core import hardware; import tensorflow; "
                                 "print(hardware.onednn_enabled())"], capture_output=True, text=True,
                                env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": value})
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().splitlines()[-1] == want
