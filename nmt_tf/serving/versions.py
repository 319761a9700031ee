"""What nmt_tf.serve's front ends share: TF Serving's model versions and requests.

The protocol-independent half of the server (nmt_tf.serve holds the gRPC
front end and the command line, nmt_tf.serving.rest the REST one): the versions of
one model under a base path (`ModelRegistry`: the highest served, a new one
loaded when it appears, one that fails to load reported once), and Predict,
GetModelMetadata and GetModelStatus on TF Serving's protos with TF Serving's
checks, messages and status codes (`run_predict`, `model_metadata`,
`model_status`; failures are `ServingError`s carrying the gRPC status code),
so that the two front ends cannot answer differently.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import math
import os
import re
import threading

import grpc
from absl import logging

from nmt_tf.core.files import files_stamp, sha256
from nmt_tf.inference.host_text import source_counter
from nmt_tf.inference.saved_models import load_session, read_metadata
from nmt_tf.inference.translation_graph import beam_bound_text, failed_check_text
from nmt_tf.serving import api_protos as serving_protos
from nmt_tf.serving import batching
from nmt_tf.serving import config_protos as protos

DEFAULT_SIGNATURE = "serving_default"


class ServingError(Exception):
    """A request failure with the gRPC status TF Serving would return."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


WARMUP_FILE = "tf_serving_warmup_requests"      # in a version's assets.extra/, as TF Serving reads it
WARMUP_RECORDS = 1000                           # TF Serving's limit


class VersionUnloaded(Exception):
    """The version was unloaded before the request could use it."""


# SignatureDefs of a TF2 SavedModel that are no signature a client may call.
_NOT_SIGNATURES = ("__saved_model_init_op",)


class ServedVersion:
    """What a served version of either runtime has: its folder and number,
    `signatures` and their SignatureDefs (nmt_tf.serving.api_protos messages),
    `run`, `metadata` (the export's description, for the page), the bounds
    of its work (`alignment_shape`, `search_cost`) and its users.

    Users hold it with `acquire()` / `release()` (ModelRegistry.use does for
    a request); `retire()` frees it (`_free`) once the last user releases it,
    so an unload never cuts off a request in flight."""

    def __init__(self, path: str, version: int):
        self.path, self.version = path, version
        self._lock = threading.Lock()
        self._users = 0
        self._retired = self.closed = False

    def run(self, signature: str, feeds: dict, outputs) -> dict:
        """Runs `signature` on `feeds` ({input alias: array}); returns {output
        alias: numpy array}; a ServingError for input the model refuses."""
        raise NotImplementedError

    def acquire(self) -> None:
        with self._lock:
            if self.closed:
                raise VersionUnloaded(f"version {self.version} was unloaded")
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            close = self._retired and not self._users
        if close:
            self._close()

    def retire(self) -> None:
        """Unloads: frees the version now, or when its last user releases it."""
        with self._lock:
            self._retired = True
            close = not self._users
        if close:
            self._close()

    def _close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._free()

    def _free(self) -> None:
        """Lets go of what the loaded version holds."""


class LoadedVersion(ServedVersion):
    """One SavedModel version, held as tensorflow_model_server holds one: in a
    TF1 session of its own (nmt_tf.inference.saved_models.load_session), its signatures run by
    Session.run on their SignatureDefs' tensor names. `tf.saved_model.load`
    kept about 256 MB per load of the shipped model (85 MB for the tiny test
    export) after the loaded object was gone; a closed session frees its
    graph and variables (BUILD_NOTES.md, "Serving hardening")."""

    MARKER = "saved_model.pb"        # the file that makes a numbered folder a version
    KIND = "SavedModel"

    def __init__(self, path: str, version: int):
        import tensorflow as tf

        super().__init__(path, version)
        config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=tf.config.threading.get_intra_op_parallelism_threads(),
            inter_op_parallelism_threads=tf.config.threading.get_inter_op_parallelism_threads())
        self._session, meta = load_session(path, config)
        self._invalid_argument = tf.errors.InvalidArgumentError
        # As the server's own messages (nmt_tf.serving.api_protos), not TensorFlow's classes.
        self.signature_defs = {key: serving_protos.SignatureDef.FromString(value.SerializeToString())
                               for key, value in meta.signature_def.items()}
        self.signatures = sorted(k for k in self.signature_defs if k not in _NOT_SIGNATURES)
        try:
            check_assets(path)
            self.alignment_shape = _alignment_bound(path)
            self.search_cost = SearchCost.of(path)
            self.warmed_up = self._warm_up()
        except BaseException:
            self._session.close()
            raise

    def run(self, signature: str, feeds: dict, outputs) -> dict:
        sig = self.signature_defs[signature]
        self.acquire()
        try:
            return self._session.run({alias: sig.outputs[alias].name for alias in outputs},
                                     {sig.inputs[alias].name: value for alias, value in feeds.items()})
        except self._invalid_argument as e:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, failed_check_text(e.message)) from e
        finally:
            self.release()

    @property
    def metadata(self) -> dict:
        """The export's nmt_tf.json ({} for a SavedModel that is not an nmt_tf export)."""
        try:
            return read_metadata(self.path)
        except (OSError, ValueError):
            return {}

    def _free(self) -> None:
        self._session.close()
        # The session's tf.Graph is held in reference cycles: only Python's cyclic
        # collector frees it, which on its own ran after dozens of loads (RSS grew
        # 23-79 MB per load of the tiny export until then, BUILD_NOTES.md).
        # Once per unload, here (~0.1 s).
        self._session = None
        gc.collect()

    def _warm_up(self) -> int:
        """Replays the version's assets.extra/tf_serving_warmup_requests (TF
        Serving's format: PredictionLog records; nmt_tf.export writes one)
        before the version is served, so that its first real request does not
        pay for graph optimisation. At most WARMUP_RECORDS records, as TF
        Serving; a record that fails fails the load, as in TF Serving.
        Returns the number of requests replayed."""
        import tensorflow as tf
        from tensorflow_serving.apis import prediction_log_pb2

        path = os.path.join(self.path, "assets.extra", WARMUP_FILE)
        if not os.path.exists(path):
            return 0
        replayed = 0
        for number, record in enumerate(tf.data.TFRecordDataset(path).take(WARMUP_RECORDS), 1):
            try:
                log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
                if log.WhichOneof("log_type") != "predict_log":
                    continue
                request = log.predict_log.request
                name = request.model_spec.signature_name or DEFAULT_SIGNATURE
                self.run(name, {alias: tf.make_ndarray(proto) for alias, proto in request.inputs.items()},
                         list(request.output_filter) or list(self.signature_defs[name].outputs))
            except Exception as e:
                raise ValueError(f"warm-up request {number} of {path} failed: {type(e).__name__}: {e}") from e
            replayed += 1
        return replayed


