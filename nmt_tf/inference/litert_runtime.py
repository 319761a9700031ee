"""Translation with an exported LiteRT model, without TensorFlow.

`nmt_tf.exporting.litert` writes a folder: the model's encoder and one decoder
step as the two signatures of one LiteRT flatbuffer (`model.tflite`, LiteRT
built-in ops only), the SentencePiece models and vocabularies, and a JSON
manifest (`nmt_tf_litert.json`). This module runs it with the
`ai-edge-litert` interpreter, NumPy and SentencePiece's own library: the
text is cleaned and cut into pieces on the host (`nmt_tf.inference.host_text`, the
same pieces as the SavedModel's graph), each sentence is encoded once, and
greedy or beam search runs here, step by step, exactly as `nmt_tf.inference.search`
runs it in the SavedModel (the same length limits, token masks, length
penalty, shrinking beam, finished pool and early stop), which is what an
app on a device does too (docs/litert.md).

`LiteRTClient` answers like `nmt_tf.inference.client.SignatureClient` on the
serving_default signature: the same outputs, names and shapes, so the
tools need not know which runtime translates.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from nmt_tf.core.files import sha256
from nmt_tf.inference import confidence
from nmt_tf.inference.confidence import confidence_of_outputs
from nmt_tf.inference.host_text import SentencePieceSource

FORMAT_VERSION = 2      # 2: tied embeddings looked up on the host ("host_embeddings")
READABLE_VERSIONS = (1, 2)
MANIFEST = "nmt_tf_litert.json"
HOST_EMBEDDING_SIGNATURE = "step_k1"    # whose subgraph's output layer holds E (nmt_tf.exporting.litert)
NEG = -1e9           # nmt_tf.inference.search.NEG
MASKED = -1e9        # nmt_tf.layers.attention.MASKED: the score bias of source padding
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPACE = "\u2581"     # SentencePiece's word boundary


class LiteRTModelError(ValueError):
    """A LiteRT model folder that cannot be used, in one sentence naming the file."""


def read_manifest(folder: str) -> dict:
    """The manifest of an exported LiteRT model folder, checked."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise LiteRTModelError(f"{path}: no such file; {folder} is not a LiteRT model folder written by "
                               "python -m nmt_tf.export --format=litert")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LiteRTModelError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "nmt_tf-litert":
        raise LiteRTModelError(f"{path}: not an nmt_tf LiteRT manifest")
    if manifest.get("format_version") not in READABLE_VERSIONS:
        raise LiteRTModelError(f"{path}: format version {manifest.get('format_version')!r}; this nmt_tf reads "
                               f"versions {', '.join(map(str, READABLE_VERSIONS))}: export the model again with "
                               "this nmt_tf")
    for key in ("files", "search", "max_input_length", "vocab_size"):
        if key not in manifest:
            raise LiteRTModelError(f"{path}: no {key!r} entry")
    return manifest


def _read_vocabulary(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        tokens = f.read().split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    if tokens[:4] != ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]:
        raise LiteRTModelError(f"{path}: not an nmt_tf vocabulary (its first lines must be [PAD] [UNK] [BOS] [EOS])")
    return tokens


def length_penalty(lengths, kind: str, alpha: float):
    """nmt_tf.inference.search.length_penalty in NumPy (float32, as there)."""
    lengths = np.asarray(lengths, np.float32)
    if kind == "gnmt":
        return np.power((np.float32(5.0) + lengths) / np.float32(6.0), np.float32(alpha))
    return np.power(np.maximum(lengths, np.float32(1.0)), np.float32(alpha))


