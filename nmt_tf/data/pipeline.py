"""Parallel corpora: validation, statistics, vocabularies and tf.data pipelines.

A corpus is two line-aligned text files (plain or gzip; gzip is recognized by
its magic bytes, not its name). Nothing here loads a corpus into memory: line
counts stream through fixed-size chunks, statistics and vocabularies stream
through tf.data, and training reads the files with `TextLineDataset` behind a
bounded shuffle buffer.

What happens to imperfect input (counted in `CorpusStats`, printed before
training and written to `<model_dir>/corpus_stats.json`):

* files missing, unreadable or of different line counts: `CorpusError`,
  naming both files and both counts;
* a pair empty on either side (after whitespace clean-up): skipped;
* a pair longer than `--max_len` tokens on either side: skipped;
* bytes that are not valid UTF-8: each invalid sequence becomes U+FFFD and
  the pair is kept (usually the damaged word becomes [UNK]);
* a corpus with no usable pair left: `CorpusError`.

Pipeline stage order (as in OpenNMT-tf): shard -> shuffle -> tokenize (in
batches of lines) -> filter -> pools sorted by length, cut into batches ->
shuffle batches -> prefetch.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import time
import zlib

import tensorflow as tf

from nmt_tf.core import files
from nmt_tf.core import model_dir as layout
from nmt_tf.core.files import WriteFailed, is_gzip, write_atomically
from nmt_tf.data import text
from nmt_tf.data.text import with_bos, with_eos
from nmt_tf.data.tokenizers import tokenizer_class

# The functions tf.data traces are written in TensorFlow ops (tf.cond, tf.scan,
# tf.where), so autograph's source conversion, which tf.data otherwise runs over
# them and everything they call, changes nothing and cost ~2 s of every
# training's start (profiled on the tests' tiny model).
_ops_only = tf.autograph.experimental.do_not_convert

_TOKENIZE_BATCH = 1024          # lines tokenized together (vectorized TF string ops)
_SCAN_BATCH = 8192


class CorpusError(ValueError):
    """A problem with the user's corpus, stated in one sentence."""


# --------------------------------------------------------------------------
# Files


def _require_file(path: str | None, flag: str) -> str:
    """`path` (one file, or several separated by commas: `files.corpus_files`), each checked."""
    if not path or not files.corpus_files(path):
        raise CorpusError(f"--{flag} is required.")
    for part in files.corpus_files(path):
        if not os.path.exists(part):
            raise CorpusError(f"{part} does not exist (--{flag}).")
        if not os.path.isfile(part):
            raise CorpusError(f"{part} is not a file (--{flag}).")
    return path


def count_lines(path: str) -> int:
    """Number of lines (a last line without newline counts) of a corpus's files, streaming."""
    total = 0
    for part in files.corpus_files(path):
        try:
            total += files.count_lines(part)
        except (OSError, EOFError, zlib.error) as e:
            raise CorpusError(f"{part} could not be read: {e}.") from e
    return total


def check_parallel(src: str | None, tgt: str | None, src_flag: str, tgt_flag: str) -> int:
    """Both corpora exist and have the same number of lines; returns it.
    Corpora of several files (comma-separated) are compared file by file,
    so that a shift inside them is not hidden by equal totals."""
    _require_file(src, src_flag)
    _require_file(tgt, tgt_flag)
    src_parts, tgt_parts = files.corpus_files(src), files.corpus_files(tgt)
    if len(src_parts) != len(tgt_parts):
        raise CorpusError(f"--{src_flag} names {len(src_parts)} files but --{tgt_flag} {len(tgt_parts)}: "
                          "give the target file of each source file, in the same order.")
    total = 0
    for s, t in zip(src_parts, tgt_parts):
        n_src, n_tgt = count_lines(s), count_lines(t)
        if n_src != n_tgt:
            raise CorpusError(
                f"The corpus is not parallel: {s} (--{src_flag}) has {n_src:,} lines but "
                f"{t} (--{tgt_flag}) has {n_tgt:,} lines.")
        total += n_src
    if total == 0:
        raise CorpusError(f"The corpus {src} / {tgt} is empty.")
    return total


def text_lines(path: str) -> tf.data.Dataset:
    """Lines of a corpus: a plain or gzip text file, or several separated by
    commas, one after another; streamed."""
    parts = [tf.data.TextLineDataset(part, compression_type="GZIP" if is_gzip(part) else "", buffer_size=1 << 20)
             for part in files.corpus_files(path)]
    return functools.reduce(lambda a, b: a.concatenate(b), parts)


