"""Text processing in TensorFlow ops: clean-up, tokenization, vocabularies.

Everything that turns raw text into ids (and ids back into text) is written
with `tf.strings` / tensorflow-text ops, so that the same code runs in the
tf.data training pipeline and inside an exported SavedModel's graph: a model
can never see text prepared differently at serving time.

Three tokenizers, registered by their --tokenizer name in nmt_tf/data/tokenizers.py
(each a `Tokenizer` subclass here: how it cuts text, joins tokens back, and
learns its vocabularies):

* ``word`` (the paper's setting): Moses-like splitting of punctuation with the
  case kept, then a shortlist of the most frequent words; every other word
  becomes ``[UNK]``.
* ``wordpiece``: the same word splitting, then each word is cut into
  WordPiece sub-words by tensorflow-text's ``FastWordpieceTokenizer``; the
  vocabulary is learned from the training data by keras-hub's
  ``compute_word_piece_vocabulary``.
* ``sentencepiece``: SentencePiece (Kudo & Richardson 2018; unigram or BPE)
  on the cleaned raw text, no pre-tokenization: the model is learned with
  the ``sentencepiece`` package (`learn_sentencepiece`) and applied by
  tensorflow-text's ``SentencepieceTokenizer`` (in TF Serving's op set).
  Its pieces in id order are the vocabulary; detokenization joins them and
  turns "▁" back into spaces.

Vocabulary files hold one token per line; the first four lines are always
the special tokens ``[PAD] [UNK] [BOS] [EOS]`` (ids 0..3). A vocabulary size
(``--src_vocab_size``) counts these four.

The Moses-like rules follow the Moses ``tokenizer.perl`` (non-aggressive
mode, no escaping) closely enough that ``detokenize(tokenize(x)) == x`` for
almost every sentence of the embedded Multi30k corpus (the tests measure the
rate), which matters because BLEU is computed on detokenized output against
raw references.
"""

from __future__ import annotations

import collections
import io
import os
from typing import Sequence

import numpy as np
import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tft  # its ops: WordPiece and SentencePiece, in the graph and in exports

from nmt_tf.core import model_dir as layout
from nmt_tf.core.files import WriteFailed, write_atomically
from nmt_tf.data.tokenizers import tokenizer_class

PAD, UNK, BOS, EOS = "[PAD]", "[UNK]", "[BOS]", "[EOS]"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


# The models' input convention, built here for the training pipeline
# (nmt_tf.data.pipeline), the exported graph (nmt_tf.inference.translation_graph) and the tools alike:
# a source is x_1 .. x_n [EOS], the decoder reads [BOS] y_1 .. y_m (teacher
# forcing) and is trained to predict y_1 .. y_m [EOS].

def _column(ids, value):
    """[rows of `ids`, 1] filled with `value` in `ids`' dtype."""
    return tf.fill(tf.stack([ids.nrows(out_type=tf.int32), 1]), tf.constant(value, ids.dtype))


def with_eos(ids):
    """Ragged [B, (n)] ids -> x_1 .. x_n [EOS] (sources, and labels); string
    tokens get the "[EOS]" token."""
    return tf.concat([ids, _column(ids, EOS if ids.dtype == tf.string else EOS_ID)], axis=1)


def with_bos(ids):
    """Ragged [B, (m)] target ids -> [BOS] y_1 .. y_m, the decoder's inputs."""
    return tf.concat([_column(ids, BOS_ID), ids], axis=1)

# SentencePiece's word-boundary marker (U+2581), which starts a piece that follows a space.
SENTENCEPIECE_SPACE = "\u2581"
# Languages with their own apostrophe and punctuation-spacing rules; any
# other language code gets the generic rules (apostrophes split off).
LANGUAGES_WITH_RULES = ("en", "fr", "de")

