"""Shared fixtures: tiny corpora, tiny configs, one trained tiny model."""

import gzip
import inspect
import json
import os
import re
import subprocess
import sys
import time
import unicodedata

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

from nmt_tf.config import TrainingConfig
from nmt_tf.core.files import files_stamp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTI30K = os.path.join(REPO, "data", "multi30k")
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# Every Unicode separator (Zs, Zl, Zp: U+0020, U+00A0, U+3000, U+2028, ...):
# whitespace for the in-graph clean-up, in tf.data and in exports alike.
UNICODE_SEPARATORS = [chr(c) for c in range(sys.maxunicode + 1)
                      if unicodedata.category(chr(c)) in ("Zs", "Zl", "Zp")]


def padded(rows, dtype="int32"):
    """Right-padded [len(rows), longest] array of id lists."""
    import numpy as np

    out = np.zeros((len(rows), max(map(len, rows))), dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def memorization_batch(rng, pairs=20, vocab=30, lengths=(3, 8)):
    """(x, y) of `pairs` random sentence pairs of words 4..vocab-1, ready for fit."""
    src = [list(rng.integers(4, vocab, size=rng.integers(*lengths))) + [3] for _ in range(pairs)]
    tgt = [list(rng.integers(4, vocab, size=rng.integers(*lengths))) for _ in range(pairs)]
    x = {"source_ids": padded(src), "target_ids": padded([[2] + t for t in tgt])}
    return x, padded([t + [3] for t in tgt])


def memorize(model, x, y, updates: int) -> float:
    """Builds `model`, fits it `updates` times on the one batch (x, y) with Adam 0.01 and
    clipping at 1, and returns its NLL per target token on that batch afterwards."""
    import keras
    import tensorflow as tf

    model.build()
    model.compile(optimizer=keras.optimizers.Adam(0.01, global_clipnorm=1.0))
    model.fit(tf.data.Dataset.from_tensors((x, y)).repeat(updates), epochs=1, verbose=0, shuffle=False)
    nll, tokens, _ = model.batch_nll(x, y)
    return float(nll / tokens)


def checkpoint_weights(path) -> dict:
    """The model weights stored in a training checkpoint, by checkpoint key
    (optimizer slots left out). TensorFlow keys a variable by the first path
    it finds to it: `optimizer/_trainable_variables/N` for the decoder's
    weights in nmt_tf's training checkpoints, `model/...` for the rest."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(path)
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if k.startswith(("model/", "optimizer/_trainable_variables/")) and "OPTIMIZER_SLOT" not in k}


def assert_same_checkpoint_weights(a_path, b_path, rtol=1e-5, atol=1e-6) -> dict:
    """The model weights of two training checkpoints agree, key for key (more
    than 10 of them, so an empty read cannot pass); returns the second's."""
    import numpy as np

    a, b = checkpoint_weights(a_path), checkpoint_weights(b_path)
    assert a.keys() == b.keys() and len(a) > 10, (sorted(a)[:5], sorted(b)[:5])
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=k)
    return b


