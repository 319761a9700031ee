"""Learned word and phrase representations, as paper 004 maps them (Figs. 4, 5).

Cho et al. (2014, paper 004 §4.4) look at two kinds of vectors of a trained
RNN Encoder-Decoder, each projected to 2-D by Barnes-Hut-SNE: the word
embedding matrix (Fig. 4; enlarged in Fig. 6) and the representation c of
phrases of four or more words (Fig. 5; Fig. 7). This module computes both for
a list of words or phrases, writes them for TensorBoard's Embedding
Projector (a TSV of vectors, a TSV of metadata and ``projector_config.pbtxt``
per folder: ``tensorboard --logdir OUT``) and places them in 2-D with t-SNE
(scikit-learn, ``method="barnes_hut"`` as in the paper) for
`nmt_tf.evaluation.plots.representation_map_png`.

The list (`read_phrases`, or `frequent_phrases` of the training source):
one word or phrase per line.

* **words**: the distinct Moses-like words of the list's lines (in order of
  first appearance); a word's vector is the mean of the source embedding
  rows E_x of its tokens: its own row for a word model, the mean of its
  pieces for a WordPiece / SentencePiece model (a map of words, not of
  pieces, whatever the tokenizer). Words with an [UNK] token have no vector
  of their own and are left out (and counted).
* **phrases**: every line, read by the encoder as a source sentence is
  (its tokens, then [EOS]). The vector (`PHRASE_VECTORS`):
  - ``summary`` (RNNencdec): c = tanh(V h_T), the fixed-length summary the
    decoder sees, exactly paper 004's Fig. 5 (the grConv encoder's c too).
  - ``mean_annotation`` (RNNsearch; its default): (1/T) Σ_j h_j over the
    phrase's T real positions ([EOS] included), h_j = [→h_j ; ←h_j]. RNNsearch
    has no single summary: the decoder reads all annotations through the
    attention, and the mean weighs every word, where s_0 sees the phrase
    only through ←h_1 (and is trained to start the decoder).
  - ``initial_state``: the decoder's s_0 (RNNsearch: tanh(W_s ←h_1);
    RNNencdec: tanh(V' c)).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re

import numpy as np

from nmt_tf.core.files import InputError, corpus_files, input_lines, write_atomically

PHRASE_VECTORS = ("auto", "summary", "mean_annotation", "initial_state")
VECTOR_DESCRIPTIONS = {
    "summary": "summary c = tanh(V h_T)",
    "mean_annotation": "mean annotation (1/T) sum_j h_j",
    "initial_state": "decoder initial state s_0",
}
NGRAM_SIZES = (2, 3, 4)            # "frequent short n-grams" of the default list
DEFAULT_LINES_READ = 100_000       # training lines counted for the default list
_WORD = re.compile(r"\w", re.UNICODE)
_BATCH = 64                        # phrases encoded together


class RepresentationError(ValueError):
    """A problem with the user's list or model, in one sentence."""


@dataclasses.dataclass
class Representations:
    """One kind of vectors, ready for the projector and the map.

    Attributes:
      name: "words" or "phrases" (file names: <name>.tsv, <name>_metadata.tsv, <name>.png).
      description: what a vector is (the projector's tensor name).
      labels: the N words or phrases.
      vectors: [N, d] float32.
      columns: metadata columns after the label, each N values.
      left_out: items given that have no vector (words with [UNK]).
    """

    name: str
    description: str
    labels: list[str]
    vectors: np.ndarray
    columns: dict[str, list]
    left_out: list[str] = dataclasses.field(default_factory=list)


# --------------------------------------------------------------------------
# The list


def normalize(line: str) -> str:
    """Whitespace runs (tabs included) to one space, ends stripped: a label safe in a TSV."""
    return " ".join(line.split())


def read_phrases(path: str) -> tuple[list[str], list[str]]:
    """The words or phrases of `path` (plain or gzip, one per line).

    Returns (lines, notes): the distinct non-blank lines in file order,
    whitespace normalized, and one note per kind of line left out (blank,
    repeated). Raises RepresentationError when the file is missing or holds
    no word.
    """
    try:
        raw = [normalize(l.decode("utf-8", errors="replace")) for l in input_lines(path, "phrases")]
    except InputError as e:
        raise RepresentationError(str(e)) from None
    lines = list(dict.fromkeys(l for l in raw if l))
    if not lines:
        raise RepresentationError(f"{path} holds no words or phrases (--phrases): give one per line.")
    blank = sum(1 for l in raw if not l)
    repeated = len(raw) - blank - len(lines)
    notes = [f"{n} {what} line{'s' if n > 1 else ''} of {path} left out"
             for n, what in ((blank, "blank"), (repeated, "repeated")) if n]
    return lines, notes


