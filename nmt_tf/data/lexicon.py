r"""Vocabulary shortlists for search (Jean et al. 2015, "On Using Very Large
Target Vocabulary for Neural Machine Translation", §3.2): a search computes
its output layer and softmax over a few hundred or thousand likely target
tokens instead of the whole target vocabulary.

The lexical table (`lexical_table`, written into a model directory by
`python -m nmt_tf.shortlist`): IBM Model 1 (Brown et al. 1993; t(target
token | source token), a NULL source word, EM from uniform) over the
model's training pairs; for every source token the target tokens of highest
t(y | x), best first, and the target tokens' counts.

A search with `SearchOptions.shortlist_size` = C takes, once per batch of
sentences (`shortlist_ids`, in TF ops), its candidate target tokens: the
special tokens, the `shortlist_per_word` best translations of every token
of the batch's sources, and then the most frequent target tokens until
there are C. The translations are never cut: when a batch has more of them
than C leaves room for (a batch of 80 Multi30k sentences has about 1,300
with 10 per word), the list is longer than C, as Marian's lexical
shortlists are the union of their parts. Every step's output layer is
those columns of W_o (`Seq2SeqModel.restrict_output`) and its softmax
normalises over them only, as in Jean et al. (2015): a token outside the
shortlist cannot be produced, and scores are log-probabilities within the
shortlist, so translations can differ from a search over the whole
vocabulary.
"""

from __future__ import annotations

import contextlib
import itertools
import os

import numpy as np

from nmt_tf.core import model_dir as layout
from nmt_tf.core.files import corpus_line_stream
from nmt_tf.data.alignment import NULL, model1

SPECIALS = 4      # nmt_tf.data.text.SPECIAL_TOKENS ([PAD], [UNK], [BOS], [EOS]: ids 0-3), without importing TensorFlow


def lexical_table_path(model_dir: str) -> str:
    """In a model directory: written by `python -m nmt_tf.shortlist`."""
    return layout.path(model_dir, layout.LEXICAL_TABLE)


def lexical_table(pairs, source_vocab_size: int, target_vocab_size: int, keep: int = 50, iterations: int = 5,
                  chunk_pairs: int = 20000) -> dict:
    """What `python -m nmt_tf.shortlist` stores: for every source token its
    `keep` likeliest target tokens by IBM Model 1, best first
    ("candidates" [V_x, keep] int32, [PAD] where a token has fewer;
    "probabilities" [V_x, keep] float32, t(y | x)), and "target_counts" [V_y]
    int64, how often each target token occurs in `pairs`."""
    links, probabilities = model1([s for s, _ in pairs], [t for _, t in pairs], source_vocab_size,
                                  target_vocab_size, iterations, chunk_pairs)
    source, target = links // target_vocab_size, links % target_vocab_size
    order = np.lexsort((target, -probabilities, source))         # by source, best first, ties by id
    source, target, probabilities = source[order], target[order], probabilities[order]
    starts = np.searchsorted(source, source)                     # first link of the same source token
    rank = np.arange(len(source)) - starts
    kept = (rank < keep) & (source != NULL)
    candidates = np.zeros((source_vocab_size, keep), np.int32)          # [PAD], id 0
    table = np.zeros((source_vocab_size, keep), np.float32)
    candidates[source[kept], rank[kept]] = target[kept]
    table[source[kept], rank[kept]] = probabilities[kept]
    counts = np.bincount(np.concatenate([np.zeros(0, np.int64)] + [t for _, t in pairs]).astype(np.int64),
                         minlength=target_vocab_size)
    return {"candidates": candidates, "probabilities": table, "target_counts": counts}


def frequency_rank(counts) -> np.ndarray:
    """[V] int32: 0 for the most frequent token, ties by id."""
    order = np.lexsort((np.arange(len(counts)), -np.asarray(counts)))
    rank = np.empty(len(counts), np.int32)
    rank[order] = np.arange(len(counts), dtype=np.int32)
    return rank