class LiteRTModel:
    """An exported LiteRT model folder, loaded: its interpreter (one call at
    a time: LiteRTClient gives each thread its own), tokenizer and search
    settings."""

    def __init__(self, folder: str, num_threads: int | None = None):
        self.folder = folder
        self.manifest = manifest = read_manifest(folder)
        files = {name: os.path.join(folder, manifest["files"][name]) for name in
                 ("model", "source_sentencepiece", "source_vocabulary", "target_vocabulary")}
        for path in files.values():
            if not os.path.isfile(path):
                raise LiteRTModelError(f"{path}: missing (named by {os.path.join(folder, MANIFEST)})")
        for name, digest in sorted(manifest.get("sha256", {}).items()):
            path = os.path.join(folder, name)
            if os.path.isfile(path) and sha256(path) != digest:
                raise LiteRTModelError(f"{path}: not the file the export wrote (its SHA-256 differs from "
                                       f"{os.path.join(folder, MANIFEST)}'s): export the model again")
        try:
            self.interpreter = Interpreter(model_path=files["model"], num_threads=num_threads)
            self._encode = _Runner(self.interpreter, "encode")
            self._steps = {k: _Runner(self.interpreter, f"step_k{k}") for k in manifest.get("step_beams", [1])}
        except (ValueError, RuntimeError) as e:
            raise LiteRTModelError(f"{files['model']}: not a usable LiteRT model ({str(e).strip()[:300]})") from None
        if 1 not in self._steps:
            raise LiteRTModelError(f"{files['model']}: no step_k1 signature")
        host = manifest.get("host_embeddings") or {}
        self.host_source, self.host_target = bool(host.get("source")), bool(host.get("target"))
        if self.host_target:
            self.embeddings = _HostEmbeddings(self.interpreter, host, files["model"])
        try:
            self.pieces = SentencePieceSource(files["source_sentencepiece"])
        except (OSError, RuntimeError) as e:
            raise LiteRTModelError(f"{files['source_sentencepiece']}: not a SentencePiece model ({e})") from None
        self.source_vocabulary = {t: i for i, t in enumerate(_read_vocabulary(files["source_vocabulary"]))}
        self.target_vocabulary = _read_vocabulary(files["target_vocabulary"])
        if len(self.target_vocabulary) != manifest["vocab_size"]:
            raise LiteRTModelError(f"{files['target_vocabulary']}: {len(self.target_vocabulary)} tokens, the model "
                                   f"has {manifest['vocab_size']} outputs")
        self._target_pieces = self._target_ids = None     # loaded for scoring only (`target`)
        self.search = dict(manifest["search"])
        self.max_input_length = int(manifest["max_input_length"])
        self.calibrator = None          # a calibrated confidence output (nmt_tf.inference.confidence)
        if "confidence" in manifest["files"]:
            try:
                self.calibrator = confidence.load(os.path.join(folder, manifest["files"]["confidence"]))
            except confidence.CalibratorError as e:
                raise LiteRTModelError(str(e)) from None

    # -- source side --------------------------------------------------------

    def source(self, line) -> tuple[list[str], list[int], bool]:
        """A line's pieces (cut to max_input_length), their ids with [EOS], and whether it was cut."""
        pieces = self.pieces.pieces(line)
        truncated = len(pieces) > self.max_input_length
        pieces = pieces[:self.max_input_length]
        ids = [self.source_vocabulary.get(p, UNK_ID) for p in pieces] + [EOS_ID]
        return pieces, ids, truncated

    def encode(self, ids_list: list[list[int]]) -> dict:
        """Each sentence encoded alone, the batch padded to its longest source
        (keys and annotations with zeros, the score bias with MASKED, as the
        SavedModel's batched encoder leaves them)."""
        if self.host_source:
            outs = [self._encode(source_ids=np.asarray([ids], np.int32),
                                 source_embeddings=self.embeddings(np.asarray([ids]))) for ids in ids_list]
        else:
            outs = [self._encode(source_ids=np.asarray([ids], np.int32)) for ids in ids_list]
        width = max(len(ids) for ids in ids_list)
        batch = {}
        for name in outs[0]:
            if name == "state":
                batch[name] = np.concatenate([o[name] for o in outs], 0)
                continue
            fill = MASKED if name == "bias" else 0.0
            parts = []
            for o in outs:
                pad = width - o[name].shape[1]
                spec = [(0, 0), (0, pad)] + [(0, 0)] * (o[name].ndim - 2)
                parts.append(np.pad(o[name], spec, constant_values=fill) if pad else o[name])
            batch[name] = np.concatenate(parts, 0)
        return batch

    def step(self, previous: np.ndarray, state: np.ndarray, inputs: dict):
        """One decoder step for K hypotheses of each of B sentences (previous
        [B, K], state [B, K, d], inputs one row per sentence): log-probs
        [B, K, V], state [B, K, d], alpha [B, K, S]. Without a step_k<K>
        signature for this K, every hypothesis is a row of step_k1 with its
        sentence's inputs repeated (`tiled`: those, made once by the caller)."""
        batch, k = previous.shape
        if k not in self._steps:
            inputs = inputs if next(iter(inputs.values())).shape[0] == batch * k else _rows(inputs, np.arange(batch), k)
        run = self._steps[k] if k in self._steps else self._steps[1]
        shape = (batch, k) if k in self._steps else (batch * k, 1)
        previous = previous.reshape(shape)
        given = ({"previous_embeddings": self.embeddings(previous)} if self.host_target
                 else {"previous_ids": previous.astype(np.int32, copy=False)})
        out = run(**given, state=state.reshape(*shape, -1).astype(np.float32, copy=False), **inputs)
        if k in self._steps:
            return out["log_probs"], out["state"], out["alpha"]
        return (out["log_probs"].reshape(batch, k, -1), out["state"].reshape(batch, k, -1),
                out["alpha"].reshape(batch, k, -1))

    def step_inputs(self, inputs: dict, rows: np.ndarray, k: int) -> dict:
        """The per-sentence inputs of `rows` as `step` takes them for K hypotheses."""
        return _rows(inputs, rows, 1 if k in self._steps else k)

    def target(self, line) -> tuple[list[int], bool]:
        """A target line's ids (pieces cut to max_input_length, [EOS] added,
        as the score signature reads targets) and whether it was cut."""
        if self._target_pieces is None:
            path = os.path.join(self.folder, self.manifest["files"].get("target_sentencepiece", ""))
            try:
                self._target_pieces = SentencePieceSource(path)
            except (OSError, RuntimeError) as e:
                raise LiteRTModelError(f"{path}: no target SentencePiece model to score with ({e})") from None
            self._target_ids = {t: i for i, t in enumerate(self.target_vocabulary)}
        pieces = self._target_pieces.pieces(line)
        ids = [self._target_ids.get(p, UNK_ID) for p in pieces[:self.max_input_length]] + [EOS_ID]
        return ids, len(pieces) > self.max_input_length

    def score_batch(self, ids_list: list[list[int]], targets: list[list[int]]) -> np.ndarray:
        """log p(y_t | y_<t, x) of each target token (forced decoding, the
        targets' ids with [EOS]): [B, T] float32, zero past a target's end,
        as the score signature gives them. One step per target position,
        for the sentences whose target is still going."""
        inputs = self.encode(ids_list)
        state = inputs.pop("state")[:, None]
        batch, steps = len(targets), max(len(t) for t in targets)
        labels = np.zeros([batch, steps], np.int64)
        for b, t in enumerate(targets):
            labels[b, :len(t)] = t
        previous = np.concatenate([np.full([batch, 1], BOS_ID), labels[:, :-1]], 1)
        lengths = np.array([len(t) for t in targets])
        out = np.zeros([batch, steps], np.float32)
        taken, cached = None, None
        for t in range(steps):
            rows = np.flatnonzero(lengths > t)
            if taken is None or len(taken) != len(rows):
                taken, cached = rows, _rows(inputs, rows)
            log_probs, new_state, _ = self.step(previous[rows, t:t + 1], state[rows], cached)
            out[rows, t] = log_probs[np.arange(len(rows)), 0, labels[rows, t]]
            state[rows] = new_state
        return out

    # -- search ---------------------------------------------------------------

    def token_penalties(self, suppress_unk: bool) -> np.ndarray:
        """nmt_tf.inference.search._token_penalties: rows 0 (any token), 1 (no [EOS] yet), 2 (only [EOS])."""
        ids = np.arange(len(self.target_vocabulary))
        forbidden = (ids == PAD_ID) | (ids == BOS_ID)
        if suppress_unk:
            forbidden |= ids == UNK_ID
        rows = np.stack([forbidden, forbidden | (ids == EOS_ID), ids != EOS_ID])
        return np.where(rows, np.float32(NEG), np.float32(0.0)).astype(np.float32)

    def search_batch(self, ids_list: list[list[int]], options: dict) -> dict:
        """Greedy (beam_size 1) or beam search of a batch, as nmt_tf.inference.search;
        beam-shaped NumPy results: tokens [B, N, T], scores, log_probs,
        lengths [B, N], alignments [B, N, T, S]."""
        inputs = self.encode(ids_list)
        state = inputs.pop("state")
        src_len = np.array([len(ids) for ids in ids_list], np.float32)
        max_len = np.clip(np.ceil(np.float32(options["max_length_ratio"]) * src_len).astype(np.int32), 1,
                          options["max_length"])
        min_len = np.minimum(np.floor(np.float32(options["min_length_ratio"]) * src_len).astype(np.int32),
                             max_len - 1)
        penalties = self.token_penalties(options["suppress_unk"])
        if options["beam_size"] == 1:
            return _greedy(self, inputs, state, min_len, max_len, penalties, options)
        return _Beam(self, inputs, state, min_len, max_len, penalties, options).run()