def parallel_lines(src: str, tgt: str) -> tf.data.Dataset:
    """(source line, target line) pairs, streamed."""
    return tf.data.Dataset.zip((text_lines(src), text_lines(tgt)))


def fingerprint(*paths: str) -> str:
    """Identity of files for caching statistics: path, size, mtime (of each file of a corpus)."""
    h = hashlib.sha1()
    for p in (part for path in paths for part in files.corpus_files(path)):
        st = os.stat(p)
        h.update(f"{os.path.abspath(p)}|{st.st_size}|{st.st_mtime_ns};".encode())
    return h.hexdigest()


# --------------------------------------------------------------------------
# Statistics


@dataclasses.dataclass
class CorpusStats:
    """What a pass over a parallel corpus found (see the module docstring)."""

    source: str
    target: str
    lines: int = 0
    pairs: int = 0                    # pairs used for training
    skipped_empty: int = 0
    skipped_too_long: int = 0
    invalid_utf8_lines: int = 0       # lines (either side) with bytes replaced by U+FFFD
    source_tokens: int = 0            # in used pairs, without EOS
    target_tokens: int = 0
    max_len: int = 0
    # length_histogram[k]: used pairs whose longer side has k tokens with EOS
    # (= max(source, target) + 1); decides the bucket of a pair.
    length_histogram: list = dataclasses.field(default_factory=list)
    # pipeline_pairs[i]: used pairs among lines i, i + N, i + 2N, ... (N =
    # len(pipeline_pairs)), what input pipeline i of N reads (make_dataset's
    # input_context); empty unless counted (`scan_corpus(pipelines=N)`, N > 1).
    pipeline_pairs: list = dataclasses.field(default_factory=list)

    def describe(self, name: str) -> str:
        return (
            f"{name} corpus {self.source} | {self.target}\n"
            f"  {self.lines:,} lines; {self.pairs:,} pairs used; skipped {self.skipped_empty:,} "
            f"empty and {self.skipped_too_long:,} longer than {self.max_len} tokens; "
            f"{self.invalid_utf8_lines:,} lines with invalid UTF-8 (bytes replaced by U+FFFD, pair kept)\n"
            f"  {self.source_tokens:,} source and {self.target_tokens:,} target tokens "
            f"({self.target_tokens + self.pairs:,} target tokens per epoch with [EOS])")


def _classify(src_tokens, tgt_tokens, max_len):
    src_len = tf.cast(src_tokens.row_lengths(), tf.int32)
    tgt_len = tf.cast(tgt_tokens.row_lengths(), tf.int32)
    empty = (src_len == 0) | (tgt_len == 0)
    too_long = ~empty & ((src_len > max_len) | (tgt_len > max_len))
    return src_len, tgt_len, ~empty & ~too_long, empty, too_long