def check_assets(path: str) -> None:
    """Refuses a version whose assets (vocabularies, SentencePiece models)
    are not the ones its graph was exported with (nmt_tf.json's
    asset_sha256): a truncated vocabulary loaded, passed warm-up and answered
    "Un[UNK][UNK]..." before (issue 95). Exports from before the digests, and
    SavedModels that are not nmt_tf exports, are not checked."""
    try:
        recorded = read_metadata(path).get("asset_sha256")
    except (FileNotFoundError, ValueError, AttributeError):
        return
    for name, digest in sorted((recorded or {}).items()):
        try:
            actual = sha256(os.path.join(path, "assets", name))
        except OSError:
            raise ValueError(f"assets/{name} is missing (the export wrote it); the version is not served") from None
        if actual != digest:
            raise ValueError(f"assets/{name} is not the file the graph was exported with (SHA-256 {actual[:12]}..., "
                             f"the export wrote {digest[:12]}...); the version is not served")


def alignment_bound(max_input_length: int, search: dict) -> tuple[int, int]:
    """(T, S): the largest output and source lengths an export can return in
    its alignment output ([batch, T, S] float32), from the limits fixed at
    export (--max_input_length, --max_length_ratio, --max_output_length: its
    `search` settings)."""
    source = int(max_input_length) + 1                       # with [EOS]
    output = min(int(search["max_length"]), math.ceil(float(search["max_length_ratio"]) * source))
    return max(output, 1), source


def _alignment_bound(path: str) -> tuple[int, int] | None:
    """alignment_bound of an nmt_tf export (its nmt_tf.json); None for a SavedModel that is not one."""
    try:
        meta = read_metadata(path)
        return alignment_bound(meta["max_input_length"], meta["search"])
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class SearchCost:
    """What one request's search can cost on an nmt_tf export, known before
    it runs: every sentence of a batch is searched with `beam_size`
    hypotheses (by each of `models` models) until the batch's longest
    output limit, min(max_length, ceil(max_length_ratio x source tokens
    with [EOS])), and a source is cut to `max_input_length` tokens. The
    source tokens are counted here the export's way (nmt_tf.inference.host_text)."""

    beam_size: int
    max_length: int
    max_length_ratio: float
    max_input_length: int
    models: int
    counter: object
    max_beam_size: int = 0              # the widest a request may ask for (translate_with_options)

    @classmethod
    def of_settings(cls, search: dict, max_input_length: int, models: int, counter,
                    max_beam_size: int = 0) -> "SearchCost":
        """From an export's search settings and input limit (a SavedModel's or a LiteRT folder's)."""
        return cls(int(search["beam_size"]), int(search["max_length"]), float(search["max_length_ratio"]),
                   int(max_input_length), max(1, models), counter, max(int(max_beam_size), int(search["beam_size"])))

    @classmethod
    def of(cls, path: str) -> "SearchCost | None":
        """From the export's nmt_tf.json; None for a SavedModel that is not an nmt_tf export."""
        try:
            meta = read_metadata(path)
            return cls.of_settings(meta["search"], meta["max_input_length"], len(meta.get("model_dirs") or [None]),
                                   source_counter(path, meta.get("tokenizer", "")), meta.get("max_beam_size", 0))
        except (FileNotFoundError, KeyError, TypeError, ValueError):
            return None

    def output_limit(self, source: bytes) -> int:
        tokens = self.counter.count(source, self.max_input_length) + 1
        return min(self.max_length, max(1, math.ceil(self.max_length_ratio * tokens)))

    def check(self, rows: int, sources, prefixed: bool, limit: int, beam_size: int | None = None) -> None:
        """Refuses a search of `rows` sentences (whose distinct texts are
        `sources`; `prefixed`: some have a target prefix, which may lengthen
        the output to max_length) that could take more than `limit`
        hypothesis-steps, at `beam_size` (default: the export's)."""
        beam = beam_size or self.beam_size
        longest = self.max_length if prefixed else max(map(self.output_limit, set(sources)), default=1)
        work = rows * beam * longest * self.models
        if work <= limit:
            return
        models = f" x {self.models} models" if self.models > 1 else ""
        fits = limit // (beam * longest * self.models)
        raise ServingError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"this request's search could take {work:,} hypothesis-steps ({rows} sentences x beam "
            f"{beam} x up to {longest} output tokens{models}), more than this server's limit of "
            f"{limit:,} per request (--max_search_work): send at most {fits} such sentences per request, or "
            "shorter ones")


