"""Trained models shipped with nmt_tf, ready to translate without training.

A preset is one folder: what is needed to rebuild a model directory and its
exported SavedModel offline, and nothing that can be rebuilt.

    preset.json          name, languages, architecture, parameter count, the
                         weights' storage dtype and origin, the export settings
                         (beam, n-best, input limit), and the SHA-256 of every
                         file below
    weights.npz          the model's weights by variable path (float16,
                         bfloat16 as raw uint16 bits, or float32)
    config.json          the training configuration (model sizes, tokenizer,
                         languages; flags.json in a preset made before it)
    vocab.{src,tgt}.txt, sentencepiece.{src,tgt}.model, words.{src,tgt}.txt
                         the vocabularies, tokenizer models and word shortlists
                         of the training run, as nmt_tf.train wrote them
    checks.json          what the model must still do (not a build input):
                         BLEU of a test set and log-probabilities of fixed
                         pairs, the figures tests/test_model_of_record.py
                         holds it to (written by presets.measure)
    MODEL_CARD.md        data and licence, recipe, training, quality, checksums

The presets shipped with the package live beside this file
(`nmt_tf/presets/<name>/`); any folder of this layout can be named by path
instead. `build(name)` checks every file's SHA-256, writes a model directory
(the weights as an averaged/ checkpoint, so that --model_dir tools read it)
and exports it (nmt_tf.export) into a cache folder, once: later calls return
the cached SavedModel. The cache key is the preset's content and nmt_tf's
own source, so a new model of record or a change to the code rebuilds.
Nothing is ever downloaded. `create(model_dir, out_dir)` makes a preset from
a trained model directory (python -m nmt_tf.presets --create=...);
`presets.measure.measure_checks` then writes its checks.json
(--measure_checks=...), and `files_table` gives the model card's table of
files with their SHA-256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

import ml_dtypes
import numpy as np

from nmt_tf import config as nmt_config
from nmt_tf.core import model_dir as layout
from nmt_tf.core.files import sha256
from nmt_tf.core.precision import dtype_policy
from nmt_tf.exporting import saved_model as exporter
from nmt_tf.exporting.litert import export_litert
from nmt_tf.inference.litert_runtime import MANIFEST as LITERT_MANIFEST
from nmt_tf.inference.restore import restore_model
from nmt_tf.models import build_model, is_random_state

PRESETS_DIR = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.dirname(PRESETS_DIR)
MANIFEST, WEIGHTS, CHECKS, MODEL_CARD = "preset.json", "weights.npz", "checks.json", "MODEL_CARD.md"
# How far a preset may move from its checks.json before tests/test_model_of_record.py fails it.
CHECK_BLEU_TOLERANCE = 0.3      # lc Moses-tok BLEU points below the measured figure
CHECK_LOG_PROB_TOLERANCE = 0.02  # nats per pair: float32 kernels differ across CPUs (oneDNN, Eigen) by far less
FORMAT = 1
WEIGHT_DTYPES = ("float16", "bfloat16", "float32")
EXPORT_VERSION = 1


class PresetError(ValueError):
    """A preset that is missing, damaged or does not match its model, in one sentence."""


def available() -> list[str]:
    """Names of the presets shipped with the package."""
    return sorted(name for name in os.listdir(PRESETS_DIR)
                  if os.path.isfile(os.path.join(PRESETS_DIR, name, MANIFEST)))


def preset_dir(name: str) -> str:
    """The folder of the shipped preset `name`, or `name` itself if it is a
    folder holding a preset.json."""
    if os.path.isfile(os.path.join(name, MANIFEST)):
        return os.path.abspath(name)
    if os.sep not in name and os.path.isfile(os.path.join(PRESETS_DIR, name, MANIFEST)):
        return os.path.join(PRESETS_DIR, name)
    raise PresetError(f"no preset named {name!r}: the shipped presets are {', '.join(available()) or 'none'} "
                      "(or give the path of a folder with a preset.json)")


def read_manifest(folder: str) -> dict:
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PresetError(f"{path} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(manifest, dict):
        raise PresetError(f"{path} holds a JSON {type(manifest).__name__}, not a preset manifest (an object)")
    if manifest.get("format") != FORMAT:
        raise PresetError(f"{path} has format {manifest.get('format')!r}; this nmt_tf reads format {FORMAT}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise PresetError(f"{path} has no \"files\" object naming the preset's files and their SHA-256")
    for name, digest in files.items():
        # A preset's files are plain names in its own folder: "../../etc/hostname" is never read.
        if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
                or os.sep in name or "\0" in name or not isinstance(digest, str)):
            raise PresetError(f"{path}: the file entry {str(name)[:80]!r} is not a plain file name of the preset's "
                              "folder with its SHA-256")
    return manifest


def verify(folder: str) -> dict:
    """The manifest of the preset in `folder`, after checking that every file
    it lists is there with its SHA-256 (a PresetError names the first that is
    not: missing, cut short, or a Git LFS pointer instead of the file)."""
    manifest = read_manifest(folder)
    for name, expected in manifest["files"].items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise PresetError(f"{path} is missing: the preset is incomplete")
        actual = sha256(path)
        if actual != expected:
            size = os.path.getsize(path)
            raise PresetError(f"{path} is damaged: its SHA-256 is {actual[:16]}..., the preset says "
                              f"{expected[:16]}... ({size:,} bytes{'; a Git LFS pointer?' if size < 1024 else ''})")
    return manifest


def cache_root() -> str:
    """Where built presets go: $NMT_TF_CACHE, else $XDG_CACHE_HOME/nmt_tf, else ~/.cache/nmt_tf."""
    if os.environ.get("NMT_TF_CACHE"):
        return os.environ["NMT_TF_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nmt_tf")


def code_digest() -> str:
    """SHA-256 over nmt_tf's Python source (this package's data excluded): an
    export built by other code is not reused."""
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, PACKAGE_DIR).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()


def build_dir(folder: str, manifest: dict, cache_dir: str | None = None) -> str:
    """The cache folder of this preset's build (its key: the manifest, which
    holds every file's SHA-256, and nmt_tf's source)."""
    key = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode() + code_digest().encode()).hexdigest()
    return os.path.join(cache_dir or cache_root(), "presets", f"{manifest['name']}-{key[:16]}")


def build(name: str, cache_dir: str | None = None, log=print) -> str:
    """The SavedModel version directory of preset `name` (a shipped name or a
    folder), built on first use and cached; see the module docstring.
    Returns <build>/export/1; the model directory is <build>/model."""
    folder = preset_dir(name)
    manifest = verify(folder)
    target = build_dir(folder, manifest, cache_dir)
    saved_model = os.path.join(target, "export", str(EXPORT_VERSION))
    if _usable(target, ("model", "export"), log):
        return saved_model
    start = time.monotonic()
    log(f"Building preset {manifest['name']} into {target} (once; later uses load it from there)...")
    tmp = f"{target}.tmp-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        _write_model_dir(folder, manifest, os.path.join(tmp, "model"))
        _export(manifest, os.path.join(tmp, "model"), os.path.join(tmp, "export"))
        _record_build(tmp, ("model", "export"))
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isfile(os.path.join(saved_model, "saved_model.pb")):   # not another process's build
                raise
    except OSError as e:        # a read-only or full cache
        raise PresetError(f"cannot build preset {manifest['name']} in {target} ({type(e).__name__}: {e}); "
                          "set NMT_TF_CACHE to a writable folder with room for it") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"Built preset {manifest['name']} in {time.monotonic() - start:.0f} s: {saved_model}")
    return saved_model


BUILT = "built.json"      # what a build wrote: {path relative to its folder: size in bytes}


def _files(folder: str, parts) -> dict:
    sizes = {}
    for part in parts:
        for root, _, names in os.walk(os.path.join(folder, part)):
            for name in names:
                path = os.path.join(root, name)
                sizes[os.path.relpath(path, folder)] = os.path.getsize(path)
    return sizes


def _record_build(folder: str, parts) -> None:
    with open(os.path.join(folder, BUILT), "w", encoding="utf-8") as f:
        json.dump(_files(folder, parts), f, indent=1, sort_keys=True)


def _damage(folder: str, parts) -> str | None:
    """What is wrong with a cached build (its files against its built.json), or None."""
    try:
        with open(os.path.join(folder, BUILT), encoding="utf-8") as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        return f"no readable {BUILT}: the build did not finish"
    found = _files(folder, parts)
    for path, size in sorted(recorded.items()):
        if path not in found:
            return f"{path} is missing"
        if found[path] != size:
            return f"{path} has {found[path]:,} bytes, the build wrote {size:,}"
    return None


def _usable(folder: str, parts, log) -> bool:
    """Whether a cached build can be used as it is. A damaged one (a file
    missing or cut short) is removed, once, to be built again; a PresetError
    names the folder to delete if it cannot be."""
    if not os.path.isdir(folder):
        return False
    damage = _damage(folder, parts)
    if damage is None:
        return True
    log(f"The cached build {folder} is damaged ({damage}): building it again.")
    try:
        shutil.rmtree(folder)
    except OSError as e:
        raise PresetError(f"the cached build {folder} is damaged ({damage}) and cannot be removed "
                          f"({type(e).__name__}: {e}): delete that folder, or set NMT_TF_CACHE to another") from e
    return False


def _write_model_dir(folder: str, manifest: dict, out: str) -> None:
    """A model directory from the preset: its run files, and its weights as
    the averaged/ checkpoint."""
    import tensorflow as tf

    from nmt_tf.core import checkpoints
    from nmt_tf.data import pipeline as data

    os.makedirs(out)
    for name in layout.RUN_FILES:
        if name in manifest["files"]:
            shutil.copy(os.path.join(folder, name), os.path.join(out, name))
    config = nmt_config.load(out)
    source_tokenizer, target_tokenizer = data.load_tokenizers(config, out)
    with dtype_policy("float32"):
        model = build_model(config.model_config(), source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    set_weights(model, load_weights(os.path.join(folder, WEIGHTS), manifest["weights"]["dtype"]))
    averaged = checkpoints.averaged_dir(out)
    os.makedirs(averaged)
    path = tf.train.Checkpoint(model=model).write(os.path.join(averaged, f"averaged-{manifest['weights']['step']}"))
    checkpoints.write_state(averaged, [os.path.basename(path)])


def _export_config(settings: dict) -> nmt_config.ExportConfig:
    """The export of a manifest's "export" settings (SearchOptions fields,
    max_input_length and max_beam_size, 0 where absent) from the preset's
    averaged weights; checked."""
    search = {k: v for k, v in settings.items() if k not in ("max_input_length", "max_beam_size")}
    return nmt_config.ExportConfig(nmt_config.SearchOptions(**search), weights="averaged",
                                   max_input_length=settings["max_input_length"],
                                   max_beam_size=settings.get("max_beam_size", 0))


def _export(manifest: dict, model_dir_path: str, export_dir: str) -> str:
    return exporter.export(model_dir_path, export_dir, _export_config(manifest["export"]), version=EXPORT_VERSION,
                           log=lambda *a: None)


def is_weight(path: str) -> bool:
    """Whether the model variable at `path` is a weight: all are but the
    random state of dropout layers (`is_random_state`), which translation
    never reads."""
    return not is_random_state(path)


def weight_arrays(model, dtype: str) -> dict:
    """{variable path: numpy array} of a built model's weights, floating ones stored in `dtype`."""
    if dtype not in WEIGHT_DTYPES:
        raise PresetError(f"weights dtype must be one of {', '.join(WEIGHT_DTYPES)}, not {dtype!r}")
    arrays = {}
    for variable in model.variables:
        if not is_weight(variable.path):
            continue
        value = np.asarray(variable.numpy())
        if variable.path in arrays:
            raise PresetError(f"two model variables share the path {variable.path!r}")
        if value.dtype.kind == "f":
            value = _to_storage(value.astype(np.float32), dtype)
        arrays[variable.path] = value
    return arrays