def scan_corpus(src: str, tgt: str, src_tokenize, tgt_tokenize, max_len: int,
                count_tokens: bool = False, pipelines: int = 1):
    """One streaming pass: statistics, and optionally token counts of used pairs.

    Args:
      src, tgt: corpus files.
      src_tokenize, tgt_tokenize: [batch] raw string -> [batch, (tokens)] string.
      max_len: pairs longer than this on either side are skipped.
      count_tokens: also count every token of the used pairs.
      pipelines: > 1: also count the used pairs of each of this many input
        pipelines that read every pipelines-th line (stats.pipeline_pairs).

    Returns:
      (CorpusStats, source Counter, target Counter); the counters are empty
      unless `count_tokens`.
    """
    stats = CorpusStats(source=src, target=tgt, max_len=max_len)
    histogram = collections.Counter()
    src_counts, tgt_counts = collections.Counter(), collections.Counter()

    def analyse(line_numbers, lines):
        src_lines, tgt_lines = lines
        invalid = tf.reduce_sum(tf.cast(text.has_invalid_utf8(src_lines), tf.int64)
                                + tf.cast(text.has_invalid_utf8(tgt_lines), tf.int64))
        s, t = src_tokenize(src_lines), tgt_tokenize(tgt_lines)
        src_len, tgt_len, valid, empty, too_long = _classify(s, t, max_len)
        out = {
            "lines": tf.size(src_lines, tf.int64),
            "invalid": invalid,
            "empty": tf.reduce_sum(tf.cast(empty, tf.int64)),
            "too_long": tf.reduce_sum(tf.cast(too_long, tf.int64)),
            "bucket_len": tf.boolean_mask(tf.maximum(src_len, tgt_len) + 1, valid),
            "src_tokens": tf.reduce_sum(tf.boolean_mask(tf.cast(src_len, tf.int64), valid)),
            "tgt_tokens": tf.reduce_sum(tf.boolean_mask(tf.cast(tgt_len, tf.int64), valid)),
            "pipeline_pairs": tf.math.bincount(tf.cast(line_numbers % pipelines, tf.int32),
                                               weights=tf.cast(valid, tf.int64), minlength=pipelines,
                                               maxlength=pipelines),
        }
        if count_tokens:
            for side, tokens in (("src", s), ("tgt", t)):
                flat = tf.ragged.boolean_mask(tokens, valid).flat_values
                unique, _, counts = tf.unique_with_counts(flat)
                out[f"{side}_unique"], out[f"{side}_counts"] = unique, counts
        return out

    pipeline_pairs = [0] * pipelines
    ds = (parallel_lines(src, tgt).enumerate().batch(_SCAN_BATCH)
          .map(_ops_only(analyse), num_parallel_calls=tf.data.AUTOTUNE).prefetch(2))
    try:
        for batch in ds.as_numpy_iterator():
            stats.lines += int(batch["lines"])
            stats.invalid_utf8_lines += int(batch["invalid"])
            stats.skipped_empty += int(batch["empty"])
            stats.skipped_too_long += int(batch["too_long"])
            stats.source_tokens += int(batch["src_tokens"])
            stats.target_tokens += int(batch["tgt_tokens"])
            histogram.update(batch["bucket_len"].tolist())
            pipeline_pairs = [a + int(b) for a, b in zip(pipeline_pairs, batch["pipeline_pairs"])]
            if count_tokens:
                src_counts.update(dict(zip(batch["src_unique"], batch["src_counts"].tolist())))
                tgt_counts.update(dict(zip(batch["tgt_unique"], batch["tgt_counts"].tolist())))
    except tf.errors.DataLossError as e:
        raise CorpusError(f"{src} or {tgt} is damaged (gzip data error): {e.message}") from e
    stats.pairs = sum(histogram.values())
    stats.length_histogram = [histogram.get(k, 0) for k in range(max(histogram, default=0) + 1)]
    stats.pipeline_pairs = pipeline_pairs if pipelines > 1 else []
    decode = lambda c: collections.Counter({k.decode("utf-8"): v for k, v in c.items()})
    return stats, decode(src_counts), decode(tgt_counts)


# --------------------------------------------------------------------------
# Vocabularies and tokenizers


def vocabulary_paths(model_dir: str) -> tuple[str, str]:
    return layout.pair(model_dir, layout.VOCABULARIES)


def word_shortlist_paths(model_dir: str) -> tuple[str, str]:
    """The most frequent training words, as many as the vocabulary size: what
    counts as a known word for the papers' "no UNK" analyses, also for
    sub-word models."""
    return layout.pair(model_dir, layout.WORD_SHORTLISTS)


def word_splitter(lang: str):
    return lambda lines: text.split_words(text.clean(lines), lang)


def load_tokenizers(config, model_dir: str):
    """(source, target) `nmt_tf.data.text.Tokenizer`s of a model directory's vocabularies."""
    names = tokenizer_class(config.tokenizer).model_files
    models = layout.pair(model_dir, names) if names else (None, None)
    return tuple(text.make_tokenizer(vocab, config.tokenizer, lang, name=f"{side}_tokenizer", model_file=model)
                 for vocab, model, lang, side in zip(vocabulary_paths(model_dir), models,
                                                     (config.src_lang, config.tgt_lang), ("source", "target")))


def _used_pairs(config) -> tf.data.Dataset:
    """Batches of the training pairs that are used (judged by word counts:
    sub-word vocabularies are learned from them): {"lines": (source, target)
    cleaned lines, "words": (source, target) Moses-like words}."""
    def used(src_lines, tgt_lines):
        lines = (text.clean(src_lines), text.clean(tgt_lines))
        words = (text.split_words(lines[0], config.src_lang), text.split_words(lines[1], config.tgt_lang))
        valid = _classify(*words, config.max_len)[2]
        return {"lines": tuple(tf.boolean_mask(l, valid) for l in lines),
                "words": tuple(tf.ragged.boolean_mask(w, valid) for w in words)}

    return parallel_lines(config.train_src, config.train_tgt).batch(_SCAN_BATCH).map(_ops_only(used))