def read_multi30k(name: str, n: int | None = None) -> list[str]:
    with gzip.open(os.path.join(MULTI30K, name), "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:n] if n else lines


def write_lines(path, lines, gz=False, encoding="utf-8"):
    data = "".join(l + "\n" for l in lines)
    raw = data.encode(encoding) if isinstance(data, str) else data
    with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
        f.write(raw)
    return str(path)


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """40 training and 12 dev pairs of Multi30k En-Fr (train gzipped, dev plain)."""
    d = tmp_path_factory.mktemp("corpus")
    en, fr = read_multi30k("train.en.gz", 52), read_multi30k("train.fr.gz", 52)
    return {
        "train_src": write_lines(d / "train.en.gz", en[:40], gz=True),
        "train_tgt": write_lines(d / "train.fr.gz", fr[:40], gz=True),
        "dev_src": write_lines(d / "dev.en", en[40:]),
        "dev_tgt": write_lines(d / "dev.fr", fr[40:]),
        "pairs": list(zip(en[:40], fr[:40])),
    }


@pytest.fixture(scope="session")
def tiny_config(tiny_corpus):
    """The smoke-sized model on the tiny corpus (a function of overrides)."""

    def make(**overrides):
        base = dict(
            train_src=tiny_corpus["train_src"], train_tgt=tiny_corpus["train_tgt"],
            dev_src=tiny_corpus["dev_src"], dev_tgt=tiny_corpus["dev_tgt"],
            src_vocab_size=200, tgt_vocab_size=200, embedding_size=16, hidden_size=16,
            attention_size=16, maxout_size=8, batch_size=8, optimizer="adam",
            learning_rate=0.01, max_epochs=1, checkpoint_every_steps=3, log_every_steps=1,
            patience=0, shuffle_buffer=1000,    # one pool of 40 pairs: 5 batches of 8
            mixed_precision="none",             # float32 on every CPU, as pipelines/smoke.flags
            attention_examples=0,               # drawing an untrained model's long outputs costs seconds
            dev_bleu=False)                     # a greedy search of dev costs ~2 s a run; trained_model_dir has it
        base.update(overrides)
        return TrainingConfig(**base)
    return make


@pytest.fixture(scope="session")
def trained_model_dir(tiny_config, tmp_path_factory):
    """A tiny model trained for 2 epochs (shared by tests that only read it)."""
    from nmt_tf.training import job as training

    model_dir = str(tmp_path_factory.mktemp("trained") / "model")
    summary = training.train(tiny_config(model_dir=model_dir, max_epochs=2, attention_examples=4, dev_bleu=True),
                             log=lambda *a: None)
    return model_dir, summary


@pytest.fixture(autouse=True)
def _trained_model_dir_stays_as_trained(request):
    """trained_model_dir is shared by every test of a process that asks for it
    (directly or through `exported`), so a test that writes into it changes
    what the later ones read: an `averaged/` left there once made --init_from
    start from the averaged weights instead of the best. Such a test fails
    here, naming the files; it should work on a copy."""
    if "trained_model_dir" not in request.fixturenames:
        yield
        return
    model_dir = request.getfixturevalue("trained_model_dir")[0]
    before = files_stamp(model_dir)
    yield
    changed = sorted({name for name, *_ in set(before) ^ set(files_stamp(model_dir))})
    assert not changed, f"the test changed the shared trained_model_dir {model_dir}: {changed[:10]}"


def _cli_env(env=None):
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO, **(env or {})}


def run_cli(*args, timeout=300, env=None):
    """Runs `python -m ...` in a fresh process; returns CompletedProcess."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env=_cli_env(env))


def start_cli(*args, env=None, **popen_kw):
    """Starts `python -m ...` in a fresh process, as run_cli runs it; returns the Popen
    (for tests that signal or kill it, or run several at once)."""
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=_cli_env(env), **popen_kw)


def wait_until(condition, seconds: float, interval: float = 0.1) -> bool:
    """Calls `condition()` every `interval` seconds until it is true or `seconds` have
    passed; returns its last value's truth. The bound only matters on a machine too busy
    for the test: the wait ends as soon as the condition holds."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def smoke_train_args(corpus, model_dir, *flags):
    """Arguments of `python -m nmt_tf.train` with pipelines/smoke.flags on the tiny
    corpus, then `flags`, then --model_dir."""
    return ["-m", "nmt_tf.train", f"--flagfile={REPO}/pipelines/smoke.flags",
            f"--train_src={corpus['train_src']}", f"--train_tgt={corpus['train_tgt']}",
            f"--dev_src={corpus['dev_src']}", f"--dev_tgt={corpus['dev_tgt']}", *flags, f"--model_dir={model_dir}"]


@pytest.fixture(scope="session")
def exported(trained_model_dir, tmp_path_factory):
    """The trained tiny model exported once: (model_dir, export base, version path)."""
    from nmt_tf.config import ExportConfig, SearchOptions
    from nmt_tf.exporting import saved_model as exporter

    model_dir, _ = trained_model_dir
    base = str(tmp_path_factory.mktemp("exports") / "nmt")
    path = exporter.export(model_dir, base, ExportConfig(SearchOptions(beam_size=3, n_best=2), max_input_length=20),
                           log=lambda *a: None)
    return model_dir, base, path