# Default of --max_search_work: what `nmt_tf.translate --server` sends at most (64 lines a request) at
# beam 10 when every line may reach the 256-token output limit.
MAX_SEARCH_WORK = 64 * 10 * 256


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
    """Which versions under the base path are served: TF Serving's
    `model_version_policy` (latest N, the default with N = 1; all; specific)."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "VersionPolicy":
        """`latest`, `latest=N`, `all` or `specific=V1,V2,...` (nmt_tf.serve --model_version_policy)."""
        kind, _, arg = text.strip().partition("=")
        try:
            if kind == "latest":
                policy = cls("latest", int(arg) if arg else 1)
            elif kind == "all" and not arg:
                policy = cls("all")
            elif kind == "specific" and arg:
                policy = cls("specific", versions=tuple(sorted({int(v) for v in arg.split(",")})))
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"model version policy {text!r}: give latest, latest=N, all or specific=V1,V2,...") \
                from None
        policy.check()
        return policy

    @classmethod
    def from_proto(cls, proto) -> "VersionPolicy":
        """From TF Serving's FileSystemStoragePathSourceConfig.ServableVersionPolicy."""
        which = proto.WhichOneof("policy_choice")
        if which == "all":
            policy = cls("all")
        elif which == "specific":
            policy = cls("specific", versions=tuple(sorted(set(proto.specific.versions))))
        else:
            policy = cls("latest", proto.latest.num_versions or 1 if which == "latest" else 1)
        policy.check()
        return policy

    def check(self) -> None:
        if self.kind == "latest" and self.num_versions < 1:
            raise ValueError(f"model version policy latest={self.num_versions}: serve at least 1 version")
        if self.kind == "specific" and (not self.versions or any(not 0 <= v < 2**63 for v in self.versions)):
            raise ValueError(f"model version policy specific={list(self.versions)}: give versions from 0 to 2^63 - 1")

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve among `available` (sorted), highest first."""
        if self.kind == "all":
            chosen = available
        elif self.kind == "specific":
            chosen = [v for v in available if v in self.versions]
        else:
            chosen = available[-self.num_versions:]
        return sorted(chosen, reverse=True)

    def describe(self) -> str:
        return {"latest": f"the latest {self.num_versions}" if self.num_versions > 1 else "the latest",
                "all": "all versions", "specific": f"versions {', '.join(map(str, self.versions))}"}[self.kind]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One model of a TF Serving model config file (`--model_config_file`)."""

    name: str
    base_path: str
    policy: VersionPolicy
    labels: dict


def read_model_config(path: str) -> ModelConfig:
    """The model of TF Serving's ModelServerConfig text proto at `path`
    (`model_config_list { config { name, base_path, model_platform,
    model_version_policy, version_labels } }`); a relative base_path is taken
    from the file's folder. Raises ValueError naming the file: unreadable,
    not that proto, not exactly one model (nmt_tf.serve serves one), a
    platform other than tensorflow, or labels naming versions the policy
    does not serve."""
    from tensorflow_serving.config import model_server_config_pb2

    config = protos.parse_text(model_server_config_pb2.ModelServerConfig,
                               protos.read_text_file(path, "model config file"),
                               f"{path}: not a TF Serving model config (ModelServerConfig)")
    if config.WhichOneof("config") != "model_config_list" or len(config.model_config_list.config) != 1:
        raise ValueError(f"{path}: nmt_tf.serve serves one model; give one model_config_list with one config "
                         "(tensorflow_model_server serves several)")
    model = config.model_config_list.config[0]
    if not model.name or not model.base_path:
        raise ValueError(f"{path}: the model config needs a name and a base_path")
    if model.model_platform not in ("", "tensorflow"):
        raise ValueError(f"{path}: model_platform {model.model_platform!r}: nmt_tf.serve serves tensorflow models")
    try:
        policy = VersionPolicy.from_proto(model.model_version_policy)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    labels = dict(model.version_labels)
    if policy.kind == "specific" and any(v not in policy.versions for v in labels.values()):
        raise ValueError(f"{path}: version_labels {labels} name versions that model_version_policy does not serve")
    base = model.base_path if os.path.isabs(model.base_path) else os.path.join(os.path.dirname(path), model.base_path)
    return ModelConfig(model.name, base, policy, labels)