@dataclasses.dataclass
class VocabularyCorpus:
    """What a tokenizer learns its vocabularies from (`Tokenizer.learn_vocabularies`):
    the used training pairs, as counted words and as streams."""
    config: object
    word_counts: tuple           # (source, target) collections.Counter of the Moses-like words
    word_shortlists: tuple       # (source, target) the most frequent of them, specials first

    def words(self, side: int) -> tf.data.Dataset:
        """Batches of [batch, (words)] Moses-like words of one side (0 source, 1 target)."""
        return _used_pairs(self.config).map(_ops_only(lambda b: b["words"][side]))

    def sentences(self, sides):
        """The cleaned lines of the given sides (0 source, 1 target), streamed."""
        for batch in _used_pairs(self.config).map(_ops_only(lambda b: b["lines"])).prefetch(2).as_numpy_iterator():
            for side in sides:
                for line in batch[side]:
                    yield line.decode("utf-8")


def build_vocabularies(config, model_dir: str, log=print):
    """Vocabularies of the training data, built once and stored in model_dir.

    Returns (source Tokenizer, target Tokenizer, stats or None). The stats
    come back when the vocabulary pass could also serve as the statistics
    pass (word tokenizer), so that callers need not scan again.
    """
    src_path, tgt_path = vocabulary_paths(model_dir)
    stats = None
    if not (os.path.exists(src_path) and os.path.exists(tgt_path)):
        log(f"Building vocabularies from {config.train_src} and {config.train_tgt} ...")
        stats, src_counts, tgt_counts = scan_corpus(
            config.train_src, config.train_tgt, word_splitter(config.src_lang),
            word_splitter(config.tgt_lang), config.max_len, count_tokens=True)
        if stats.pairs == 0:
            raise CorpusError(no_pairs_message(stats))
        src_words = text.shortlist(src_counts, config.src_vocab_size)
        tgt_words = text.shortlist(tgt_counts, config.tgt_vocab_size)
        for words, path in zip((src_words, tgt_words), word_shortlist_paths(model_dir)):
            text.write_vocabulary(words, path)
        tokenizer = tokenizer_class(config.tokenizer)
        corpus = VocabularyCorpus(config, (src_counts, tgt_counts), (src_words, tgt_words))
        src_vocab, tgt_vocab = tokenizer.learn_vocabularies(config, corpus, model_dir, log)
        if not tokenizer.word_level:
            stats = None   # token lengths differ from word lengths: scan again later
        text.write_vocabulary(src_vocab, src_path)
        text.write_vocabulary(tgt_vocab, tgt_path)
    src_tok, tgt_tok = load_tokenizers(config, model_dir)
    return src_tok, tgt_tok, stats


def no_pairs_message(stats: CorpusStats) -> str:
    return (f"No usable sentence pair in {stats.source} / {stats.target}: of {stats.lines:,} lines, "
            f"{stats.skipped_empty:,} are empty on a side and {stats.skipped_too_long:,} are longer "
            f"than --max_len={stats.max_len} tokens.")


def corpus_stats(src: str, tgt: str, src_tokenizer, tgt_tokenizer, max_len: int,
                 cache_path: str | None = None, known: CorpusStats | None = None,
                 pipelines: int = 1) -> CorpusStats:
    """Statistics of a corpus under the model's tokenizers, cached by file
    identity; with the used pairs of each of `pipelines` input pipelines
    (stats.pipeline_pairs) when that is > 1. `known`: stats of a scan that
    already happened (used unless it lacks those counts)."""
    key = {"fingerprint": fingerprint(src, tgt), "max_len": max_len,
           "tokenizer": src_tokenizer.kind,
           "vocab": hashlib.sha1("\n".join(src_tokenizer.vocabulary + ["|"] + tgt_tokenizer.vocabulary)
                                 .encode()).hexdigest()}
    if pipelines > 1:
        key["pipelines"] = pipelines
    if cache_path and os.path.exists(cache_path):
        with open(cache_path, encoding="utf-8") as f:
            cached = json.load(f)
        if cached.get("key") == key:
            return CorpusStats(**cached["stats"])
    stats = known
    if stats is None or (pipelines > 1 and len(stats.pipeline_pairs) != pipelines):
        stats = scan_corpus(src, tgt, src_tokenizer.tokenize, tgt_tokenizer.tokenize, max_len,
                            pipelines=pipelines)[0]
    if cache_path:
        write_atomically(cache_path, json.dumps({"key": key, "stats": dataclasses.asdict(stats)}, indent=1))
    return stats