# Private-use code point marking a period that must stay attached.
_KEEP_PERIOD = "\ue000"
# Abbreviations whose period stays attached (a tiny subset of Moses'
# nonbreaking-prefix lists, enough for image captions and news).
_NONBREAKING = {
    "en": ("Mr", "Mrs", "Ms", "Dr", "Prof", "St", "Jr", "Sr", "vs", "etc", "No", "Co", "Inc", "Ltd", "Mt"),
    "fr": ("M", "Mme", "Mlle", "MM", "Dr", "St", "Ste", "etc", "cf", "av", "bd"),
    "de": ("Dr", "Prof", "St", "Nr", "bzw", "usw", "z", "B", "ca", "etc", "Str"),
}

# Letters, digits and combining marks (RE2's \w is ASCII only).
_ALNUM = r"\pL\pN\pM"


# What `clean` puts in place of invalid UTF-8; never a vocabulary entry.
REPLACEMENT_CHAR = "\ufffd"


def clean(text: tf.Tensor) -> tf.Tensor:
    """Normalizes raw lines: invalid UTF-8 replaced, whitespace collapsed.

    Args:
      text: string tensor of any shape, raw bytes as read from a file.

    Returns:
      string tensor of the same shape: valid UTF-8 (each invalid byte
      sequence becomes U+FFFD), control characters (Unicode C*) and runs of
      whitespace turned into one space, no leading or trailing space.
      Whitespace is every Unicode separator (Zs: U+00A0, U+3000, ...; Zl
      U+2028; Zp U+2029) besides ASCII's (RE2's backslash-s is ASCII only).
    """
    text = tf.strings.unicode_transcode(
        text, "UTF-8", "UTF-8", errors="replace", replacement_char=ord(REPLACEMENT_CHAR))
    text = tf.strings.regex_replace(text, r"[\pC\pZ\s]+", " ")
    return tf.strings.strip(text)


def has_invalid_utf8(text: tf.Tensor) -> tf.Tensor:
    """Boolean tensor: True where `text` holds bytes that are not valid UTF-8."""
    fixed = tf.strings.unicode_transcode(
        text, "UTF-8", "UTF-8", errors="replace", replacement_char=ord(REPLACEMENT_CHAR))
    return tf.not_equal(fixed, text)


def _apostrophe_rules(lang: str):
    a = r"['’]"
    if lang == "en":
        return [
            (rf"([^\pL]){a}([^\pL])", r"\1 ' \2"),
            (rf"([^\pL\pN]){a}(\pL)", r"\1 ' \2"),
            (rf"(\pL){a}([^\pL])", r"\1 ' \2"),
            (rf"(\pL)({a}\pL)", r"\1 \2"),          # don't -> don 't ; John's -> John 's
            (rf"(\pN)({a}s)", r"\1 \2"),            # 1990's -> 1990 's
        ]
    if lang == "fr":
        return [
            (rf"([^\pL]){a}([^\pL])", r"\1 ' \2"),
            (rf"([^\pL]){a}(\pL)", r"\1 ' \2"),
            (rf"(\pL){a}([^\pL])", r"\1 ' \2"),
            (rf"(\pL{a})(\pL)", r"\1 \2"),          # l'homme -> l' homme
        ]
    return [(rf"{a}", r" \0 ")]


def _word_rules(lang: str):
    """Ordered (pattern, rewrite) pairs of the Moses-like word splitter."""
    prefixes = "|".join(_NONBREAKING.get(lang, ()))
    rules = [
        # Pad every character that is neither alphanumeric, space, period,
        # apostrophe, comma nor hyphen (Moses: [^\p{IsAlnum}\s\.\'\`\,\-]).
        (rf"([^{_ALNUM}\s.'’,\-])", r" \1 "),
        # Runs of dots ("...") are one token.
        (r"(\.\.+)", r" \1 "),
        # Commas, unless between two digits (1,000).
        (r",([^\pN]|$)", r" , \1"),
        (r"(^|[^\pN]),", r"\1 , "),
    ]
    if prefixes:
        rules.append((rf"(^|\s)({prefixes})\.(\s|$)", rf"\1\2{_KEEP_PERIOD}\3"))
    rules += [
        # A period ending a token splits off, unless the token is a single
        # character ("J.") or ends an abbreviation with inner periods ("U.S.").
        (r"([^\s.][^\s.])\.(\s|$)", r"\1 .\2"),
        (r"([^\s.][^\s.])\.(\s|$)", r"\1 .\2"),
        (r"^([^\s.])\.$", r"\1 ."),
    ]
    rules += _apostrophe_rules(lang)
    rules += [(_KEEP_PERIOD, ".")]
    return rules