class ModelRegistry:
    """The versions of one model under a base path, served by a
    VersionPolicy (default: the highest one), with optional version labels
    ({label: version}, as in TF Serving's model config). `version_kind`:
    the class of its versions, LoadedVersion (SavedModels) or
    nmt_tf.serving.litert.LiteRTVersion (LiteRT model folders, each
    interpreter with `litert_threads` threads)."""

    def __init__(self, name: str, base_path: str, log=logging.info, policy: VersionPolicy | None = None,
                 labels: dict[str, int] | None = None, max_search_work: int = MAX_SEARCH_WORK,
                 version_kind: type | None = None, litert_threads: int = 1):
        self.name, self.base_path, self.log = name, base_path, log
        self.version_kind = version_kind or LoadedVersion
        self.litert_threads = litert_threads
        self.max_search_work = max_search_work      # hypothesis-steps one request's search may take (SearchCost)
        self.policy = policy or VersionPolicy()
        self.labels = dict(labels or {})
        self._loaded: dict[int, ServedVersion] = {}
        self._failed: dict[int, tuple[tuple, str]] = {}     # version -> (its files' stamp, error)
        self._ignored: set[str] = set()                      # folder names that are no int64, logged once
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def available_versions(self) -> list[int]:
        """The version folders with a saved_model.pb (with the LiteRT runtime,
        nmt_tf_litert.json). Names that are no
        int64 (TF Serving's version type, e.g. 99999999999999999999), or
        that are not plain ASCII digits without a leading zero ("٣١", "031",
        which would alias version 31), are ignored, with one log line per name."""
        if not os.path.isdir(self.base_path):
            return []
        versions = []
        for name in os.listdir(self.base_path):
            if not re.fullmatch(r"\d+", name) or not os.path.exists(os.path.join(self.base_path, name,
                                                                                   self.version_kind.MARKER)):
                continue
            # Only ASCII digits without leading zeros: "٣١" and "031" would otherwise alias version 31.
            reason = ("a version number must fit in int64" if name.isascii() and int(name) >= 2**63 else
                      "a version folder is named with ASCII digits and no leading zero"
                      if not re.fullmatch(r"0|[1-9][0-9]*", name, re.A) else None)
            if reason:
                if name not in self._ignored:
                    self._ignored.add(name)
                    self.log(f"ignoring {os.path.join(self.base_path, name)}: {reason}")
                continue
            versions.append(int(name))
        return sorted(versions)

    def poll(self) -> None:
        """Serves what the policy chooses among the versions on disk, as TF
        Serving's file system source does: a chosen version not yet loaded is
        loaded (the highest first), a loaded one no longer chosen, or whose
        folder is gone, is unloaded (its session closes after its last
        request). With the default policy, removing the served version serves
        the highest one left. A version that fails to load is reported once and
        tried again when its files change; the versions already served go on."""
        available = self.available_versions()
        wanted = self.policy.select(available)
        with self._lock:
            # A failed version whose folder is gone is no longer reported (GetModelStatus kept it before).
            self._failed = {v: failure for v, failure in self._failed.items() if v in available}
            loaded = dict(self._loaded)
        for version in wanted:
            if version in loaded:
                continue
            path = os.path.join(self.base_path, str(version))
            stamp = files_stamp(path)
            with self._lock:
                if version in self._failed and self._failed[version][0] == stamp:
                    continue        # reported once; tried again when its files change
            try:
                version_loaded = self._load(path, version)
            except Exception as e:   # a broken version never takes the served ones down
                message = f"{type(e).__name__}: {str(e).strip() or 'could not be loaded'}"
                with self._lock:
                    self._failed[version] = (stamp, message)
                self.log(f"could not load {self.name} version {version} ({message}); "
                         "it is tried again when its files change")
                continue
            with self._lock:
                self._loaded[version] = version_loaded
                self._failed.pop(version, None)
            self.log(f"serving {self.name} version {version} from {version_loaded.path}")
        # Unload what the policy no longer chooses once a chosen version serves
        # (TF Serving's availability-preserving policy: a new version that fails
        # to load leaves the old one serving), and at once a version whose folder is gone.
        with self._lock:
            serving_wanted = any(v in self._loaded for v in wanted)
            retired = [v for v in sorted(self._loaded) if v not in wanted
                       and (serving_wanted or v not in available)]
            old = [self._loaded.pop(v) for v in retired]
            left = sorted(self._loaded)
        for version, version_loaded in zip(retired, old):
            version_loaded.retire()      # its session closes after its last request
            gone = "was removed" if version not in available else "is no longer chosen by the version policy"
            self.log(f"{self.name} version {version} {gone}: unloaded; "
                     + (f"serving {', '.join(map(str, left))}" if left else
                        "no other version is left: nothing is served until one appears"))

    def _load(self, path: str, version: int) -> ServedVersion:
        if self.version_kind is LoadedVersion:
            return LoadedVersion(path, version)
        return self.version_kind(path, version, threads=self.litert_threads)

    @property
    def versions(self) -> list[int]:
        """The versions served, highest first."""
        with self._lock:
            return sorted(self._loaded, reverse=True)

    @property
    def failed(self) -> dict[int, str]:
        """Versions that could not be loaded, with their errors."""
        with self._lock:
            return {v: message for v, (_, message) in self._failed.items()}

    @property
    def failed_public(self) -> dict[int, str]:
        """`failed` as clients see it (GetModelStatus): the server's own paths
        written as "version N" (the log keeps them)."""
        out = {}
        for version, message in self.failed.items():
            bases = {self.base_path, os.path.abspath(self.base_path), os.path.realpath(self.base_path)}
            for base in sorted(bases, key=len, reverse=True):       # the longest first: a relative path is a part of it
                message = message.replace(os.path.join(base, str(version)), f"version {version}")
                message = message.replace(base, "the model base path")
            out[version] = message
        return out

    def watch(self, seconds: float) -> threading.Thread:
        def loop():
            while not self._stop.wait(seconds):
                self.poll()
        thread = threading.Thread(target=loop, daemon=True, name="version-poller")
        thread.start()
        return thread

    def stop(self):
        self._stop.set()

    def get(self, model_spec) -> ServedVersion:
        """The version a ModelSpec asks for (none: the highest served), or the TF Serving error."""
        if not model_spec.name:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "ModelSpec has no name specified.")
        which = model_spec.WhichOneof("version_choice")
        if model_spec.name != self.name:
            label = f"Specific({model_spec.name}, {model_spec.version.value})" if which == "version" \
                else f"Latest({model_spec.name})"
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: {label}")
        if which == "version_label":
            if model_spec.version_label not in self.labels:
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"Unrecognized servable version label: {model_spec.version_label}")
            version = self.labels[model_spec.version_label]
        else:
            version = model_spec.version.value if which == "version" else None
        with self._lock:
            if version is None:
                if not self._loaded:
                    raise ServingError(grpc.StatusCode.NOT_FOUND,
                                       f"Servable not found for request: Latest({self.name})")
                return self._loaded[max(self._loaded)]
            if version not in self._loaded:
                raise ServingError(grpc.StatusCode.NOT_FOUND,
                                   f"Servable not found for request: Specific({self.name}, {version})")
            return self._loaded[version]

    @property
    def current(self) -> ServedVersion | None:
        """The highest version served, or None."""
        with self._lock:
            return self._loaded[max(self._loaded)] if self._loaded else None

    @contextlib.contextmanager
    def use(self, model_spec):
        """The version a ModelSpec asks for (as `get`), held for the `with`
        block: unloading it waits for the block to end."""
        for _ in range(3):
            loaded = self.get(model_spec)
            try:
                loaded.acquire()
                break
            except VersionUnloaded:
                continue              # replaced between get and acquire: ask again
        else:
            raise ServingError(grpc.StatusCode.UNAVAILABLE, "the model's versions are being replaced; try again")
        try:
            yield loaded
        finally:
            loaded.release()