def _kinds(steps: int, min_len: np.ndarray, max_len: np.ndarray) -> np.ndarray:
    """nmt_tf.inference.search._penalty_kind at every position t < steps, per
    sentence: [steps, B] (0 any token, 1 no [EOS] yet, 2 only [EOS])."""
    t = np.arange(steps)[:, None] + 1
    return np.where(t >= max_len, 2, np.where(t <= min_len, 1, 0))


def _rows(inputs: dict, rows: np.ndarray, repeat: int = 1) -> dict:
    taken = {name: value[rows] for name, value in inputs.items()}
    return {name: np.repeat(value, repeat, axis=0) for name, value in taken.items()} if repeat > 1 else taken


def _greedy(model: LiteRTModel, inputs, state, min_len, max_len, penalties, options) -> dict:
    """nmt_tf.inference.search.greedy_search: the most probable token at every step,
    computed for the sentences not yet done."""
    batch, width = state.shape[0], inputs["bias"].shape[1]
    steps = int(max_len.max(initial=0))
    tokens = np.zeros([batch, steps], np.int32)
    alignments = np.zeros([batch, steps, width], np.float32)
    log_prob = np.zeros([batch], np.float32)
    length = np.zeros([batch], np.int32)
    previous = np.full([batch], BOS_ID, np.int32)
    done = np.zeros([batch], bool)
    t, taken, cached = 0, None, None
    kinds = _kinds(steps, min_len, max_len)
    while t < steps and not done.all():
        rows = np.flatnonzero(~done)
        if taken is None or len(taken) != len(rows) or (taken != rows).any():
            taken, cached = rows, _rows(inputs, rows)
        log_probs, new_state, alpha = (x[:, 0] for x in model.step(previous[rows, None], state[rows, None], cached))
        log_probs = log_probs + penalties[kinds[t, rows]]
        best = log_probs.argmax(-1).astype(np.int32)
        tokens[rows, t] = best
        log_prob[rows] += log_probs[np.arange(len(rows)), best]
        length[rows] += 1
        state[rows] = new_state
        alignments[rows, t] = alpha
        previous = np.full([batch], PAD_ID, np.int32)
        previous[rows] = best
        done = done | (previous == EOS_ID) | (t + 1 >= max_len)
        t += 1
    scores = log_prob / length_penalty(length, options["length_penalty"], options["length_alpha"])
    return {"tokens": tokens[:, None, :t], "scores": scores[:, None], "log_probs": log_prob[:, None],
            "lengths": length[:, None], "alignments": alignments[:, None, :t]}