def split_words(text: tf.Tensor, lang: str = "en") -> tf.RaggedTensor:
    """Splits cleaned sentences into Moses-like word tokens, case kept.

    Args:
      text: [batch] string tensor (already passed through `clean`).
      lang: ISO 639-1 code choosing the apostrophe and abbreviation rules.

    Returns:
      [batch, (words)] ragged string tensor.
    """
    for pattern, rewrite in _word_rules(lang):
        text = tf.strings.regex_replace(text, pattern, rewrite)
    return tf.strings.split(tf.strings.strip(text))


def words_of_lines(lines, lang: str = "en") -> list[list[str]]:
    """Raw lines (a list of str or UTF-8 bytes) -> their words as Python
    strings, cleaned and split exactly as the word tokenizer does (for the
    tools that count or align words outside a tf.data pipeline)."""
    if not lines:
        return []
    words = split_words(clean(tf.constant(list(lines))), lang).to_list()
    return [[w.decode("utf-8") for w in row] for row in words]


def _detok_rules(lang: str):
    # Punctuation that attaches to the previous word.
    if lang == "fr":
        # French typography keeps a space before ! ? ; : and before » ; the
        # corpus writes these with a space, so only these attach.
        close = r"[.,)\]}%…]"
    else:
        close = r"[.,!?;:)\]}%…]"
    rules = [
        (rf" ({close})", r"\1"),
        (r" (\.\.+)", r"\1"),
        (r"([(\[{¿¡]) ", r"\1"),
        # Straight double quotes: pair them up left to right.
        (r'" ([^"]*?) "', r'"\1"'),
    ]
    # Typographic quotes: German opens with „ and closes with “, English
    # (and the generic rules) open with “ and close with ”.
    if lang == "de":
        rules += [(r"„ ", r"„"), (r" “", r"“")]
    else:
        rules += [(r"“ ", r"“"), (r" ”", r"”")]
    a = r"['’]"
    if lang == "en":
        rules += [(rf" ({a}(?:s|S|t|T|m|M|d|D|ll|LL|re|RE|ve|VE)\b)", r"\1"),
                  (rf"(\pN) ({a}s)", r"\1\2"),
                  (rf"([sS]) ({a}) ", r"\1\2 ")]          # ladies ' room -> ladies' room
    elif lang == "fr":
        rules += [(rf"(\pL{a}) ", r"\1")]
    else:
        rules += [(rf" ({a}) ", r"\1")]
    return rules


def join_words(words: tf.RaggedTensor, lang: str = "en") -> tf.Tensor:
    """Inverse of `split_words`: joins word tokens into a sentence.

    Args:
      words: [batch, (words)] ragged string tensor.
      lang: the language code given to `split_words`.

    Returns:
      [batch] string tensor.
    """
    text = tf.strings.reduce_join(words, axis=-1, separator=" ")
    for pattern, rewrite in _detok_rules(lang):
        text = tf.strings.regex_replace(text, pattern, rewrite)
    return text


# --------------------------------------------------------------------------
# Vocabularies