def check_reply_size(loaded: ServedVersion, outputs: list[str], batch: int, max_message_bytes: int,
                     can_filter: bool = True) -> None:
    """Refuses, before any decoding, a batch whose alignment output could be
    larger than a reply may be: [batch, T, S] float32 with the export's
    largest T and S. (The other outputs are a few strings or numbers per token;
    they are not bounded here.) `can_filter`: the client can leave outputs out
    (gRPC's output_filter; the REST API has none)."""
    if "alignment" not in outputs or loaded.alignment_shape is None or not batch:
        return
    per_sentence = loaded.alignment_shape[0] * loaded.alignment_shape[1] * 4
    if batch * per_sentence <= max_message_bytes:
        return
    fits = max_message_bytes // per_sentence
    raise ServingError(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"the reply to {batch} sentences could be {batch * per_sentence / 2**20:.1f} MiB (the alignment output, "
        f"[{batch}, {loaded.alignment_shape[0]}, {loaded.alignment_shape[1]}] float32 at most), more than this "
        f"server's message limit of {max_message_bytes / 2**20:.1f} MiB: send at most {fits} sentences per request "
        + ("with alignment, or leave alignment out with output_filter" if can_filter else
           "(the REST API returns every output; over gRPC, output_filter can leave alignment out)"))


