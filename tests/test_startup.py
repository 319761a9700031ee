"""Command-line tools start quietly: TensorFlow's start-up noise is filtered, real messages are not."""

import os
import subprocess
import sys
import textwrap

from conftest import REPO
from nmt_tf.core.startup import LineFilter

INFO = "I0000 00:00:1795488348.364863   11421 port.cc:153] oneDNN custom operations are on.\n"
FEATURES = ("I0000 00:00:1795488348.403958   11421 cpu_feature_guard.cc:227] This TensorFlow binary is "
            "optimized to use available CPU instructions in performance-critical operations.\n")
FEATURES_CONTINUED = "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild.\n"
PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
CUDART = "I0000 00:00:1795488348.365157   11421 cudart_stub.cc:31] Could not find cuda drivers on your machine.\n"
CUINIT = ("E0000 00:00:1795488350.450447   11421 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
          "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n")
WARNING = "W0000 00:00:1795488350.450447   11421 some_op.cc:12] a real warning\n"
ERROR = "E0000 00:00:1795488350.450447   11421 some_op.cc:34] a real error\n"
NOISE = ("cudart_stub", "cpu_feature_guard", "cuInit", "absl::InitializeLog", "oneDNN custom operations",
         "To enable the following instructions")


def feed_all(line_filter, lines):
    return [kept for line in lines for kept in line_filter.feed(line)]


def test_the_filter_drops_the_noise_and_keeps_warnings_errors_and_other_output():
    f = LineFilter(min_level=1)
    lines = [PREAMBLE, INFO, CUDART, FEATURES, FEATURES_CONTINUED, "plain output\n", WARNING, CUINIT, ERROR]
    assert feed_all(f, lines) == ["plain output\n", WARNING, ERROR]
    assert f.finish(gpu_found=False) == []


def test_the_cuda_probe_lines_come_back_when_a_gpu_was_found():
    f = LineFilter(min_level=1)
    assert feed_all(f, [CUDART, CUINIT]) == []
    assert f.finish(gpu_found=True) == [CUDART, CUINIT]


def test_level_0_asked_for_by_the_user_keeps_everything():
    lines = [PREAMBLE, INFO, CUDART, FEATURES, FEATURES_CONTINUED, CUINIT, ERROR]
    assert feed_all(LineFilter(min_level=0), lines) == lines


def test_the_first_import_is_filtered_at_the_file_descriptor(tmp_path):
    """A stand-in `tensorflow` package writes TensorFlow's start-up lines and a
    real error straight to file descriptor 2 while it is imported, as the C++
    library does; through nmt_tf.core.startup only the real error and later
    output reach standard error."""
    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text(textwrap.dedent(f"""
        import os, types
        for line in {[PREAMBLE, INFO, CUDART, FEATURES, FEATURES_CONTINUED, ERROR, CUINIT]!r}:
            os.write(2, line.encode())
        config = types.SimpleNamespace(list_physical_devices=lambda kind: [])
    """))
    script = ("import sys; from nmt_tf.core import startup; startup.quiet_tensorflow_import(); "
              "import tensorflow; print('after the import', file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{REPO}"
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"          # the stand-in has no graphs to say oneDNN's notice with
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ERROR + "after the import\n"


def test_a_cli_starts_without_tensorflow_start_up_lines():
    """The real thing: `nmt_tf.train --dry_run` imports TensorFlow and builds
    a model; with TF_CPP_MIN_LOG_LEVEL unset, none of the start-up lines
    reach standard error."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = REPO
    result = subprocess.run([sys.executable, "-m", "nmt_tf.train", f"--flagfile={REPO}/pipelines/smoke.flags",
                             "--dry_run"], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Total parameters" in result.stdout
    for noise in NOISE:
        assert noise not in result.stderr, result.stderr


ONEDNN_INT64 = """
g = tf.Graph()
with g.as_default():
    p = tf.compat.v1.placeholder(tf.int64, [None])
    y = tf.transpose(tf.reshape(p, [1, -1]))
with tf.compat.v1.Session(graph=g) as s:
    print(s.run(y, {p: [1, 2]}).tolist())
tf.config.threading.set_intra_op_parallelism_threads(1)     # the eager context is still free to configure
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
print(len(tf.config.list_logical_devices("CPU")))
"""


def test_onednns_fallback_notice_comes_during_the_filtered_import():
    """A graph with an int64 Transpose makes TensorFlow print, once per
    process, "oneDNN supports DT_INT64 only on platforms with AVX-512" as an
    ERROR (in every tool's output before). Through nmt_tf.core.startup it is
    said and dropped during the import, the eager context stays
    configurable, and TF_CPP_MIN_LOG_LEVEL=0 still shows it (so the script
    does bring it on)."""
    quiet = "from nmt_tf.core import startup; startup.quiet_tensorflow_import()\nimport tensorflow as tf\n"
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
    env["PYTHONPATH"] = REPO
    result = subprocess.run([sys.executable, "-c", quiet + ONEDNN_INT64], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[[1], [2]]\n2\n"
    assert "oneDNN supports" not in result.stderr, result.stderr
    wanted = subprocess.run([sys.executable, "-c", quiet + ONEDNN_INT64], capture_output=True, text=True,
                            env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"}, timeout=120)
    assert wanted.returncode == 0, wanted.stderr
    if "avx512f" in open("/proc/cpuinfo").read():    # elsewhere it was seen naming DT_BOOL (once per process)
        assert "oneDNN supports DT_INT64" in wanted.stderr, wanted.stderr


def test_scikit_learn_is_missing_only_while_tensorflow_loads(tmp_path):
    """TensorFlow's import loads Keras, which imports scikit-learn for its
    scikit-learn wrappers alone (a second of every tool's start). Stand-ins
    for both: through nmt_tf.core.startup the `tensorflow` import finds no
    scikit-learn, and the tools' own later import (t-SNE) finds it."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(textwrap.dedent("""
        import types
        try:
            from sklearn.base import BaseEstimator     # as keras/src/wrappers does
            sklearn_seen = True
        except ImportError:
            sklearn_seen = False
        config = types.SimpleNamespace(list_physical_devices=lambda kind: [])
    """))
    (tmp_path / "sklearn").mkdir()
    (tmp_path / "sklearn" / "__init__.py").write_text("")
    (tmp_path / "sklearn" / "base.py").write_text("BaseEstimator = object\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "TF_ENABLE_ONEDNN_OPTS": "0"}
    quiet = ("from nmt_tf.core import startup; startup.quiet_tensorflow_import(); import tensorflow, sys; "
             "print(tensorflow.sklearn_seen, 'sklearn' in sys.modules); from sklearn.base import BaseEstimator; "
             "print('later', BaseEstimator)")
    result = subprocess.run([sys.executable, "-c", quiet], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "False False\nlater <class 'object'>\n"
    plain = subprocess.run([sys.executable, "-c", "import tensorflow; print(tensorflow.sklearn_seen)"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert plain.stdout == "True\n", plain.stderr