def _to_storage(value, dtype: str):
    if dtype == "bfloat16":          # numpy files have no bfloat16: its bits as uint16
        return value.astype(ml_dtypes.bfloat16).view(np.uint16)
    return value.astype(dtype)


def _from_storage(value, dtype: str):
    if dtype == "bfloat16" and value.dtype == np.uint16:
        return value.view(ml_dtypes.bfloat16).astype(np.float32)
    return value.astype(np.float32) if value.dtype.kind == "f" else value


def load_weights(path: str, dtype: str) -> dict:
    """{variable path: float32 (or integer) array} from a preset's weights.npz."""
    with np.load(path, allow_pickle=False) as stored:
        return {key: _from_storage(stored[key], dtype) for key in stored.files}


def set_weights(model, arrays: dict) -> None:
    """Assigns `arrays` (by variable path) to a built model; every weight
    must have its array, of its shape, and no array may be left over. Dropout's
    random state is not a weight (`is_weight`): a preset that holds it (those
    made before 2026-11-27) has it ignored, whatever its number."""
    variables = {v.path: v for v in model.variables if is_weight(v.path)}
    arrays = {path: array for path, array in arrays.items() if is_weight(path)}
    missing, extra = sorted(set(variables) - set(arrays)), sorted(set(arrays) - set(variables))
    if missing or extra:
        raise PresetError(f"the preset's weights do not fit the model its configuration builds: missing "
                          f"{missing[:3] or 'none'}, unexpected {extra[:3] or 'none'}")
    for path, variable in variables.items():
        if tuple(arrays[path].shape) != tuple(variable.shape):
            raise PresetError(f"weight {path} has shape {arrays[path].shape} in the preset, the model expects "
                              f"{tuple(variable.shape)}")
        variable.assign(arrays[path].astype(variable.dtype))