def check_batch_size(alias: str, items: int, max_batch_size: int) -> None:
    """Refuses an input of more than `max_batch_size` items."""
    if items > max_batch_size:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"input {alias} holds {items} items; this server "
                           f"accepts at most {max_batch_size} per request")


# Bytes per element of the numeric dtypes a request may declare (DataType enum values; strings are counted by value).
_DTYPE_BYTES = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 8: 8, 9: 8, 10: 1, 14: 2, 17: 2, 18: 16, 19: 2, 22: 4, 23: 8}
_DT_STRING = 7

# Longest string a request may hold (a line to translate or score). The exports
# keep a line's first --max_input_length tokens (100 by default) and drop the
# rest, so 64 KiB loses nothing a model reads, and a 30 MB "line" no longer
# reaches the tokenizer (or comes back as a 30 MB token in source_tokens).
MAX_STRING_BYTES = 1 << 16


def shape_text(dims: list[int]) -> str:
    """A shape for an error message: in full up to 16 dimensions, else its
    first 8 and its rank (a request can declare thousands)."""
    if len(dims) <= 16:
        return str(list(dims))
    return "[" + ", ".join(map(str, dims[:8])) + f", ...] (rank {len(dims)})"


def check_rank(alias: str, dims: list[int], info) -> None:
    """Refuses an input whose rank is not the signature's."""
    rank = len(info.tensor_shape.dim)
    if not info.tensor_shape.unknown_rank and len(dims) != rank:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"input {alias} must have rank {rank}, got shape {shape_text(dims)}")


def check_declared_size(alias: str, proto, info, max_batch_size: int, max_bytes: int | None) -> None:
    """Refuses an input by what its TensorProto declares, before any tensor is
    built from it: an unknown rank, a negative dimension, a rank other than
    the signature's, a batch over `max_batch_size`, more values than
    elements, a string over MAX_STRING_BYTES, or more than `max_bytes` once
    expanded. (A TensorProto may give
    one value for a whole shape, which tf.make_ndarray repeats: 31 bytes on
    the wire can declare 100 million strings.)"""
    shape = proto.tensor_shape
    if shape.unknown_rank:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"input {alias} has an unknown rank")
    dims = [d.size for d in shape.dim]
    if any(d < 0 for d in dims):
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"input {alias} has a negative dimension: {shape_text(dims)}")
    check_rank(alias, dims, info)
    if dims:
        check_batch_size(alias, dims[0], max_batch_size)
    elements = math.prod(dims)
    if proto.dtype == _DT_STRING:
        values = proto.string_val
        if len(values) > elements:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input {alias} has {len(values)} values for shape {shape_text(dims)} ({elements} elements)")
        longest = max(range(len(values)), key=lambda i: len(values[i]), default=None)
        if longest is not None and len(values[longest]) > MAX_STRING_BYTES:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input {alias} item {longest} holds {len(values[longest]):,} bytes; this server takes "
                               f"at most {MAX_STRING_BYTES:,} per string (a model reads only a line's first tokens)")
        size = sum(len(v) for v in values) + (elements - len(values)) * (len(values[-1]) if values else 0)
    else:
        size = elements * _DTYPE_BYTES.get(proto.dtype, 16)
    if max_bytes is not None and size > max_bytes:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"input {alias} of shape {shape_text(dims)} would take {size:,} bytes, more than this server's "
                           f"message limit of {max_bytes:,}")


def check_search_work(loaded: ServedVersion, inputs, limit: int) -> None:
    """Refuses, before any tensor is built, a translation request whose
    search could take more than `limit` hypothesis-steps (SearchCost), from
    its declared rows and the distinct texts it holds. Other signatures
    (score) and SavedModels that are not nmt_tf exports are not bounded here."""
    cost = loaded.search_cost
    if cost is None or "text" not in inputs or _DT_STRING != inputs["text"].dtype:
        return
    dims = [d.size for d in inputs["text"].tensor_shape.dim]
    if not dims or not dims[0]:
        return
    prefix = inputs["target_prefix"] if "target_prefix" in inputs else None
    prefixed = prefix is not None and any(value.strip() for value in prefix.string_val)
    beam = None
    if "beam_size" in inputs:           # translate_with_options: the request's beam, checked against the export's
        try:
            beam = int(serving_protos.to_array(inputs["beam_size"]).reshape(-1)[0])
        except (ValueError, IndexError):
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "tensor parsing error: beam_size") from None
        if not 1 <= beam <= cost.max_beam_size:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, (
                "beam_size must be at least 1" if beam < 1 else beam_bound_text(cost.max_beam_size)))
    cost.check(dims[0], inputs["text"].string_val, prefixed, limit, beam)