class _Beam:
    """nmt_tf.inference.search._BeamSearch in NumPy: K slots per sentence, the beam
    shrinking by one for every finished hypothesis, a pool of the K best
    finished ones (by normalised score), an exact early stop for the n best,
    back-pointers followed at the end."""

    def __init__(self, model, inputs, state, min_len, max_len, penalties, options):
        self.model, self.inputs, self.state0 = model, inputs, state
        self.min_len, self.max_len, self.penalties = min_len, max_len, penalties
        self.k, self.n = options["beam_size"], options["n_best"]
        self.kind, self.alpha = options["length_penalty"], options["length_alpha"]
        self.batch = state.shape[0]
        self.steps = int(max_len.max(initial=0))
        self.best_final_penalty = length_penalty(max_len, self.kind, self.alpha)
        self.kinds = _kinds(self.steps, min_len, max_len)
        self.history = []            # per step: (token [B, K], parent [B, K], alpha [B, K, S], score [B, K])
        self.at = np.arange(self.batch)[:, None]

    def extensions(self, log_probs, alive_score, kinds):
        """The k best one-token extensions per sentence: (score, token, parent)
        [R, k], best first, by nmt_tf.inference.search._best_extensions' exact blocks: a
        block of `width` candidates holding one of the k best has a maximum no
        lower than it, so the k best are among the k blocks of highest maxima;
        only those are searched (a top-k over K x V candidates cost 0.33 ms a step)."""
        rows, beam, vocab = log_probs.shape
        k = self.k
        # In place (log_probs is this step's own array); one sentence's penalty row is a view.
        penalties = self.penalties[kinds[0]][None] if (kinds == kinds[0]).all() else self.penalties[kinds]
        flat = np.add(log_probs, penalties[:, None, :], out=log_probs)
        flat = np.add(flat, alive_score[:, :, None], out=flat).reshape(rows, beam * vocab)
        width = _block_width(vocab)
        if (beam * vocab) % width:
            flat = np.pad(flat, [(0, 0), (0, width - (beam * vocab) % width)], constant_values=np.float32(2 * NEG))
        blocks = flat.reshape(rows, -1, width)
        at = np.arange(rows)[:, None]
        kept = min(k, blocks.shape[1])
        top_blocks = np.argpartition(-blocks.max(2), kept - 1, axis=1)[:, :kept]           # [R, kept]
        candidates = blocks[at, top_blocks].reshape(rows, kept * width)
        top = np.argpartition(-candidates, k - 1, axis=1)[:, :k]
        index = top_blocks[at, top // width] * width + top % width                        # into K x V
        values = candidates[at, top]
        order = np.lexsort((index, -values), axis=1)         # best first; ties: the lower index, as top_k
        index, values = index[at, order], values[at, order]
        return values, (index % vocab).astype(np.int32), (index // vocab).astype(np.int32)

    def advance(self, t, top_score, token, parent, new_state, alpha):
        k = self.k
        slots = np.arange(k)[None, :]
        valid = (slots < (k - self.fin_count)[:, None]) & (top_score > NEG / 2) & ~self.done[:, None]
        is_eos = token == EOS_ID
        self.history.append((token, parent, alpha, top_score))
        finished_now = valid & is_eos
        rank = top_score / length_penalty(t + 1, self.kind, self.alpha)
        pool = np.concatenate([self.fin_norm, np.where(finished_now, rank, np.float32(NEG))], 1)
        pool_id = np.concatenate([self.fin_id, t * k + np.broadcast_to(slots, token.shape)], 1)
        pick = np.argsort(-pool, axis=1, kind="stable")[:, :k]
        at = self.at
        self.fin_norm = pool[at, pick].astype(np.float32)
        self.fin_id = pool_id[at, pick]
        self.fin_count = self.fin_count + finished_now.sum(1)
        alive = valid & ~is_eos
        self.alive_score = np.where(alive, top_score, np.float32(NEG)).astype(np.float32)
        self.state = new_state[at, parent]
        hopeless = (self.fin_count >= self.n) & (self.alive_score.max(1) / self.best_final_penalty
                                                 <= self.fin_norm[:, self.n - 1])
        self.done = (self.done | hopeless | (self.fin_count >= k) | (t + 1 >= self.max_len)
                     | ~alive.any(1))
        self.previous = token

    def run(self) -> dict:
        batch, k = self.batch, self.k
        self.fin_norm = np.full([batch, k], NEG, np.float32)
        self.fin_id = np.zeros([batch, k], np.int64)
        self.fin_count = np.zeros([batch], np.int64)
        self.done = np.zeros([batch], bool)
        t = 0
        if self.steps > 0:
            # Step 0: one hypothesis per sentence ([BOS]); its k best extensions fill the beam.
            log_probs, new_state, alpha = self.model.step(np.full([batch, 1], BOS_ID), self.state0[:, None],
                                                          self.inputs)
            score, token, parent = self.extensions(log_probs, np.zeros([batch, 1], np.float32), self.kinds[0])
            self.advance(0, score, token, parent, new_state, np.repeat(alpha, k, 1))
            t = 1
        taken, cached = None, None
        while t < self.steps and not self.done.all():
            rows = np.flatnonzero(~self.done)
            if taken is None or len(taken) != len(rows) or (taken != rows).any():
                taken, cached = rows, self.model.step_inputs(self.inputs, rows, k)
            log_probs, new_state, alpha = self.model.step(self.previous[rows], self.state[rows], cached)
            score, token, parent = self.extensions(log_probs, self.alive_score[rows], self.kinds[t, rows])
            if len(rows) < batch:       # the rows of finished sentences: dead slots
                full = lambda x, fill: _scatter(batch, rows, x, fill)          # noqa: E731
                score, token, parent, new_state, alpha = (full(score, NEG), full(token, PAD_ID), full(parent, 0),
                                                          full(new_state, 0), full(alpha, 0))
            self.advance(t, score, token, parent, new_state, alpha)
            t += 1
        return self.results(t)

    def results(self, t: int) -> dict:
        k, n = self.k, self.n
        fin_norm, fin_id = self.fin_norm[:, :n], self.fin_id[:, :n]
        found = fin_norm > NEG / 2
        t_end = np.where(found, fin_id // k, -1)
        slot = fin_id % k
        width = self.inputs["bias"].shape[1]
        tokens = np.zeros([self.batch, n, t], np.int32)
        alignments = np.zeros([self.batch, n, t, width], np.float32)
        log_probs = np.full([self.batch, n], NEG, np.float32)
        for b, j in zip(*np.nonzero(found)):
            here, end = int(slot[b, j]), int(t_end[b, j])
            log_probs[b, j] = self.history[end][3][b, here]
            for step in range(end, -1, -1):
                token, parent, alpha, _ = self.history[step]
                tokens[b, j, step] = token[b, here]
                alignments[b, j, step] = alpha[b, parent[b, here]]
                here = int(parent[b, here])
        return {"tokens": tokens, "scores": fin_norm, "log_probs": log_probs,
                "lengths": np.where(found, t_end + 1, 0), "alignments": alignments}


class _HostEmbeddings:
    """The tied embedding matrix E, read from the output layer's weight
    tensors of a LiteRT model (the manifest's "host_embeddings": the file
    holds E once, there) and kept as stored (int8 with a scale per row, or
    float); called with ids [...], returns E[ids] [..., m] float32."""

    def __init__(self, interpreter, host: dict, path: str):
        try:
            subgraph = interpreter.get_signature_runner(host["signature"])._subgraph_index
            parts, scales = [], []
            for block in host["blocks"]:
                details = interpreter._get_tensor_details(block["tensor"], subgraph)
                a, b = block["rows"]
                if details["name"] != block["name"] or len(details["shape"]) != 2 or details["shape"][0] != b - a:
                    raise ValueError(f"tensor {block['tensor']} is not {block['name']!r} of {b - a} rows")
                values = interpreter.get_tensor(block["tensor"], subgraph)
                parts.append(values)
                scales.append(_row_scales(details, b - a))
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as e:
            raise LiteRTModelError(f"{path}: its tied embeddings are not where its manifest says ({e})") from None
        self.values = np.concatenate(parts, 0)
        self.scale, self.zero = (np.concatenate(x, 0) for x in zip(*scales))
        self.quantized = self.values.dtype == np.int8

    def __call__(self, ids) -> np.ndarray:
        rows = self.values[ids]
        if not self.quantized:
            return rows.astype(np.float32)
        return (rows.astype(np.float32) - self.zero[ids][..., None]) * self.scale[ids][..., None]


def _row_scales(details: dict, rows: int) -> tuple:
    """(scale, zero point) per row of a 2-D weight tensor: per-row (axis 0)
    or per-tensor quantisation; ones and zeros for a float tensor."""
    params = details.get("quantization_parameters") or {}
    scale = np.asarray(params.get("scales", []), np.float32)
    zero = np.asarray(params.get("zero_points", []), np.float32)
    if scale.size == 0:
        return np.ones([rows], np.float32), np.zeros([rows], np.float32)
    if scale.size == 1:
        return np.full([rows], scale[0], np.float32), np.full([rows], zero[0] if zero.size else 0, np.float32)
    if scale.size != rows or params.get("quantized_dimension", 0) != 0:
        raise ValueError(f"{details['name']!r} is not quantised per row")
    return scale, zero if zero.size == rows else np.zeros([rows], np.float32)


def weight_tensors(path: str, signature: str) -> dict:
    """{index: (details, values)} of the 2-D tensors of a LiteRT model's
    `signature` subgraph (nmt_tf.exporting.litert finds E among them)."""
    interpreter = Interpreter(model_path=path)
    subgraph = interpreter.get_signature_runner(signature)._subgraph_index
    found = {}
    for index in range(interpreter._interpreter.NumTensors(subgraph)):
        details = interpreter._get_tensor_details(index, subgraph)
        if len(details["shape"]) == 2:
            try:
                found[index] = (details, interpreter.get_tensor(index, subgraph))
            except ValueError:         # a tensor with no data (an intermediate not allocated)
                continue
    return found


def dequantized(values: np.ndarray, details: dict) -> np.ndarray:
    """A 2-D weight tensor's values as float32 (per-row or per-tensor scales)."""
    if values.dtype != np.int8:
        return values.astype(np.float32)
    scale, zero = _row_scales(details, values.shape[0])
    return (values.astype(np.float32) - zero[:, None]) * scale[:, None]


class _Runner:
    """One signature of the interpreter, called as its SignatureRunner is,
    but an input is resized and its tensors reallocated only when its shape
    changes, and an input given as the very array of the last call is not
    copied in again (a beam's per-sentence inputs stay for many steps)."""

    def __init__(self, interpreter, key: str):
        self.runner = interpreter.get_signature_runner(key)
        try:        # the runner's own handles (ai-edge-litert 2.x); else its public call
            self.wrapper, self.subgraph = self.runner._interpreter_wrapper, self.runner._subgraph_index
            self.inputs, self.outputs = dict(self.runner._inputs), dict(self.runner._outputs)
        except AttributeError:
            self.wrapper = None
        self.shapes, self.last = {}, {}

    def __call__(self, **inputs) -> dict:
        if self.wrapper is None:
            return self.runner(**inputs)
        if set(inputs) != set(self.inputs):
            raise ValueError(f"inputs {sorted(inputs)}, expected {sorted(self.inputs)}")
        resized = False
        for name, value in inputs.items():
            if self.shapes.get(name) != value.shape:
                self.wrapper.ResizeInputTensor(self.inputs[name], np.array(value.shape, np.int32), False,
                                               self.subgraph)
                self.shapes[name] = value.shape
                resized = True
        if resized:
            self.wrapper.AllocateTensors(self.subgraph)
            self.last = {}
        for name, value in inputs.items():
            if self.last.get(name) is not value:
                self.wrapper.SetTensor(self.inputs[name], value, self.subgraph)
                self.last[name] = value
        self.wrapper.Invoke(self.subgraph)
        return {name: self.wrapper.GetTensor(index, self.subgraph) for name, index in self.outputs.items()}


@functools.cache
def _block_width(vocab: int) -> int:
    """nmt_tf.inference.search._block_size: a divisor of the vocabulary size near its
    square root, or that square root (the candidates are then padded)."""
    root = max(1, round(vocab ** 0.5))
    divisors = [d for d in range(max(1, root // 4), 4 * root + 1) if vocab % d == 0]
    return min(divisors, key=lambda d: abs(d - root)) if divisors else root


def _scatter(batch: int, rows: np.ndarray, values: np.ndarray, fill) -> np.ndarray:
    out = np.full((batch,) + values.shape[1:], fill, values.dtype)
    out[rows] = values
    return out


# serving_default's outputs as the SavedModel export declares them, which a LiteRTClient returns:
# (TensorFlow dtype, shape; -1 unknown, "n" the n-best size); "confidence" too with a calibrator.
OUTPUTS = {
    "translation": ("DT_STRING", [-1]), "score": ("DT_FLOAT", [-1]), "log_prob": ("DT_FLOAT", [-1]),
    "source_tokens": ("DT_STRING", [-1, -1]), "target_tokens": ("DT_STRING", [-1, -1]),
    "alignment": ("DT_FLOAT", [-1, -1, -1]), "truncated": ("DT_BOOL", [-1]),
    "nbest_translations": ("DT_STRING", [-1, "n"]), "nbest_scores": ("DT_FLOAT", [-1, "n"]),
}
CONFIDENCE_OUTPUT = ("DT_FLOAT", [-1])


class LiteRTClient:
    """The serving_default signature of a LiteRT model folder, called like
    `nmt_tf.inference.client.SignatureClient`: string vectors in, the SavedModel's
    outputs out (translation, score, log_prob, source_tokens,
    target_tokens, alignment, truncated, nbest_translations, nbest_scores)."""

    def __init__(self, folder: str, *, outputs: list[str] | None = None, num_threads: int | None = None,
                 interpreters: int = 2, search: dict | None = None):
        self.model = LiteRTModel(folder, num_threads)
        # Calls from several threads (translate's --parallel_batches) each take an interpreter of
        # their own, up to `interpreters` (an interpreter runs one call at a time).
        self._free, self._made, self._most = [self.model], 1, interpreters
        self._pool_lock = threading.Condition()
        self._folder, self._threads = folder, num_threads
        self.where = folder
        self.signature = "serving_default"
        self.outputs = list(outputs) if outputs else None
        self.options = dict(self.model.search)
        self.options["n_best"] = min(self.options["n_best"], self.options["beam_size"])
        if search:                   # the host runs the search: any of its settings, checked
            self.options.update(checked_search(search, self.options))

    @contextlib.contextmanager
    def _interpreter(self):
        """An interpreter of the pool for one call (made when none is free
        and fewer than `interpreters` exist; else waits for one)."""
        with self._pool_lock:
            while not self._free and self._made >= self._most:
                self._pool_lock.wait()
            taken = self._free.pop() if self._free else None
            self._made += taken is None
        model = taken or LiteRTModel(self._folder, self._threads)
        try:
            yield model
        finally:
            with self._pool_lock:
                self._free.append(model)
                self._pool_lock.notify()

    def score(self, source, target) -> dict:
        """The score signature's outputs for pairs (string vectors): log_prob,
        log_prob_per_token, target_length, token_log_probs [B, T], truncated;
        forced decoding on the host with the step signatures."""
        sources, targets = list(source), list(target)
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        model = self.model
        src = [model.source(line) for line in sources]
        tgt = [model.target(line) for line in targets]
        batch = len(sources)
        if batch:
            with self._interpreter() as searcher:
                token_log_probs = searcher.score_batch([ids for _, ids, _ in src], [ids for ids, _ in tgt])
        else:
            token_log_probs = np.zeros([0, 1], np.float32)
        length = np.array([len(ids) for ids, _ in tgt], np.int32)
        log_prob = token_log_probs.sum(1).astype(np.float32)
        return {"log_prob": log_prob, "log_prob_per_token": (log_prob / np.maximum(length, 1)).astype(np.float32),
                "target_length": length, "token_log_probs": token_log_probs,
                "truncated": np.array([s[2] or t[1] for s, t in zip(src, tgt)], bool)}

    def has_output(self, output: str) -> bool:
        return output in OUTPUTS or (output == "confidence" and self.model.calibrator is not None)

    def output_size(self, output: str, axis: int) -> int | None:
        if output in ("nbest_translations", "nbest_scores") and axis == 1:
            return self.options["n_best"]
        return None

    def __call__(self, text, search: dict | None = None) -> dict:
        """The outputs for a string vector; `search`: settings for this call
        over the client's (checked_search)."""
        model, options = self.model, self.options
        if search:
            options = {**options, **checked_search(search, options)}
        lines = list(text)
        sources = [model.source(line) for line in lines]
        n = options["n_best"]
        batch = len(lines)
        if batch:
            with self._interpreter() as searcher:
                out = searcher.search_batch([ids for _, ids, _ in sources], options)
        else:
            out = {"tokens": np.zeros([0, n, 0], np.int32), "scores": np.zeros([0, n], np.float32),
                   "log_probs": np.zeros([0, n], np.float32), "alignments": np.zeros([0, n, 0, 1], np.float32)}
        keep = np.array([bool(pieces) for pieces, _, _ in sources], bool)
        vocabulary = model.target_vocabulary
        texts = np.array([[_detokenize(vocabulary, row) if keep[b] else b"" for row in out["tokens"][b]]
                          for b in range(batch)], dtype=object).reshape(batch, n)
        scores = np.where(keep[:, None], out["scores"], np.float32(0.0)).astype(np.float32)
        best = out["tokens"][:, 0] if batch else np.zeros([0, 0], np.int32)
        target_tokens = np.array([[vocabulary[i].encode() if i != PAD_ID and keep[b] else b"" for i in row]
                                  for b, row in enumerate(best)], dtype=object).reshape(best.shape)
        width = max((len(ids) for _, ids, _ in sources), default=1)
        source_tokens = np.array([[p.encode() for p in pieces] + [b"[EOS]"] + [b""] * (width - len(pieces) - 1)
                                  for pieces, _, _ in sources], dtype=object).reshape(batch, width)
        result = {
            "translation": texts[:, 0] if n else np.zeros([batch], object), "score": scores[:, 0],
            "log_prob": np.where(keep, out["log_probs"][:, 0], np.float32(0.0)).astype(np.float32),
            "source_tokens": source_tokens, "target_tokens": target_tokens,
            "alignment": out["alignments"][:, 0] * keep[:, None, None].astype(np.float32),
            "truncated": np.array([cut for _, _, cut in sources], bool),
            "nbest_translations": texts, "nbest_scores": scores,
        }
        if model.calibrator is not None and (self.outputs is None or "confidence" in self.outputs):
            result["confidence"] = confidence_of_outputs(result, model.calibrator).astype(np.float32)
        return {name: value for name, value in result.items() if self.outputs is None or name in self.outputs}


HOST_SEARCH_SETTINGS = ("beam_size", "n_best", "length_penalty", "length_alpha")


def checked_search(search: dict, options: dict) -> dict:
    """Search settings a LiteRT model takes per client (HOST_SEARCH_SETTINGS,
    over its export's `options`), checked: a ValueError naming the setting
    and its bound otherwise. A beam without a step signature of its own runs
    its hypotheses as rows of step_k1 (the same search, a little slower)."""
    unknown = sorted(set(search) - set(HOST_SEARCH_SETTINGS))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a search setting a LiteRT model takes per call "
                         f"({', '.join(HOST_SEARCH_SETTINGS)})")
    merged = {**options, **search}
    if not isinstance(merged["beam_size"], int) or not 1 <= merged["beam_size"] <= MAX_HOST_BEAM:
        raise ValueError(f"beam_size {merged['beam_size']!r}: from 1 to {MAX_HOST_BEAM}")
    if not isinstance(merged["n_best"], int) or not 1 <= merged["n_best"] <= merged["beam_size"]:
        raise ValueError(f"n_best {merged['n_best']!r}: from 1 to the beam size ({merged['beam_size']})")
    if merged["length_penalty"] not in ("average", "gnmt"):
        raise ValueError(f"length_penalty {merged['length_penalty']!r}: average or gnmt")
    if not isinstance(merged["length_alpha"], (int, float)) or not 0.0 <= merged["length_alpha"] <= 10.0:
        raise ValueError(f"length_alpha {merged['length_alpha']!r}: from 0 to 10")
    return {key: merged[key] for key in HOST_SEARCH_SETTINGS}


MAX_HOST_BEAM = 64


def _detokenize(vocabulary: list[str], ids) -> bytes:
    """nmt_tf.data.text Tokenizer.decode for SentencePiece: up to the first [EOS],
    without [PAD] and [BOS], pieces joined, word boundaries as spaces."""
    pieces = []
    for i in ids:
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            pieces.append(vocabulary[i])
    return "".join(pieces).replace(SPACE, " ").strip(" \t\n\r\f\v").encode()