def create(model_dir_path: str, out_dir: str, name: str, weights="averaged", weights_dtype: str = "float16",
           export_settings: dict | None = None, description: str = "", log=print) -> dict:
    """Writes a preset of a trained model directory to `out_dir` (which must
    not hold one yet) and returns its manifest. `weights`: a
    `nmt_tf.core.checkpoints.WeightsChoice` or a --checkpoint value;
    `export_settings`: SearchOptions fields, max_input_length and
    max_beam_size for the SavedModel that `build` makes (defaults: beam 10,
    n-best 5, 100 tokens, requests may ask for beams up to 10 or the beam
    if wider)."""
    if os.path.exists(os.path.join(out_dir, MANIFEST)):
        raise PresetError(f"{out_dir} holds a preset already; a model of record is replaced deliberately: "
                          "remove it first")
    settings = {**dataclasses.asdict(nmt_config.SearchOptions(n_best=5)), "max_input_length": 100,
                **(export_settings or {})}
    settings.setdefault("max_beam_size", max(10, settings["beam_size"]))
    _export_config(settings)     # checks them
    restored = restore_model(model_dir_path, weights, log=log)
    arrays = weight_arrays(restored.model, weights_dtype)
    os.makedirs(out_dir, exist_ok=True)
    np.savez_compressed(os.path.join(out_dir, WEIGHTS), **arrays)
    copied = [n for n in layout.RUN_FILES if os.path.exists(os.path.join(model_dir_path, n))]
    for n in copied:
        shutil.copy(os.path.join(model_dir_path, n), os.path.join(out_dir, n))
    config = restored.config
    step = max([int(s) for s in re.findall(r"-(\d+)\b", restored.checkpoint)] or [0])     # the newest averaged
    manifest = {
        "format": FORMAT, "name": name, "description": description,
        "src_lang": config.src_lang, "tgt_lang": config.tgt_lang, "model": config.model,
        "tokenizer": config.tokenizer, "parameters": int(restored.model.count_params()),
        "weights": {"file": WEIGHTS, "dtype": weights_dtype, "from": restored.checkpoint, "step": step},
        "export": settings,
        "files": {n: sha256(os.path.join(out_dir, n)) for n in [WEIGHTS, *copied]},
    }
    with open(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    log(f"Wrote preset {name} to {out_dir} ({sum(os.path.getsize(os.path.join(out_dir, n)) for n in manifest['files']):,} "
        f"bytes; weights in {weights_dtype}, from {restored.checkpoint})")
    return manifest


def files_table(name: str) -> str:
    """The model card's table of the preset's files (every file but the
    card), as Markdown rows: SHA-256, file, bytes."""
    folder = preset_dir(name)
    rows = ["| SHA-256 | file | bytes |", "|---|---|---|"]
    for n in sorted(os.listdir(folder)):
        path = os.path.join(folder, n)
        if n != MODEL_CARD and os.path.isfile(path):
            rows.append(f"| `{sha256(path)}` | `{n}` | {os.path.getsize(path):,} |")
    return "\n".join(rows)


def read_checks(name: str) -> dict:
    """The preset's checks.json ({} when it has none)."""
    path = os.path.join(preset_dir(name), CHECKS)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _litert_cache(name: str, weights: str, cache_dir: str | None) -> tuple[dict, str, str]:
    """(the preset's verified manifest, its LiteRT build folder <build>/litert-<weights>, the model folder in it)."""
    folder = preset_dir(name)
    manifest = verify(folder)
    target = os.path.join(build_dir(folder, manifest, cache_dir), f"litert-{weights}")
    return manifest, target, os.path.join(target, str(EXPORT_VERSION))


def build_litert(name: str, weights: str = "int8", cache_dir: str | None = None, log=print) -> str:
    """The LiteRT model folder of preset `name` with `weights` storage
    (nmt_tf.exporting.litert.WEIGHT_STORAGE), built on first use beside the
    preset's SavedModel (<build>/litert-<weights>/1) and cached: later uses
    find it there without TensorFlow. The first build needs TensorFlow."""
    manifest, target, model = _litert_cache(name, weights, cache_dir)
    if _usable(target, (str(EXPORT_VERSION),), log):
        return model
    saved_model = build(name, cache_dir, log)
    start = time.monotonic()
    log(f"Building the LiteRT model of preset {manifest['name']} ({weights} weights) into {target} (once)...")
    card = {key: manifest.get(key) for key in ("name", "description", "src_lang", "tgt_lang", "model", "parameters")}
    card["weights_from"] = manifest["weights"]["from"]
    try:
        export_litert(os.path.join(os.path.dirname(os.path.dirname(saved_model)), "model"), target,
                      _export_config(manifest["export"]), weights, version=EXPORT_VERSION, card=card,
                      log=lambda *a: None)
        _record_build(target, (str(EXPORT_VERSION),))
    except FileExistsError:         # another process built it meanwhile
        if not os.path.isfile(os.path.join(model, LITERT_MANIFEST)):
            raise
    except OSError as e:
        raise PresetError(f"cannot build the LiteRT model of preset {manifest['name']} in {target} "
                          f"({type(e).__name__}: {e}); set NMT_TF_CACHE to a writable folder with room for it") from e
    log(f"Built the LiteRT model of preset {manifest['name']} in {time.monotonic() - start:.0f} s: {model}")
    return model


def litert_model(name: str, weights: str = "int8", cache_dir: str | None = None, log=print) -> str:
    """build_litert without TensorFlow in this process: the cached LiteRT
    folder when it is there, else built by `python -m nmt_tf.presets
    --build_litert` in a child process (the build imports TensorFlow; a
    server or a translation that runs on LiteRT never holds it). Its
    progress goes to `log`; its error is this PresetError."""
    manifest, target, model = _litert_cache(name, weights, cache_dir)
    if _usable(target, (str(EXPORT_VERSION),), log):
        return model
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    if cache_dir:
        env["NMT_TF_CACHE"] = cache_dir
    child = subprocess.Popen([sys.executable, "-m", "nmt_tf.presets", f"--build_litert={name}",
                              f"--litert_weights={weights}"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, errors="replace")
    said = []
    for line in child.stderr:
        line = line.rstrip("\n")
        said.append(line)
        if line.startswith(("Building", "Built", "The cached build")):
            log(line)
    printed = child.stdout.read().strip()
    if child.wait() != 0 or not printed:
        errors = [line for line in said if line.startswith("error: ")]
        raise PresetError(errors[-1].removeprefix("error: ") if errors else
                          f"building the LiteRT model of preset {manifest['name']} failed (exit "
                          f"{child.returncode}): " + " | ".join(said[-3:]))
    return printed.splitlines()[-1]


def saved_model_for(saved_model: str | None, preset: str | None, log=print) -> str | None:
    """What a tool's --saved_model / --preset pair names: the SavedModel
    directory (a preset is built on first use); None when neither is given."""
    if saved_model and preset:
        raise PresetError("give --saved_model or --preset, not both")
    return build(preset, log=log) if preset else saved_model