def client_address(peer: str) -> str:
    """The client of a gRPC peer ("ipv4:10.0.0.7:51234", "ipv6:[::1]:51234")
    without its port: its address, which all its connections share."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class FairGate:
    """Decoding turns shared between clients (issue 95: one client's queue
    starved another's). At most `slots` requests decode at once; a request
    waits for a turn, and when one ends the next turn goes to the client
    that has waited longest for its own, each client's requests in their
    order (round robin), so another client's request waits for at most one
    turn whatever one client has queued. A client holds at most
    `per_client` requests (decoding or waiting); one more is refused at
    once (RESOURCE_EXHAUSTED), which leaves room for the others."""

    def __init__(self, slots: int, per_client: int):
        self.slots, self.per_client = slots, per_client
        self._free = slots
        self._waiting: collections.OrderedDict = collections.OrderedDict()   # client -> deque of Events
        self._held: collections.Counter = collections.Counter()             # client -> requests in the gate
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def turn(self, client: str, timeout: float):
        """Holds a decoding turn for `client` for the `with` block; a
        ServingError when the client has its share already, or when no turn
        came within `timeout` seconds."""
        with self._lock:
            if self._held[client] >= self.per_client:
                raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"this client has {self.per_client} requests in progress, its share of this "
                                   "server; send the next when one is answered")
            self._held[client] += 1
            ticket = None
            if self._free and not self._waiting:
                self._free -= 1
            else:
                ticket = threading.Event()
                self._waiting.setdefault(client, collections.deque()).append(ticket)
        try:
            if ticket is not None and not ticket.wait(max(timeout, 0.0)):
                with self._lock:
                    if not ticket.is_set():          # still waiting: leave the queue
                        queue = self._waiting.get(client)
                        if queue is not None and ticket in queue:
                            queue.remove(ticket)
                            if not queue:
                                del self._waiting[client]
                        ticket = None
                if ticket is None:
                    raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                       f"no decoding turn came within {timeout:g} s (the server is busy)")
        except BaseException:
            with self._lock:
                self._leave(client)
            raise
        try:
            yield
        finally:
            self._end(client)

    def _leave(self, client: str) -> None:
        """Counts one request of `client` out of the gate (the lock held)."""
        self._held[client] -= 1
        if self._held[client] <= 0:
            del self._held[client]

    def _end(self, client: str) -> None:
        with self._lock:
            self._leave(client)
            if self._waiting:                        # the turn passes to the client first in line
                next_client, queue = next(iter(self._waiting.items()))
                queue.popleft().set()
                if queue:
                    self._waiting.move_to_end(next_client)
                else:
                    del self._waiting[next_client]
            else:
                self._free += 1


# Longest a request waits for its merged batch when its client set no shorter deadline.
BATCH_WAIT_SECONDS = float(batching.MAX_BATCH_WAIT_SECONDS)


def run_predict(registry: ModelRegistry, request, max_batch_size: int, max_message_bytes: int | None = None,
                can_filter: bool = True, batcher: batching.Batcher | None = None, timeout: float | None = None,
                client: str = ""):
    """Predict, following TF Serving's checks and messages (predict_util.cc);
    `can_filter` as in check_reply_size. With a `batcher`, the call is joined
    with concurrent ones of the same version, signature and search settings
    (nmt_tf.serving.batching), waiting at most `timeout` seconds (default
    BATCH_WAIT_SECONDS), within its `client`'s (address) share of the queues."""
    with registry.use(request.model_spec) as loaded:
        return _predict(registry, loaded, request, max_batch_size, max_message_bytes, can_filter, batcher, timeout,
                        client)


def _predict(registry, loaded, request, max_batch_size, max_message_bytes, can_filter, batcher, timeout, client):
    """run_predict on the version `loaded`, held by the caller."""
    name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    if name not in loaded.signatures:
        raise ServingError(grpc.StatusCode.FAILED_PRECONDITION, f'Serving signature key "{name}" not found.')
    signature_def = loaded.signature_defs[name]
    expected = set(signature_def.inputs)
    sent = set(request.inputs)
    # As TF Serving: an input left out takes the signature's default, if it has one (translate_with_options').
    defaults = {alias: signature_def.defaults[alias] for alias in expected - sent if alias in signature_def.defaults}
    if sent | set(defaults) != expected:
        extra, missing = sorted(sent - expected), sorted(expected - sent - set(defaults))
        raise ServingError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"input size does not match signature: {len(sent)}!={len(expected)} "
            f"len({{{','.join(sorted(sent))}}}) != len({{{','.join(sorted(expected))}}}). "
            f"Sent extra: {{{','.join(extra)}}}. Missing but required: {{{','.join(missing)}}}.")
    outputs = list(request.output_filter) or sorted(signature_def.outputs)
    for alias in outputs:
        if alias not in signature_def.outputs:
            raise ServingError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"output tensor alias not found in signature: {alias} Outputs expected to be in the set "
                f"{{{','.join(sorted(signature_def.outputs))}}}.")
    if len(set(outputs)) != len(outputs):
        dup = next(a for a in outputs if outputs.count(a) > 1)
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"duplicate output tensor alias: {dup}")

    inputs = {**defaults, **request.inputs}
    for i, alias in enumerate(sorted(expected)):
        info, proto = signature_def.inputs[alias], inputs[alias]
        if proto.dtype != info.dtype:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"Expects arg[{i}] to be {serving_protos.dtype_name(info.dtype)} but "
                               f"{serving_protos.dtype_name(proto.dtype) if proto.dtype else 'invalid'} is provided")
        check_declared_size(alias, proto, info, max_batch_size, max_message_bytes)
    check_search_work(loaded, inputs, registry.max_search_work)
    feeds = {}
    for alias in sorted(expected):
        proto = inputs[alias]
        try:
            value = serving_protos.to_array(proto)
        except Exception as e:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"tensor parsing error: {alias}") from e
        feeds[alias] = value
    sizes = {v.shape[0] for v in feeds.values() if v.ndim}
    if len(sizes) > 1:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"inputs have different batch sizes: {sorted(sizes)}")
    if max_message_bytes:
        check_reply_size(loaded, outputs, max(sizes, default=0), max_message_bytes, can_filter)

    # Scalar inputs (translate_with_options' search settings) are the same for every row of a call.
    settings = {alias: value for alias, value in feeds.items() if not value.ndim}
    rows = {alias: value for alias, value in feeds.items() if value.ndim}
    if batcher is None or not sizes:
        result = loaded.run(name, feeds, outputs)
    else:
        wait = BATCH_WAIT_SECONDS if timeout is None else min(max(timeout, 0.0), BATCH_WAIT_SECONDS)
        # One queue per version, signature and search settings (requests of other settings are never
        # merged), as TF Serving's per signature: a merged batch fetches every output and each request
        # keeps its own. (Keyed by the output filter too, permuted filters opened queues of their own,
        # each with its max_enqueued_batches: issue 95.)
        everything = sorted(signature_def.outputs)
        key = (loaded, name, tuple((alias, settings[alias].item()) for alias in sorted(settings)))
        try:
            result = batcher.run(key, lambda arrays: loaded.run(name, {**arrays, **settings}, everything), rows,
                                 sizes.pop(), wait, client)
        except batching.TooLarge as e:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        except batching.QueueFull as e:
            raise ServingError(grpc.StatusCode.UNAVAILABLE, str(e)) from None
        except batching.OverShare as e:
            raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from None
        except batching.WaitedTooLong as e:
            raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, str(e)) from None
    response = serving_protos.PredictResponse()
    response.model_spec.name = registry.name
    response.model_spec.version.value = loaded.version
    response.model_spec.signature_name = name
    for alias in outputs:
        serving_protos.from_array(result[alias], response.outputs[alias])
    return response