def read_vocabulary(path: str) -> list[str]:
    """Reads a vocabulary file written by `write_vocabulary`."""
    with tf.io.gfile.GFile(path, "r") as f:
        tokens = [line.rstrip("\n") for line in f]
    if tuple(tokens[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
        raise ValueError(
            f"{path} is not an nmt_tf vocabulary: its first lines must be "
            f"{' '.join(SPECIAL_TOKENS)}.")
    return tokens


def write_vocabulary(tokens: Sequence[str], path: str) -> None:
    """Writes tokens one per line, atomically (temporary file, then rename);
    WriteFailed (naming `path`) when it cannot."""
    for token in tokens:
        if not token or any(c.isspace() for c in token):
            raise ValueError(f"vocabulary token {token!r} is empty or contains whitespace")
    tmp = path + ".tmp"
    try:        # tf.io.gfile, so that model directories may be on gs:// or hdfs://
        with tf.io.gfile.GFile(tmp, "w") as f:
            f.write("".join(t + "\n" for t in tokens))
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except tf.errors.OpError as e:      # a full disk: the previous vocabulary (if any) is unchanged
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise WriteFailed(path, e) from e


def shortlist(counts: collections.Counter, size: int) -> list[str]:
    """The paper's shortlist: specials plus the `size - 4` most frequent words.

    Ties are broken by the token's bytes so that the result is deterministic.
    Words holding U+FFFD (invalid bytes of the corpus, see `clean`) are not
    words of the language and never enter it: they stay [UNK].
    """
    n_words = size - len(SPECIAL_TOKENS)
    if n_words < 1:
        raise ValueError(f"a vocabulary size of {size} leaves no room for words "
                         f"besides the {len(SPECIAL_TOKENS)} special tokens")
    ranked = sorted(((t, c) for t, c in counts.items() if t not in SPECIAL_TOKENS and REPLACEMENT_CHAR not in t),
                    key=lambda tc: (-tc[1], tc[0]))
    return list(SPECIAL_TOKENS) + [t for t, _ in ranked[:n_words]]


def wordpiece_vocabulary(word_batches: tf.data.Dataset, size: int) -> list[str]:
    """Learns a WordPiece vocabulary of at most `size` entries.

    Args:
      word_batches: dataset of [batch, (words)] ragged string tensors, the
        words exactly as `split_words` produced them, so that the sub-word
        vocabulary matches the run-time pre-tokenization.
      size: vocabulary size, the special tokens included.

    Uses keras-hub's `compute_word_piece_vocabulary` (the tensorflow-text
    learner), with lower-casing, accent stripping and splitting off.
    """
    import keras_hub  # heavy import, only needed when learning a vocabulary

    vocab = keras_hub.tokenizers.compute_word_piece_vocabulary(
        word_batches, vocabulary_size=size, lowercase=False, strip_accents=False,
        split=False, reserved_tokens=list(SPECIAL_TOKENS))
    return [t for t in vocab if t.strip() and not any(c.isspace() for c in t) and REPLACEMENT_CHAR not in t]


def learn_sentencepiece(sentences, size: int, model_type: str = "unigram", character_coverage: float = 1.0,
                       sample_size: int = 1_000_000, seed: int = 0) -> bytes:
    """Learns a SentencePiece model of at most `size` pieces; returns the serialized model.

    Args:
      sentences: iterable of cleaned sentences (str), streamed to the trainer,
        which keeps a random sample of `sample_size` of them (all if fewer).
        U+FFFD (invalid bytes) is left out, so that it gets no piece and
        stays [UNK].
      size: vocabulary size, the special tokens included. The specials get
        the ids of `SPECIAL_TOKENS` ([PAD] 0, [UNK] 1, [BOS] 2, [EOS] 3), so
        the model's ids are the model's vocabulary ids. A corpus too small for
        `size` pieces gives fewer (not an error).
      model_type: "unigram" (Kudo 2018) or "bpe" (Sennrich et al. 2016).
      character_coverage: share of the characters covered by the alphabet
        (1.0 for alphabetic languages; 0.9995 is usual for CJK).
      seed: seeds the trainer's sampling of sentences.
    """
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=(s.replace(REPLACEMENT_CHAR, " ") for s in sentences), model_writer=model,
        model_type=model_type, vocab_size=size,
        character_coverage=character_coverage, input_sentence_size=sample_size,
        shuffle_input_sentence=True, hard_vocab_limit=False,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        pad_piece=PAD, unk_piece=UNK, bos_piece=BOS, eos_piece=EOS,
        num_threads=os.cpu_count() or 1, minloglevel=2)
    return model.getvalue()


def sentencepiece_vocabulary(model: bytes) -> list[str]:
    """The pieces of a serialized SentencePiece model, in id order."""
    processor = spm.SentencePieceProcessor(model_proto=model)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


# --------------------------------------------------------------------------
# The tokenizer used by the pipeline and the exported graph


class Tokenizer(tf.Module):
    """Raw text <-> ids for one language, entirely in TF ops: the base of the
    tokenizers of nmt_tf/data/tokenizers.py, which say how text is cut into tokens
    (`tokenize`), how tokens are joined back (`detokenize`) and how the
    vocabularies are learned (`learn_vocabularies`).

    Args:
      vocabulary: list of tokens (specials first) or the path of a
        vocabulary file.
      lang: language code for the Moses-like rules ("en", "fr", "de", ...).
      model_file: the tokenizer's model file, for those that have one
        (SentencePiece: `vocabulary` is then its pieces in id order). An
        export keeps the file as an asset.

    Shapes:
      tokenize:   [batch] string -> [batch, (tokens)] string (ragged)
      encode:     [batch] string -> [batch, (tokens)] int32 (ragged)
      decode:     [batch, len] int32 (ids after EOS are ignored) -> [batch] string
    """

    kind = ""              # its --tokenizer name
    word_level = False     # every token is a whole word (no sub-words)
    model_files = None     # model_dir.SENTENCEPIECE_MODELS-like names of its (source, target) model files

    def __init__(self, vocabulary, lang: str = "en", name=None, model_file: str | None = None):
        super().__init__(name=name)
        if (self.model_files is not None) != (model_file is not None):
            raise ValueError(f"the {self.kind} tokenizer takes {'a' if self.model_files else 'no'} model file")
        self.lang = lang
        if isinstance(vocabulary, (str, os.PathLike)):
            # Tables initialized from the file: a SavedModel stores it as an asset.
            path = os.fspath(vocabulary)
            self.vocabulary = read_vocabulary(path)
            to_id = tf.lookup.TextFileInitializer(
                path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
            to_token = tf.lookup.TextFileInitializer(
                path, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
                tf.string, tf.lookup.TextFileIndex.WHOLE_LINE)
        else:
            self.vocabulary = list(vocabulary)
            tokens = tf.constant(self.vocabulary)
            ids = tf.range(len(self.vocabulary), dtype=tf.int64)
            to_id = tf.lookup.KeyValueTensorInitializer(tokens, ids)
            to_token = tf.lookup.KeyValueTensorInitializer(ids, tokens)
        self.vocab_size = len(self.vocabulary)
        self._token_to_id = tf.lookup.StaticHashTable(to_id, default_value=UNK_ID)
        self._id_to_token = tf.lookup.StaticHashTable(to_token, default_value=UNK)

    # What a tokenizer defines.

    def tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        """[batch] raw string -> [batch, (tokens)] string tokens."""
        raise NotImplementedError

    def detokenize(self, tokens: tf.RaggedTensor) -> tf.Tensor:
        """[batch, (tokens)] string tokens -> [batch] text."""
        raise NotImplementedError

    def continues_word(self, token: str) -> bool:
        """Whether `token` continues the word before it (a sub-word piece that
        is not the start of a word); never for word-level tokenizers."""
        return False

    def sampler(self, alpha: float, nbest_size: int):
        """A `tokenize` that samples one of the text's segmentations instead of
        the best one, for subword regularisation in training
        (--sentencepiece_alpha); only SentencePiece has one."""
        raise ValueError(f"the {self.kind} tokenizer cannot sample segmentations (--sentencepiece_alpha "
                         "needs --tokenizer=sentencepiece)")

    @classmethod
    def learn_vocabularies(cls, config, corpus, model_dir: str, log=print) -> tuple[list[str], list[str]]:
        """The (source, target) vocabularies of the used training pairs, specials
        first (`corpus`: nmt_tf.data.pipeline.VocabularyCorpus). A tokenizer with model
        files writes them into `model_dir` here."""
        raise NotImplementedError

    # What they share.

    def words(self, text: tf.Tensor) -> tf.RaggedTensor:
        """[batch] raw string -> [batch, (words)] Moses-like words."""
        return split_words(clean(text), self.lang)

    def word_continuation(self) -> np.ndarray | None:
        """[V] bool: the vocabulary's tokens that continue the word before them
        (`continues_word`; the special tokens never), or None for word-level
        tokenizers (every token is a word)."""
        if self.word_level:
            return None
        table = [self.continues_word(token) for token in self.vocabulary]
        table[:len(SPECIAL_TOKENS)] = [False] * len(SPECIAL_TOKENS)
        return np.array(table, bool)

    def lookup(self, tokens: tf.RaggedTensor) -> tf.RaggedTensor:
        """String tokens -> int32 ids ([UNK] for tokens outside the vocabulary)."""
        return tf.cast(tf.ragged.map_flat_values(self._token_to_id.lookup, tokens), tf.int32)

    def encode(self, text: tf.Tensor) -> tf.RaggedTensor:
        """[batch] raw string -> [batch, (tokens)] int32 ids, no BOS / EOS."""
        return self.lookup(self.tokenize(text))

    def id_to_token(self, ids: tf.Tensor) -> tf.Tensor:
        """int ids of any shape -> string tokens of the same shape."""
        return self._id_to_token.lookup(tf.cast(ids, tf.int64))

    def decode(self, ids: tf.Tensor, tokens: tf.Tensor | None = None) -> tf.Tensor:
        """[batch, len] ids -> [batch] text; stops at the first EOS, drops PAD/BOS.

        `tokens`: [batch, len] strings to write instead of the ids' own
        (`[UNK]` replacement), kept where the ids are kept."""
        ids = tf.convert_to_tensor(ids)
        ids = tf.cast(ids, tf.int32)
        before_eos = tf.math.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=-1) == 0
        keep = before_eos & (ids != PAD_ID) & (ids != BOS_ID)
        if tokens is None:
            return self.detokenize(tf.ragged.map_flat_values(self.id_to_token, tf.ragged.boolean_mask(ids, keep)))
        return self.detokenize(tf.ragged.boolean_mask(tokens, keep))


def make_tokenizer(vocabulary, kind: str, lang: str = "en", name=None, model_file: str | None = None) -> Tokenizer:
    """The --tokenizer=`kind` tokenizer (nmt_tf/data/tokenizers.py) of a vocabulary;
    ValueError for an unknown kind."""
    return tokenizer_class(kind)(vocabulary, lang, name=name, model_file=model_file)


class WordTokenizer(Tokenizer):
    """The paper's setting: Moses-like words with the case kept, a shortlist of
    the most frequent ones; every other word is [UNK]."""

    kind = "word"
    word_level = True

    def tokenize(self, text):
        return self.words(text)

    def detokenize(self, tokens):
        return join_words(tokens, self.lang)

    @classmethod
    def learn_vocabularies(cls, config, corpus, model_dir, log=print):
        for side, counts, vocab in zip(("source", "target"), corpus.word_counts, corpus.word_shortlists):
            covered = sum(counts[t] for t in vocab[len(SPECIAL_TOKENS):])
            log(f"  {side}: {len(counts):,} word types; the {len(vocab):,}-entry shortlist "
                f"covers {covered / max(1, sum(counts.values())):.2%} of the words")
        return corpus.word_shortlists


class WordpieceTokenizer(Tokenizer):
    """The Moses-like words cut into WordPiece sub-words by tensorflow-text's
    FastWordpieceTokenizer ("##" marks a piece that continues a word)."""

    kind = "wordpiece"

    def __init__(self, vocabulary, lang="en", name=None, model_file=None):
        super().__init__(vocabulary, lang, name=name, model_file=model_file)
        self._wordpiece = tft.FastWordpieceTokenizer(
            vocab=self.vocabulary, suffix_indicator="##", unknown_token=UNK,
            no_pretokenization=True, support_detokenization=True,
            token_out_type=tf.string)

    def tokenize(self, text):
        pieces = self._wordpiece.tokenize(self.words(text))  # [batch, (words), (pieces)]
        return pieces.merge_dims(-2, -1)

    def detokenize(self, tokens):
        text = tf.strings.reduce_join(tokens, axis=-1, separator=" ")
        text = tf.strings.regex_replace(text, r"(^| )##", "")
        return join_words(tf.strings.split(text), self.lang)

    def continues_word(self, token):
        return token.startswith("##")

    @classmethod
    def learn_vocabularies(cls, config, corpus, model_dir, log=print):
        vocabularies = tuple(wordpiece_vocabulary(corpus.words(side), size)
                             for side, size in ((0, config.src_vocab_size), (1, config.tgt_vocab_size)))
        log(f"  WordPiece vocabularies: {len(vocabularies[0]):,} source and {len(vocabularies[1]):,} target entries")
        return vocabularies


class SentencepieceTokenizer(Tokenizer):
    """SentencePiece pieces of the cleaned raw text (no pre-tokenization),
    applied by tensorflow-text's SentencepieceTokenizer; its model file is an
    asset of an export."""

    kind = "sentencepiece"
    model_files = layout.SENTENCEPIECE_MODELS

    def __init__(self, vocabulary, lang="en", name=None, model_file=None):
        super().__init__(vocabulary, lang, name=name, model_file=model_file)
        with tf.io.gfile.GFile(model_file, "rb") as f:
            model = f.read()
        if sentencepiece_vocabulary(model) != self.vocabulary:
            raise ValueError(f"{model_file} does not hold the pieces of the vocabulary "
                             f"{vocabulary if isinstance(vocabulary, str) else '(list)'}")
        self.sentencepiece_model = tf.saved_model.Asset(model_file)
        self._model_file = model_file
        self._sentencepiece = tft.SentencepieceTokenizer(model=model, out_type=tf.string)

    def tokenize(self, text):
        return self._sentencepiece.tokenize(clean(text))

    def sampler(self, alpha, nbest_size):
        """Subword regularisation: a unigram model samples a segmentation with
        probability proportional to P(segmentation)^alpha among the
        `nbest_size` best (-1: all; Kudo 2018); a BPE model drops each merge
        with probability alpha (BPE-dropout, Provilkov et al. 2020). The
        tensorflow-text op takes no seed: the samples differ from run to run.
        Not an attribute, so an export never holds it."""
        with tf.io.gfile.GFile(self._model_file, "rb") as f:
            sampling = tft.SentencepieceTokenizer(model=f.read(), out_type=tf.string, nbest_size=nbest_size,
                                                  alpha=alpha)
        return lambda text: sampling.tokenize(clean(text))

    def detokenize(self, tokens):
        text = tf.strings.reduce_join(tokens, axis=-1)
        return tf.strings.strip(tf.strings.regex_replace(text, SENTENCEPIECE_SPACE, " "))

    def continues_word(self, token):
        return bool(token) and not token.startswith(SENTENCEPIECE_SPACE) and token[0].isalnum()

    @classmethod
    def learn_vocabularies(cls, config, corpus, model_dir, log=print):
        learn = lambda sides, size: learn_sentencepiece(
            corpus.sentences(sides), size, config.sentencepiece_type,
            config.sentencepiece_character_coverage, config.sentencepiece_sample_size, config.seed)
        if config.joint_vocabulary:
            joint = learn((0, 1), config.src_vocab_size)
            models = (joint, joint)
        else:
            models = (learn((0,), config.src_vocab_size), learn((1,), config.tgt_vocab_size))
        for model, path in zip(models, layout.pair(model_dir, cls.model_files)):
            write_atomically(path, model)
        vocabularies = tuple(sentencepiece_vocabulary(m) for m in models)
        log(f"  SentencePiece ({config.sentencepiece_type}{', joint' if config.joint_vocabulary else ''}) "
            f"vocabularies: {len(vocabularies[0]):,} source and {len(vocabularies[1]):,} target pieces")
        return vocabularies