# --- the quick tier: `make test-quick` (pytest -m "not slow") -------------------------------------------

# Fixtures that train, export, build or start something (seconds to a minute each, shared within a file
# or the session): a test that uses one, even through another fixture, is in the slow tier.
HEAVY_FIXTURES = {"tiny_config", "tiny_corpus", "trained_model_dir", "exported", "sentencepiece_export",
                  "wordpiece_export", "litert_export", "tiny_preset", "translator", "scorer", "server", "tls_server",
                  "batching_server", "browser", "prepared", "one_device", "rnnsearch", "rnnencdec",
                  "model_dir_with_table"}
# A test that starts a tool in a fresh Python (TensorFlow's import: ~5 s each), trains a model itself,
# builds a preset or asks for a fixture by name is slow too.
SPAWNS = re.compile(r"\b(run_cli|start_cli|subprocess\.(run|Popen|check_output)|memorize|presets\.build|"
                    r"translate_file|getfixturevalue)\(")


# The one-minute tier (`make test-fast`, pytest -m "not slow and not heavy") also leaves out the quick
# tier's tests that took more than HEAVY_SECONDS in their last recorded run: a model built and searched
# or differentiated in TensorFlow in the test itself. tests/durations.json holds the call-phase seconds of
# the quick tests that took at least half a second; `make test-durations` records them again.
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
HEAVY_SECONDS = 1.5
_recorded: dict = {}


def _durations() -> dict:
    try:
        with open(DURATIONS, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def pytest_configure(config):
    for line in ("slow: trains, exports, serves or starts a tool (left out by make test-quick, pytest -m "
                 "'not slow'; tests/conftest.py says which)",
                 "subprocess: starts a tool or a Python of its own (also slow)",
                 "browser: drives the page in headless Chromium (also slow)",
                 "heavy: a quick-tier test that took more than HEAVY_SECONDS last time it was recorded "
                 "(tests/durations.json; left out by make test-fast)"):
        config.addinivalue_line("markers", line)


def pytest_collection_modifyitems(config, items):
    """Marks the slow tier (HEAVY_FIXTURES, SPAWNS; `subprocess` and
    `browser` besides) so that `pytest -m "not slow"` runs what a developer
    can wait for after every change, and `heavy` the quick tests that take
    seconds (tests/durations.json) so that `-m "not slow and not heavy"`
    runs in under a minute."""
    durations = _durations()
    for item in items:
        function = getattr(item, "function", None)
        try:
            source = inspect.getsource(function) if function is not None else ""
        except (OSError, TypeError):
            source = ""
        fixtures = set(getattr(item, "fixturenames", ()))
        if SPAWNS.search(source):
            item.add_marker(pytest.mark.subprocess)
        if "browser" in fixtures:
            item.add_marker(pytest.mark.browser)
        if HEAVY_FIXTURES & fixtures or SPAWNS.search(source):
            item.add_marker(pytest.mark.slow)
        elif durations.get(item.nodeid, 0.0) > HEAVY_SECONDS:
            item.add_marker(pytest.mark.heavy)


def pytest_runtest_logreport(report):
    """With NMT_TF_RECORD_DURATIONS=1: each quick test's call time, for tests/durations.json."""
    if (report.when == "call" and os.environ.get("NMT_TF_RECORD_DURATIONS") == "1" and "slow" not in report.keywords
            and report.duration >= 0.5):          # the file lists only tests that take a while
        _recorded[report.nodeid] = round(report.duration, 2)


def pytest_sessionfinish(session):
    """With NMT_TF_RECORD_DURATIONS=1, in the controlling process: writes tests/durations.json."""
    if _recorded and os.environ.get("NMT_TF_RECORD_DURATIONS") == "1" and not hasattr(session.config, "workerinput"):
        with open(DURATIONS, "w", encoding="utf-8") as f:
            json.dump(dict(sorted(_recorded.items())), f, indent=0)
            f.write("\n")