def model_metadata(registry: ModelRegistry, request):
    """GetModelMetadata (the gRPC method and the REST .../metadata path): the
    served version's SignatureDefMap, packed as TF Serving packs it."""
    fields = list(request.metadata_field)
    if not fields:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                           "GetModelMetadataRequest must specify at least one metadata_field")
    for field in fields:
        if field != "signature_def":
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"Metadata field {field} is not supported")
    loaded = registry.get(request.model_spec)
    response = serving_protos.GetModelMetadataResponse()
    response.model_spec.name = registry.name
    response.model_spec.version.value = loaded.version
    signature_map = serving_protos.SignatureDefMap()
    for key, value in loaded.signature_defs.items():
        signature_map.signature_def[key].CopyFrom(value)
    packed = serving_protos.Any()
    packed.Pack(signature_map)
    response.metadata["signature_def"].CopyFrom(packed)
    return response


def model_status(registry: ModelRegistry, request):
    """GetModelStatus (the gRPC method and the REST model status path): like
    TF Serving, the served versions AVAILABLE, one that failed to load END with
    its error (the server's paths left out); every version unless the ModelSpec names one (a version label
    is not looked at, as in TF Serving's get_model_status_impl.cc)."""
    spec = request.model_spec
    if not spec.name:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    states = {version: (serving_protos.ModelVersionStatus.END,
                        serving_protos.StatusProto(error_code=grpc.StatusCode.UNKNOWN.value[0], error_message=message))
              for version, message in registry.failed_public.items()}
    for version in registry.versions:
        states[version] = (serving_protos.ModelVersionStatus.AVAILABLE, serving_protos.StatusProto(error_code=0))
    if spec.name != registry.name or not states:
        raise ServingError(grpc.StatusCode.NOT_FOUND, f"Could not find any versions of model {spec.name}")
    if spec.WhichOneof("version_choice") == "version":
        if spec.version.value not in states:
            raise ServingError(grpc.StatusCode.NOT_FOUND,
                               f"Could not find version {spec.version.value} of model {spec.name}")
        states = {spec.version.value: states[spec.version.value]}
    response = serving_protos.GetModelStatusResponse()
    for version in sorted(states, reverse=True):
        status = response.model_version_status.add()
        status.version = version
        status.state, proto = states[version]
        status.status.CopyFrom(proto)
    return response