def shortlist_ids(candidates, rank, source_ids, size: int, per_word: int, multiple: int = 1):
    """The sorted target ids a search of `source_ids` ([B, Tx]; [PAD]
    ignored) may produce, in TF ops: the special tokens, the `per_word` best
    translations (`candidates` [V_x, >= per_word]) of the sources' tokens,
    and then the most frequent others (`rank` [V_y], 0 most frequent) until
    there are `size`. The list grows past `size` rather than leave a
    translation out: [max(size, specials + translations)] int32, rounded up
    to a multiple of `multiple` (search's block width) and at most the
    whole vocabulary. The special tokens come first, at their own ids (they
    are the lowest), so a position of the list equals its id for them."""
    import tensorflow as tf

    vocab = tf.shape(rank)[0]
    # The sources' rows first, then their first per_word columns: slicing the
    # whole table first copied it on every request (0.5 ms of a one-sentence
    # search's ~19).
    translations = tf.reshape(tf.gather(candidates, tf.cast(source_ids, tf.int32))[..., :per_word], [-1, 1])
    # [PAD] rows hold only [PAD], which is special anyway; repeats add up.
    hit = tf.scatter_nd(translations, tf.ones(tf.shape(translations)[:1]), vocab[None]) > 0
    ids = tf.range(vocab)
    special = ids < SPECIALS
    tier = tf.where(special, 2.0, tf.where(hit, 1.0, 0.0))
    priority = tier * tf.cast(vocab + 1, tf.float32) + tf.cast(vocab - rank, tf.float32)   # exact below 2^24
    needed = tf.reduce_sum(tf.cast(special | hit, tf.int32))
    length = tf.maximum(size, -(-needed // multiple) * multiple)
    _, chosen = tf.math.top_k(priority, k=tf.minimum(length, vocab))
    return tf.sort(chosen)


class LexicalShortlist:
    """A model directory's lexical table, as the TF variables a search reads
    (`select`); a SavedModel that tracks this object stores them.

    Args:
      table: `lexical_table`'s dict (or the arrays of a lexical_shortlist.npz).
    """

    def __init__(self, table, path: str = "(in memory)"):
        import tensorflow as tf

        self.path = path
        candidates = np.asarray(table["candidates"], np.int32)
        self.width = candidates.shape[1]
        self.source_vocab_size = candidates.shape[0]
        self.target_vocab_size = len(table["target_counts"])
        self.module = tf.Module(name="lexical_shortlist")
        self.module.candidates = tf.Variable(candidates, trainable=False, name="candidates")
        self.module.frequency_rank = tf.Variable(frequency_rank(table["target_counts"]), trainable=False,
                                                 name="frequency_rank")

    @classmethod
    def load(cls, model_dir: str) -> "LexicalShortlist":
        """The table `python -m nmt_tf.shortlist` wrote into `model_dir`
        (FileNotFoundError / ValueError in one sentence otherwise)."""
        path = lexical_table_path(model_dir)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} does not exist: --shortlist_size needs the lexical table of "
                                    f"{model_dir}; make it with python -m nmt_tf.shortlist --model_dir={model_dir}")
        try:
            with np.load(path) as f:
                table = {key: f[key] for key in ("candidates", "target_counts")}
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{path} is not a lexical table written by nmt_tf.shortlist ({e}); "
                             "make it again") from None
        return cls(table, path)

    def check(self, model, options) -> None:
        """ValueError unless the table fits `model`'s vocabularies and `options`."""
        if (self.source_vocab_size, self.target_vocab_size) != (model.source_vocab_size, model.target_vocab_size):
            raise ValueError(f"{self.path} is for vocabularies of {self.source_vocab_size} / "
                             f"{self.target_vocab_size} tokens, the model has {model.source_vocab_size} / "
                             f"{model.target_vocab_size}: make it again for this model")
        if options.shortlist_per_word > self.width:
            raise ValueError(f"--shortlist_per_word={options.shortlist_per_word}: {self.path} keeps "
                             f"{self.width} translations per source token (nmt_tf.shortlist --shortlist_keep)")

    def select(self, source_ids, size: int, per_word: int, multiple: int = 1):
        """`shortlist_ids` with this table: [>= size] int32, sorted."""
        return shortlist_ids(self.module.candidates, self.module.frequency_rank, source_ids, size, per_word,
                             multiple)


def for_search(model_dir: str, model, options) -> LexicalShortlist | None:
    """The shortlist a search with `options` needs (None without
    --shortlist_size, or when it covers the whole target vocabulary)."""
    if not uses_shortlist(options, model.target_vocab_size):
        return None
    shortlist = LexicalShortlist.load(model_dir)
    shortlist.check(model, options)
    return shortlist


def uses_shortlist(options, target_vocab_size: int) -> bool:
    return 0 < options.shortlist_size < target_vocab_size


def coverage(table: dict, pairs, sizes, per_word: int) -> dict:
    """{size: fraction of the target tokens of `pairs` (sentence by sentence,
    [EOS] not counted) inside the shortlist a one-sentence search of that
    sentence would take (`shortlist_ids`, the search's own choice): how much
    it could still produce with each shortlist size."""
    import tensorflow as tf

    shortlist = LexicalShortlist(table)
    select = tf.function(lambda ids, size: shortlist.select(ids[None], size, per_word), autograph=False,
                         input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)])
    found = {size: 0 for size in sizes}
    for source, target in pairs:
        for size in sizes:
            found[size] += int(np.isin(target, select(np.asarray(source, np.int32), size).numpy()).sum())
    total = sum(len(target) for _, target in pairs)
    return {size: found[size] / max(total, 1) for size in sizes}


def encoded_pairs(src_path: str, tgt_path: str, source_tokenizer, target_tokenizer, max_len: int | None,
                  limit: int | None = None, batch_lines: int = 2000):
    """(pairs of (source ids, target ids) np.int32 arrays, pairs skipped):
    the lines of two parallel corpora (plain or gzip files, or several of them
    separated by commas, streamed) encoded by the
    tokenizers (no special tokens), skipping empty sides and sides over
    `max_len` tokens, at most `limit` pairs kept (the file is read no
    further). Files of unequal length are a ValueError naming the shorter."""
    import tensorflow as tf

    def encode(tokenizer, lines):
        return tokenizer.encode(tf.constant([line.rstrip(b"\r\n") for line in lines])).to_list()

    pairs, skipped = [], 0
    sources, targets = corpus_line_stream(src_path), corpus_line_stream(tgt_path)   # files after files
    with contextlib.closing(sources), contextlib.closing(targets):
        both = itertools.zip_longest(sources, targets)       # a missing line shows as None
        while True:
            block = list(itertools.islice(both, batch_lines))
            if not block:
                return pairs, skipped
            if block[-1][0] is None or block[-1][1] is None:
                shorter, longer = (src_path, tgt_path) if block[-1][0] is None else (tgt_path, src_path)
                raise ValueError(f"{shorter} has fewer lines than {longer}: they must be line-aligned")
            src = encode(source_tokenizer, [s for s, _ in block])
            tgt = encode(target_tokenizer, [t for _, t in block])
            for s, t in zip(src, tgt):
                if not s or not t or (max_len and (len(s) > max_len or len(t) > max_len)):
                    skipped += 1
                    continue
                pairs.append((np.asarray(s, np.int32), np.asarray(t, np.int32)))
                if limit and len(pairs) >= limit:
                    return pairs, skipped