# --------------------------------------------------------------------------
# Batching


def batches_per_epoch(stats: CorpusStats, batch_size: int, batch_type: str, pool_size: int) -> int | None:
    """Exact number of batches in one epoch of one input pipeline that reads
    everything, or None when it depends on the data order.

    Sentence batches: every pool of `pool_size` pairs gives ceil(pool / batch)
    batches (the last pool may be smaller). Token batches depend on which
    pairs share a pool: None. (Several pipelines: pipeline_batches_per_epoch.)
    """
    if batch_type != "sentences":
        return None
    return _sentence_batches(stats.pairs, batch_size, pool_size)


def _sentence_batches(pairs: int, batch_size: int, pool_size: int) -> int:
    """Sentence batches of `pairs` pairs: ceil(pool / batch) per pool of
    `pool_size` (the last pool may be smaller)."""
    full, rest = divmod(pairs, pool_size)
    return full * math.ceil(pool_size / batch_size) + math.ceil(rest / batch_size)


def pipeline_batches_per_epoch(pipeline_pairs: list[int], batch_size: int, batch_type: str, pool_size: int,
                               input_context) -> int | None:
    """Steps that every input pipeline of `input_context` can feed in one
    epoch when each reads its own part of the data (`make_dataset`: its
    prepared shards, or every N-th line of the text) and gives one per-replica
    batch to each of its replicas per step. The pipelines' numbers of steps
    differ a little; a step needs all of them, so every pipeline stops at the
    smallest number. None for token batches.

    pipeline_pairs: the used pairs of each pipeline.
    """
    if batch_type != "sentences":
        return None
    per_replica = max(1, input_context.get_per_replica_batch_size(batch_size))
    local_replicas = replicas_per_pipeline(input_context)
    return min(_sentence_batches(pairs, per_replica, pool_size) // local_replicas for pairs in pipeline_pairs)


def replicas_per_pipeline(input_context) -> int:
    """Replicas one input pipeline feeds (a worker's local replicas): each
    step takes one per-replica batch from it for each of them."""
    return max(1, input_context.num_replicas_in_sync // input_context.num_input_pipelines)


def prepared_pipeline_pairs(manifest: dict, pipelines: int) -> list[int]:
    """The pairs each of `pipelines` input pipelines reads from prepared
    shards (pipeline i: shards i, i + pipelines, ...; `_prepared_rows`)."""
    return [sum(manifest["shard_pairs"][i::pipelines]) for i in range(pipelines)]


def _pool_batches(pool, batch_size: int, batch_type: str):
    """Sorts one pool of pairs by length and cuts it into batches (a Dataset).

    pool: dict of [n, (len)] ragged int32 tensors. The length of a pair is
    that of its longer side. Sentence batches hold `batch_size` pairs; token
    batches grow while (pairs x longest) stays within `batch_size` tokens.
    """
    lengths = tf.cast(tf.maximum(pool["source_ids"].row_lengths(), pool["target_ids"].row_lengths()), tf.int32)
    order = tf.argsort(lengths, stable=True)
    pool = {k: tf.gather(v, order) for k, v in pool.items()}
    lengths = tf.gather(lengths, order)
    n = tf.shape(lengths)[0]
    if batch_type == "sentences":
        batch_id = tf.range(n) // batch_size
    else:
        def pack(state, length):
            batch, count = state
            full = (count > 0) & ((count + 1) * length > batch_size)
            return (tf.where(full, batch + 1, batch), tf.where(full, 1, count + 1))
        batch_id, _ = tf.scan(pack, lengths, initializer=(tf.constant(0), tf.constant(0)))
    positions = tf.range(n)
    starts = tf.math.segment_min(positions, batch_id)
    ends = tf.math.segment_max(positions, batch_id) + 1
    return tf.data.Dataset.from_tensor_slices((starts, ends)).map(
        _ops_only(lambda a, b: {k: v[a:b].to_tensor() for k, v in pool.items()}))


def _encode_fn(src_tokenizer, tgt_tokenizer, max_len: int, sampling: tuple[float, int] | None = None):
    """Batch of (source lines, target lines) -> ragged id rows of the pairs
    training uses (no EOS / BOS), as every input pipeline tokenizes them.

    sampling: (alpha, nbest_size) of subword regularisation (`make_dataset`).
    """
    samplers = (src_tokenizer.sampler(*sampling), tgt_tokenizer.sampler(*sampling)) if sampling else None

    def encode(src_lines, tgt_lines):
        s, t = src_tokenizer.tokenize(src_lines), tgt_tokenizer.tokenize(tgt_lines)
        valid = _classify(s, t, max_len)[2]
        if samplers:
            s = samplers[0](tf.boolean_mask(src_lines, valid))
            t = samplers[1](tf.boolean_mask(tgt_lines, valid))
            return src_tokenizer.lookup(s), tgt_tokenizer.lookup(t)
        s, t = src_tokenizer.lookup(s), tgt_tokenizer.lookup(t)
        return tf.ragged.boolean_mask(s, valid), tf.ragged.boolean_mask(t, valid)

    return encode


def _model_rows(s, t):
    """Ragged id rows -> the model's source, target input and label rows."""
    return {"source_ids": with_eos(s), "target_ids": with_bos(t), "labels": with_eos(t)}


class PairEncoder:
    """Batches of (source, target) lines -> the model's id rows of the pairs
    training uses, as one traced function of its tokenizers, --max_len and
    subword sampling. `make_dataset` builds one per call; a run builds one
    and gives it to every epoch's `make_dataset` (`encoder=`), so that an
    epoch does not trace the tokenizers again."""

    def __init__(self, src_tokenizer, tgt_tokenizer, max_len: int, sampling: tuple[float, int] | None = None):
        self.settings = (src_tokenizer, tgt_tokenizer, max_len, sampling)
        encode = _encode_fn(src_tokenizer, tgt_tokenizer, max_len, sampling)
        lines = tf.TensorSpec([None], tf.string)
        self._rows = tf.function(lambda a, b: _model_rows(*encode(a, b)), autograph=False,
                                 input_signature=[lines, lines])

    def __call__(self, src_lines, tgt_lines) -> dict:
        return self._rows(src_lines, tgt_lines)


def make_dataset(src: str, tgt: str, src_tokenizer, tgt_tokenizer, *, max_len: int,
                 batch_size: int, batch_type: str = "sentences", pool_size: int = 1600,
                 shuffle: bool = False, shuffle_buffer: int = 100_000, seed: int = 0,
                 epoch: int = 0, skip_batches: int = 0,
                 input_context: tf.distribute.InputContext | None = None,
                 prepared: str | None = None, sampling: tuple[float, int] | None = None,
                 encoder: PairEncoder | None = None) -> tf.data.Dataset:
    """Batches of one epoch of a parallel corpus, ready for `model.fit`.

    Each element is ``({"source_ids": [B, Tx], "target_ids": [B, Ty]}, labels [B, Ty])``
    (int32, right-padded with 0): source = x_1..x_n [EOS], target_ids =
    [BOS] y_1..y_m, labels = y_1..y_m [EOS].

    Batching follows the paper (paper 000 App. B.2; docs/SPEC.md §5): the stream is read in pools of
    `pool_size` pairs (paper: 1,600); each pool is sorted by length and cut
    into batches, so a batch holds pairs of similar length, and the batches
    are then shuffled (within a buffer of two pools). Every batch is full but
    the last of the epoch, and short and long batches alternate all through
    the epoch.

    Args:
      src, tgt: corpus files (plain or gzip).
      src_tokenizer, tgt_tokenizer: `nmt_tf.data.text.Tokenizer`s.
      max_len: longer pairs are dropped (as counted by `scan_corpus`).
      batch_size, batch_type: pairs per batch, or a budget of padded tokens
        (pairs x longest side) per batch.
      pool_size: pairs sorted together.
      shuffle, shuffle_buffer, seed, epoch: the order of an epoch depends
        only on (seed, epoch), so a resumed run sees the same order.
      skip_batches: batches of this epoch already trained on (resume).
      input_context: from `tf.distribute`; each input pipeline reads a
        disjoint shard of the lines and builds per-replica batches.
      prepared: a directory of `write_prepared_shards`: the pairs are read
        from its shards, already tokenized, instead of from src / tgt.
      sampling: (alpha, nbest_size): subword regularisation (Kudo 2018;
        --sentencepiece_alpha): each pair is cut into a sampled segmentation
        (the tokenizers' `sampler`), anew every time the dataset is read.
        Which pairs are kept (--max_len, empty lines) is decided on the best
        segmentation, so an epoch has the same pairs, and with sentence
        batches the same number of batches, as without sampling; a sampled
        segmentation may be longer than max_len. Not with `prepared`.
      encoder: a `PairEncoder` of these tokenizers, max_len and sampling,
        traced already (a run's epochs share one); by default a new one.
    """
    epoch_seed = (seed * 1_000_003 + epoch) % (2 ** 31 - 1)
    if input_context is not None:
        batch_size = max(1, input_context.get_per_replica_batch_size(batch_size))
    if prepared and sampling:
        raise ValueError("subword sampling cuts the text every epoch: it cannot read prepared shards")
    if prepared:
        ds = _prepared_rows(prepared, shuffle, shuffle_buffer, epoch_seed, input_context)
    else:
        ds = parallel_lines(src, tgt)
        if input_context is not None and input_context.num_input_pipelines > 1:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        if shuffle:
            ds = ds.shuffle(shuffle_buffer, seed=epoch_seed, reshuffle_each_iteration=False)
        if encoder is None:
            encoder = PairEncoder(src_tokenizer, tgt_tokenizer, max_len, sampling)
        elif encoder.settings != (src_tokenizer, tgt_tokenizer, max_len, sampling):
            raise ValueError("the encoder was built for other tokenizers, max_len or sampling than the dataset's")
        ds = (ds.batch(_TOKENIZE_BATCH)
              .map(_ops_only(encoder), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
              .unbatch())
    ds = (ds.ragged_batch(pool_size)
          .flat_map(_ops_only(lambda pool: _pool_batches(pool, batch_size, batch_type))))
    if shuffle:
        per_pool = math.ceil(pool_size / batch_size) if batch_type == "sentences" else 16
        ds = ds.shuffle(2 * per_pool, seed=epoch_seed + 1, reshuffle_each_iteration=False)
    ds = ds.map(_ops_only(lambda e: ({"source_ids": e["source_ids"], "target_ids": e["target_ids"]}, e["labels"])))
    if skip_batches:
        ds = ds.skip(skip_batches)
    return ds.prefetch(tf.data.AUTOTUNE)


# --------------------------------------------------------------------------
# Prepared shards: a corpus tokenized once (--prepared_shards)

PREPARED_FORMAT = 1
PREPARED_MANIFEST = "manifest.json"


def prepared_key(src: str, tgt: str, src_tokenizer, tgt_tokenizer, max_len: int) -> dict:
    """What prepared shards were made from: the corpus files (path, size,
    mtime), the vocabularies (their ids) and --max_len."""
    vocab = hashlib.sha1()
    for tok in (src_tokenizer, tgt_tokenizer):
        vocab.update(f"{tok.kind}|{tok.lang}|".encode() + "\n".join(tok.vocabulary).encode("utf-8") + b"\0")
    return {"format": PREPARED_FORMAT, "corpus": fingerprint(src, tgt), "vocabularies": vocab.hexdigest(),
            "max_len": max_len}


def read_prepared_manifest(prepared_dir: str) -> dict | None:
    try:
        with open(os.path.join(prepared_dir, PREPARED_MANIFEST), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_prepared_shards(src: str, tgt: str, src_tokenizer, tgt_tokenizer, prepared_dir: str, *,
                          max_len: int, shards: int, lines: int | None = None, log=print) -> dict:
    """Tokenizes a parallel corpus once, with the training pipeline's own
    in-graph tokenization (the same function, so nothing can differ), into
    `shards` TFRecord files of the pairs training uses. A record is a block of
    the pairs of up to 1,024 consecutive lines (fewer when the corpus has
    fewer than 1,024 `lines` per shard, so that every shard gets some): `tf.io.serialize_tensor` of the serialized
    [source ids, source row splits, target ids, target row splits] (int32 ids
    without EOS / BOS), so that reading parses a block at a time; blocks go
    round robin to the shards. Written into a temporary directory renamed into
    place with its manifest, so a run killed while preparing leaves no
    half-written shards behind; returns the manifest."""
    key = prepared_key(src, tgt, src_tokenizer, tgt_tokenizer, max_len)
    partial = prepared_dir.rstrip("/") + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    names = [f"train-{i:05d}-of-{shards:05d}.tfrecord" for i in range(shards)]
    encode = _encode_fn(src_tokenizer, tgt_tokenizer, max_len)

    def block(a, b):
        s, t = encode(a, b)
        parts = [s.flat_values, s.row_splits, t.flat_values, t.row_splits]
        return tf.io.serialize_tensor(tf.stack([tf.io.serialize_tensor(p) for p in parts])), s.nrows()

    block_lines = _TOKENIZE_BATCH if lines is None else max(1, min(_TOKENIZE_BATCH, math.ceil(lines / shards)))
    blocks = (parallel_lines(src, tgt).batch(block_lines)
              .map(_ops_only(block), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
              .prefetch(8))
    started, count, written = time.time(), 0, 0
    shard_pairs = [0] * shards
    try:
        writers = [tf.io.TFRecordWriter(os.path.join(partial, n)) for n in names]
        try:
            for record, pairs in blocks.as_numpy_iterator():
                if pairs:
                    writers[written % shards].write(record)
                    shard_pairs[written % shards] += int(pairs)
                    written += 1
                    count += int(pairs)
        finally:
            for w in writers:
                w.close()
    except (OSError, tf.errors.ResourceExhaustedError, tf.errors.UnknownError) as e:   # a full disk
        shutil.rmtree(partial, ignore_errors=True)
        raise WriteFailed(partial, e, kept="the partial shards were removed") from None
    seconds = time.time() - started
    manifest = {**key, "pairs": count, "blocks": written, "block_lines": block_lines, "shards": names,
                "shard_pairs": shard_pairs,
                "source": os.path.abspath(src),
                "target": os.path.abspath(tgt), "seconds": round(seconds, 1)}
    write_atomically(os.path.join(partial, PREPARED_MANIFEST), json.dumps(manifest, indent=1))
    shutil.rmtree(prepared_dir, ignore_errors=True)
    os.replace(partial, prepared_dir)
    log(f"Prepared {count:,} training pairs in {shards} shards in {prepared_dir} "
        f"({seconds:.0f} s, {count / max(seconds, 1e-9):,.0f} pairs/s).")
    return manifest


def _parse_block(record):
    """A prepared record -> (source ids, target ids), ragged [pairs, (len)]."""
    parts = tf.io.parse_tensor(record, tf.string)
    ids = lambda i: tf.ensure_shape(tf.io.parse_tensor(parts[i], tf.int32), [None])
    splits = lambda i: tf.ensure_shape(tf.io.parse_tensor(parts[i], tf.int64), [None])
    return (tf.RaggedTensor.from_row_splits(ids(0), splits(1), validate=False),
            tf.RaggedTensor.from_row_splits(ids(2), splits(3), validate=False))


def _prepared_rows(prepared_dir: str, shuffle: bool, shuffle_buffer: int, epoch_seed: int, input_context):
    """The model rows of prepared shards: the shards in an order shuffled by
    the epoch's seed, their blocks read by a deterministic parallel
    interleave, the pairs shuffled within `shuffle_buffer` by the same seed."""
    manifest = read_prepared_manifest(prepared_dir)
    if manifest is None:
        raise CorpusError(f"{prepared_dir} holds no prepared shards (no readable {PREPARED_MANIFEST}).")
    paths = [os.path.join(prepared_dir, n) for n in manifest["shards"]]
    files = tf.data.Dataset.from_tensor_slices(paths)
    if input_context is not None and input_context.num_input_pipelines > 1:
        files = files.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if shuffle:
        files = files.shuffle(len(paths), seed=epoch_seed, reshuffle_each_iteration=False)
    ds = files.interleave(tf.data.TFRecordDataset, cycle_length=min(len(paths), 8), block_length=1,
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = (ds.map(_ops_only(lambda r: _model_rows(*_parse_block(r))), num_parallel_calls=tf.data.AUTOTUNE,
                 deterministic=True)
          .unbatch())
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=epoch_seed, reshuffle_each_iteration=False)
    return ds