def frequent_phrases(path: str, split_words, n: int, max_lines: int = DEFAULT_LINES_READ) -> list[str]:
    """The default list: the `n` most frequent words of the first `max_lines`
    lines of `path`, then `n` frequent n-grams (an equal share of each size in
    NGRAM_SIZES, most frequent first) of words within a line. Only tokens
    with a letter or digit count (no punctuation); ties go by the text, so
    the list is deterministic.

    Args:
      path: the training source (plain or gzip; several files: comma-separated).
      split_words: [batch] string tensor -> [batch, (words)] ragged (the
        source tokenizer's `words`).
    """
    from nmt_tf.data.pipeline import text_lines

    if not corpus_files(path) or not all(os.path.isfile(part) for part in corpus_files(path)):
        raise RepresentationError(f"the model's training source {path} is not there to draw the default list "
                                  "from: give --phrases.")
    words, ngrams = collections.Counter(), {k: collections.Counter() for k in NGRAM_SIZES}
    for batch in text_lines(path).take(max_lines).batch(1024).map(split_words).as_numpy_iterator():
        for row in batch:               # an object array of [words] arrays
            tokens = [t.decode("utf-8", errors="replace") for t in row]
            words.update(t for t in tokens if _WORD.search(t))
            for k, counter in ngrams.items():
                counter.update(" ".join(tokens[i:i + k]) for i in range(len(tokens) - k + 1)
                               if all(_WORD.search(t) for t in tokens[i:i + k]))
    ranked = lambda counter, m: [t for t, _ in sorted(counter.items(), key=lambda tc: (-tc[1], tc[0]))[:m]]
    shares = [n // len(NGRAM_SIZES) + (i < n % len(NGRAM_SIZES)) for i in range(len(NGRAM_SIZES))]
    lines = ranked(words, n) + [g for k, m in zip(NGRAM_SIZES, shares) for g in ranked(ngrams[k], m)]
    if not lines:
        raise RepresentationError(f"{path} has no words to draw the default list from: give --phrases.")
    return lines


# --------------------------------------------------------------------------
# The vectors


def source_batch(tokenizer, lines: list[str]):
    """Lines -> the encoder's input, as nmt_tf.inference.translation_graph builds it (without its length cut).

    Returns (ids [N, L] int32: each line's token ids, then [EOS], right-padded
    with 0; tokens: N lists of the string tokens, [EOS] left out).
    """
    import tensorflow as tf

    from nmt_tf.data.text import PAD_ID, with_eos

    tokens = tokenizer.tokenize(tf.constant(lines, tf.string))
    ids = with_eos(tokenizer.lookup(tokens)).to_tensor(PAD_ID)
    return ids, [[t.decode("utf-8") for t in row] for row in tokens.to_list()]


def word_vectors(model, tokenizer, lines: list[str]) -> Representations:
    """The source word embeddings of paper 004 Fig. 4 for the words of `lines`.

    Each distinct word's vector is the mean of E_x's rows [K_x, m] over its
    tokens (one token for a word model, its pieces for a sub-word model);
    words with an [UNK] token are in `left_out`.

    Returns Representations with vectors [N, m].
    """
    import keras
    import tensorflow as tf

    from nmt_tf.data.text import UNK_ID

    split = tokenizer.words(tf.constant(lines, tf.string)).to_list()
    words = list(dict.fromkeys(w.decode("utf-8") for row in split for w in row))
    pieces = tokenizer.tokenize(tf.constant(words, tf.string))
    ids = tokenizer.lookup(pieces).to_list()
    pieces = [[p.decode("utf-8") for p in row] for row in pieces.to_list()]
    table = keras.ops.convert_to_numpy(model.source_embedding.embeddings).astype(np.float32)
    kept, vectors, left_out = [], [], []
    for word, row, word_pieces in zip(words, ids, pieces):
        if not row or UNK_ID in row:
            left_out.append(word)
            continue
        kept.append((word, word_pieces))
        vectors.append(table[row].mean(axis=0))
    tied = " (tied with the target)" if getattr(model, "tied_embeddings", "none") == "all" else ""
    piece_kind = "" if tokenizer.word_level else ", mean of the word's pieces"
    return Representations(
        "words", f"source word embedding E_x{tied}{piece_kind}", [w for w, _ in kept],
        np.asarray(vectors, np.float32).reshape(len(kept), table.shape[1]),
        {"tokens": [" ".join(p) for _, p in kept], "n_tokens": [len(p) for _, p in kept]}, left_out)


def resolve_phrase_vector(model, choice: str = "auto") -> str:
    """`choice` made concrete for `model`: "auto" is "summary" for RNNencdec
    and "mean_annotation" for RNNsearch; a vector the model has not is a
    RepresentationError."""
    if choice not in PHRASE_VECTORS:
        raise RepresentationError(f"--phrase_vector={choice}: choose one of {', '.join(PHRASE_VECTORS)}.")
    has_summary = hasattr(model, "summarizer")         # RNNencdec (GRU or grConv encoder)
    if choice == "auto":
        return "summary" if has_summary else "mean_annotation"
    if choice == "summary" and not has_summary:
        raise RepresentationError("--phrase_vector=summary: this RNNsearch model has no summary c (it attends "
                                  "to all annotations); use mean_annotation or initial_state.")
    if choice == "mean_annotation" and has_summary:
        raise RepresentationError("--phrase_vector=mean_annotation: this RNNencdec model keeps no annotations "
                                  "(its encoder gives one summary c); use summary or initial_state.")
    return choice


def encode_phrases(model, ids, vector: str):
    """One vector per phrase from the model's own encoder.

    Args:
      model: RNNSearch or RNNEncDec.
      ids: [N, L] int32 source ids ([EOS] last, padded with 0).
      vector: "summary", "mean_annotation" or "initial_state".

    Returns:
      [N, d] float32: c (d = n), the mean of h_j over the mask (d = 2n) or s_0 (d = n).
    """
    import tensorflow as tf

    encoded = model.encode(tf.convert_to_tensor(ids, tf.int32))
    if vector == "summary":
        out = encoded["context"]
    elif vector == "initial_state":
        out = encoded["state"]
    else:
        mask = tf.cast(encoded["mask"], tf.float32)[:, :, None]
        out = tf.reduce_sum(tf.cast(encoded["annotations"], tf.float32) * mask, axis=1) / tf.reduce_sum(mask, axis=1)
    return tf.cast(out, tf.float32).numpy()


def phrase_vectors(model, tokenizer, lines: list[str], vector: str = "auto") -> Representations:
    """The phrase representations of paper 004 Fig. 5 for every line.

    Args:
      vector: a `PHRASE_VECTORS` choice (see the module docstring).

    Returns Representations with vectors [N, d], d = n (summary, s_0) or 2n
    (mean annotation); metadata columns "vector", "words", "tokens".
    """
    import tensorflow as tf

    vector = resolve_phrase_vector(model, vector)
    chunks, tokens = [], []
    for start in range(0, len(lines), _BATCH):
        ids, chunk_tokens = source_batch(tokenizer, lines[start:start + _BATCH])
        chunks.append(encode_phrases(model, ids, vector))
        tokens += chunk_tokens
    n_words = [len(row) for row in tokenizer.words(tf.constant(lines, tf.string)).to_list()]
    description = f"{type(model).__name__} phrase {VECTOR_DESCRIPTIONS[vector]}"
    return Representations("phrases", description, list(lines), np.concatenate(chunks).astype(np.float32),
                           {"vector": [VECTOR_DESCRIPTIONS[vector]] * len(lines), "words": n_words,
                            "tokens": [" ".join(t) for t in tokens]})


# --------------------------------------------------------------------------
# Outputs


def _tsv_field(value) -> str:
    return normalize(str(value)) or "_"


def write_projector(out_dir: str, maps: list[Representations]) -> str:
    """Writes <name>.tsv (vectors), <name>_metadata.tsv (a header, then one
    row per vector) and projector_config.pbtxt (paths relative to `out_dir`,
    as TensorBoard's projector requires) into `out_dir`; returns the
    config's path. Maps without vectors are not written."""
    from tensorboard.plugins import projector

    os.makedirs(out_dir, exist_ok=True)
    config = projector.ProjectorConfig()
    for rep in maps:
        if not len(rep.labels):
            continue
        names = ["label", *rep.columns]
        rows = zip(rep.labels, *rep.columns.values())
        write_atomically(os.path.join(out_dir, f"{rep.name}.tsv"),
                         "".join("\t".join(f"{x:.6g}" for x in v) + "\n" for v in rep.vectors))
        write_atomically(os.path.join(out_dir, f"{rep.name}_metadata.tsv"),
                         "\t".join(names) + "\n" + "".join("\t".join(map(_tsv_field, r)) + "\n" for r in rows))
        embedding = config.embeddings.add()
        embedding.tensor_name = f"{rep.name}: {rep.description}"
        embedding.tensor_path = f"{rep.name}.tsv"
        embedding.metadata_path = f"{rep.name}_metadata.tsv"
        embedding.tensor_shape.extend(rep.vectors.shape)
    projector.visualize_embeddings(out_dir, config)
    return os.path.join(out_dir, "projector_config.pbtxt")


def tsne_perplexity(n: int) -> float:
    """t-SNE's perplexity for n points: scikit-learn's 30 where n allows,
    else (n - 1) / 3 (t-SNE needs perplexity < n; about 3 x perplexity
    neighbours enter each point's affinities), at least 1."""
    return float(max(1.0, min(30.0, (n - 1) / 3.0)))


def tsne_2d(vectors, seed: int = 0) -> np.ndarray:
    """[N, d] vectors -> [N, 2] Barnes-Hut t-SNE coordinates (paper 004 used
    Barnes-Hut-SNE), PCA-initialised, with a fixed random state: the same
    vectors give the same map. Needs N >= 3."""
    from sklearn.manifold import TSNE

    vectors = np.asarray(vectors, np.float64)
    if len(vectors) < 3:
        raise RepresentationError(f"a t-SNE map needs at least 3 points, not {len(vectors)}.")
    tsne = TSNE(n_components=2, perplexity=tsne_perplexity(len(vectors)), method="barnes_hut", init="pca",
                learning_rate="auto", random_state=seed)
    return tsne.fit_transform(vectors).astype(np.float32)
