"""The translation graph: the functions nmt_tf.export saves as signatures.

`TranslationGraph` wraps a model and its tokenizers into the serving
functions (raw text in; detokenized text, scores, tokens and alignments
out; the steered `translate_constrained`; `score`), so nmt_tf.evaluate,
nmt_tf.visualize and the training callbacks translate with the same graph
code that TF Serving runs. `UnkReplacement` is the in-graph [UNK]
replacement from attention. The model it wraps comes from
nmt_tf.inference.restore; lines are fed through it by nmt_tf.inference.line_batches.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re

MAX_REQUIRED_TERMS = 16      # per sentence: each term adds a bank to its beam (nmt_tf.inference.constraints)
# A required term may name the source term it translates: "source|||target" (nmt_tf.inference.constraints).
TERM_SOURCE_SEPARATOR = "|||"
MAX_LENGTH_ALPHA = 10.0      # the largest length_alpha a translate_with_options request may ask for
# The signature whose requests choose their search, and its settings' dtypes (scalar inputs with defaults).
WITH_OPTIONS_SIGNATURE = "translate_with_options"
SEARCH_SETTINGS = {"beam_size": "int32", "n_best": "int32", "length_alpha": "float32"}


def beam_bound_text(max_beam_size: int) -> str:
    """The one message for a beam over an export's widest, wherever it is
    checked: the graph, nmt_tf.serve, the LiteRT server and nmt_tf.translate."""
    return (f"beam_size must be at most {max_beam_size}, the widest beam of this export (nmt_tf.export "
            "--max_beam_size)")


def failed_check_text(message: str) -> str:
    """A graph's failed check as its own words ("beam_size must be at most
    10, ...") instead of TensorFlow's wrapping of them (the function's node
    name, the condition and the values); another message as it is."""
    found = re.search(r"assertion failed: \[(.*?)\]", message, re.S)
    return found.group(1).replace("\\'", "'") if found else message


class UnkReplacement:
    """[UNK] replacement from attention (Luong et al. 2015; Jean et al. 2015),
    in TF ops: each generated [UNK] becomes the source token it attended to
    most (the largest alpha_ij over the source words, [EOS] excluded), or
    that token's translation when `dictionary` has one.

    Args:
      dictionary: optional path of a "source<TAB>target" file, one entry per
        line and per source word (checked: a malformed or repeated entry is a
        ValueError naming its line); an export keeps it as an asset.

    Meant for word models, where [UNK] stands for a rare word (names,
    numbers) that often passes unchanged; with sub-word models [UNK] is rare.
    """

    @classmethod
    def of(cls, decoding):
        """The replacement a `nmt_tf.config.DecodingConfig` asks for
        (--replace_unk, --unk_dictionary), or None."""
        return cls(decoding.unk_dictionary) if decoding.replace_unk else None

    def __init__(self, dictionary: str | None = None):
        import tensorflow as tf

        self.dictionary = dictionary
        self.table = None
        if dictionary:
            check_dictionary(dictionary)
            self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
                dictionary, tf.string, 0, tf.string, 1, delimiter="\t"), default_value="")

    def __call__(self, ids, alignments, source_tokens):
        """ids [B, N, T] int, alignments [B, N, T, S] float, source_tokens [B, S]
        string ("" padding, "[EOS]" last) -> [B, N, T] string tokens with the
        replacements (other positions: ""; the caller keeps the ids' own there)."""
        import tensorflow as tf

        from nmt_tf.data.text import EOS

        shape = tf.shape(ids)
        words = (source_tokens != "") & (source_tokens != EOS)                                   # [B, S]
        scores = tf.where(words[:, None, None, :], alignments, -1.0)
        position = tf.reshape(tf.argmax(scores, axis=-1, output_type=tf.int32), [shape[0], -1])
        copied = tf.reshape(tf.gather(source_tokens, position, batch_dims=1), shape)
        if self.table is not None:
            translated = self.table.lookup(copied)
            copied = tf.where(translated != "", translated, copied)
        # A source of no words (all padding) has nothing to copy.
        return tf.where(tf.reduce_any(words, axis=1)[:, None, None], copied, "")


def read_dictionary(path: str, flag: str = "unk_dictionary") -> dict[str, str]:
    """The entries of a "source<TAB>target" dictionary file (UTF-8, one entry
    per line, ended by a line feed; no source word twice, no empty field, no
    carriage return or other line break inside an entry), as {source:
    target}; a file that breaks a rule is one ValueError naming it, its line
    and `--flag`. The one reader of --unk_dictionary and --glossary files, so
    that what is checked is what is read."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory, not a file (--{flag})")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist (--{flag})")
    entries, seen = {}, {}
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
            except UnicodeDecodeError:
                raise ValueError(f"{path} line {number}: not UTF-8 (--{flag})") from None
            if len(line.splitlines()) > 1 or line.endswith(("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85",
                                                              "\u2028", "\u2029")):
                raise ValueError(f"{path} line {number}: a line break other than a line feed inside the entry "
                                 f"{line[:80]!r} (--{flag})")
            fields = line.split("\t")
            if len(fields) != 2 or not all(fields):
                raise ValueError(f"{path} line {number}: expected 'source<TAB>target', got {line[:80]!r} (--{flag})")
            if fields[0] in seen:
                raise ValueError(f"{path} line {number}: {fields[0]!r} has an entry already (line {seen[fields[0]]}) "
                                 f"(--{flag})")
            seen[fields[0]] = number
            entries[fields[0]] = fields[1]
    return entries


def check_dictionary(path: str, flag: str = "unk_dictionary") -> int:
    """Checks a dictionary file as read_dictionary reads it; returns its number of entries."""
    return len(read_dictionary(path, flag))


class TranslationGraph:
    """Builds the serving functions around a model and its tokenizers.

    `module()` returns the tf.Module that is saved: it holds the model's
    weights (as plain tf.Variables), the tokenizers' tables (vocabularies as
    assets) and the two tf.functions.
    """

    def __init__(self, model, source_tokenizer, target_tokenizer, options, max_input_length: int,
                 unk_replacement: UnkReplacement | None = None, shortlist=None, confidence=None,
                 max_beam_size: int | None = None):
        import tensorflow as tf

        self.tf = tf
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.options = options
        self.max_input_length = max_input_length
        self.unk_replacement = unk_replacement
        self.shortlist = shortlist          # nmt_tf.data.lexicon.LexicalShortlist, for options.shortlist_size
        self.confidence = confidence        # nmt_tf.inference.confidence.GraphConfidence: a confidence output
        # The widest beam a translate_with_options request may ask for (a search is built for each width).
        self.max_beam_size = max(max_beam_size or options.beam_size, options.beam_size)
        self._search_functions = None       # `_searches`

    def _ids(self, tokenizer, text, add_bos=False):
        """Raw text -> (ids [B, L] with [EOS] (and [BOS]), display tokens, truncated, empty)."""
        from nmt_tf.data.text import with_bos, with_eos

        tf = self.tf
        tokens = tokenizer.tokenize(text)
        lengths = tokens.row_lengths()
        tokens = tokens[:, :self.max_input_length]
        ids = tokenizer.lookup(tokens)
        shifted = with_bos(ids) if add_bos else None
        display = with_eos(tokens).to_tensor("")
        return with_eos(ids), shifted, display, lengths > self.max_input_length, tf.equal(lengths, 0)

    def _dense(self, ragged):
        """Ragged ids -> [B, L] padded with 0, L >= 1 (an empty batch still has one column)."""
        from nmt_tf.data.text import PAD_ID

        dense = ragged.to_tensor(PAD_ID)
        return self.tf.pad(dense, [[0, 0], [0, self.tf.maximum(0, 1 - self.tf.shape(dense)[1])]])

    def translate(self, text):
        """The export's search settings: its width's `_searches` function with
        the export's n_best and length_alpha, the n-best outputs given their
        static width again."""
        tf = self.tf
        n = self.options.n_best
        out = self._searches()[self.options.beam_size](text, tf.constant(n, tf.int32),
                                                       tf.constant(self.options.length_alpha, tf.float32))
        return {key: tf.ensure_shape(value, [None, n]) if key.startswith("nbest_") else value
                for key, value in out.items()}

    def translate_constrained(self, text, target_prefix, required_terms):
        """`translate` steered, per sentence i:
        - target_prefix[i] ("": none; trailing whitespace dropped): every
          hypothesis starts with the prefix's tokens (forced), the search is
          free after them (nmt_tf.inference.search), and the translation starts with
          the prefix byte for byte; a prefix of more than max_input_length
          tokens is cut there, and `truncated` is true;
        - required_terms[i]: target terms separated by tabs ("": none), at
          most MAX_REQUIRED_TERMS; every returned hypothesis contains each
          (lexically constrained beam search, nmt_tf.inference.constraints), unless
          they do not fit in the length limit: then the best partial
          hypothesis, with terms_met False. A term written
          "source|||target" names the source words it translates: the
          search prefers to write it while attending to them
          (SearchOptions.term_placement), not after the sentence.
        Adds the outputs terms_met [batch] and nbest_terms_met [batch, N].
        An empty source gives an empty translation, prefix or not. Searches
        the whole target vocabulary (no shortlist)."""
        tf = self.tf
        for name, value in (("target_prefix", target_prefix), ("required_terms", required_terms)):
            tf.debugging.assert_equal(tf.size(text), tf.size(value),
                                      message=f"text and {name} must have the same number of sentences")
        return self._translate(text, target_prefix, required_terms)

    def translate_with_options(self, text, beam_size, n_best, length_alpha):
        """`translate` with the search settings of the request: beam_size in
        [1, max_beam_size], n_best in [1, beam_size] (0: the export's n-best,
        or beam_size if that is less) and length_alpha in [0,
        MAX_LENGTH_ALPHA] (scalars; the signature's defaults are the
        export's beam and alpha, and n_best 0). A setting out of its range is
        an InvalidArgumentError naming it and its bound. One search is built
        per beam width, and the request's runs (`tf.switch_case`)."""
        tf = self.tf
        limit = self.max_beam_size
        checks = [
            tf.debugging.assert_greater_equal(beam_size, 1, message="beam_size must be at least 1"),
            tf.debugging.assert_less_equal(beam_size, limit, message=beam_bound_text(limit)),
            tf.debugging.assert_greater_equal(n_best, 0, message=(
                "n_best must be at least 1 (or 0: the n-best of the export, at most beam_size)")),
            tf.debugging.assert_less_equal(n_best, beam_size, message="n_best must be at most beam_size"),
            tf.debugging.assert_greater_equal(length_alpha, 0.0, message="length_alpha must be at least 0"),
            tf.debugging.assert_less_equal(length_alpha, MAX_LENGTH_ALPHA, message=(
                f"length_alpha must be at most {MAX_LENGTH_ALPHA:g}")),
        ]
        with tf.control_dependencies(checks):
            index = tf.identity(beam_size) - 1
            n_best = tf.where(n_best > 0, n_best, tf.minimum(self.options.n_best, beam_size))
        searches = self._searches()
        return tf.switch_case(index, [functools.partial(searches[k], text, n_best, length_alpha)
                                      for k in range(1, limit + 1)])

    def _searches(self) -> dict:
        """{k: tf.function(text, n_best, length_alpha)}, `_translate` at beam
        width k with a request's n_best and length_alpha (scalar tensors),
        for k = 1 .. max_beam_size; made once. translate_with_options
        switches between them and `translate` calls the export's width, so
        that width is traced (and stored) once, not twice."""
        if self._search_functions is None:
            tf = self.tf
            spec = [tf.TensorSpec([None], tf.string), tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32)]
            self._search_functions = {
                k: tf.function(functools.partial(self._translate_at, k), autograph=False, input_signature=spec)
                for k in range(1, self.max_beam_size + 1)}
        return self._search_functions

    def _translate_at(self, beam_size: int, text, n_best, length_alpha):
        return self._translate(text, options=_RequestOptions(self.options, beam_size, n_best, length_alpha))

    def _required_terms(self, required_terms, source):
        """Tab-separated terms, each "target" or "source|||target" -> (ids
        [B, C, L] 0-padded, their tokens [B, C, L] "" padded, spellable [B],
        spans [B, C, Tx] float32: 1 on the tokens of `source` [B, Tx] (ids)
        where the term's source term occurs as whole tokens, 0 where it has
        none or it is not there), C <= MAX_REQUIRED_TERMS. A term the model
        cannot write is left out of the search, and its sentence's
        `spellable` is False (issue 95: three foreign terms came back as one
        repeated [UNK], terms_met true): one that holds a control character
        (tokenization would drop it), and one with an [UNK] token, unless
        the tokenizer is word-level, where an unknown word is written as the
        term's own text (as [UNK] replacement writes it) and only a second
        such term of the same sentence is refused (one [UNK] would meet both)."""
        from nmt_tf.data.text import UNK_ID

        tf = self.tf
        given = tf.strings.split(required_terms, "\t")
        # "source|||target": the target term, and the source term it translates ("" without one).
        halves = tf.strings.split(given.flat_values, TERM_SOURCE_SEPARATOR, maxsplit=1).to_tensor("", shape=[None, 2])
        sourced = tf.strings.regex_full_match(given.flat_values, f"(?s).*{re.escape(TERM_SOURCE_SEPARATOR)}.*")
        targets = tf.strings.strip(tf.where(sourced, halves[:, 1], given.flat_values))
        named = tf.strings.strip(tf.where(sourced, halves[:, 0], ""))
        wanted = given.with_flat_values(targets != "")
        terms = tf.ragged.boolean_mask(given.with_flat_values(targets), wanted)
        term_sources = tf.ragged.boolean_mask(given.with_flat_values(named), wanted)
        tf.debugging.assert_less_equal(
            tf.reduce_max(tf.concat([terms.row_lengths(), [0]], 0)), tf.constant(MAX_REQUIRED_TERMS, tf.int64),
            message=f"more than {MAX_REQUIRED_TERMS} required terms for one sentence")
        tokens = self.target_tokenizer.tokenize(terms.flat_values)[:, :self.max_input_length]
        ids = self._target_ids(tokens)
        has_unk = tf.reduce_any(ids == UNK_ID, axis=1)                                              # [terms]
        if getattr(self.target_tokenizer, "word_level", False):
            # the sentence's second and later terms with an unknown word
            dense = terms.with_flat_values(has_unk).to_tensor(False)                                # [B, C]
            later = dense & (tf.math.cumsum(tf.cast(dense, tf.int32), axis=1) > 1)
            has_unk = tf.boolean_mask(later, tf.sequence_mask(terms.row_lengths(), tf.shape(dense)[1]))
        unspellable = has_unk | tf.strings.regex_full_match(terms.flat_values, r"(?s).*\pC.*")
        keep = tokens.with_flat_values(tf.repeat(~unspellable, tokens.row_lengths()))
        ids, tokens = tf.ragged.boolean_mask(ids, keep), tf.ragged.boolean_mask(tokens, keep)
        spellable = ~tf.reduce_any(terms.with_flat_values(unspellable), axis=1)
        at_least_one = lambda x: tf.pad(x, [[0, 0], [0, tf.maximum(0, 1 - tf.shape(x)[1])],
                                            [0, tf.maximum(0, 1 - tf.shape(x)[2])]])      # no terms: one empty
        ids = at_least_one(terms.with_flat_values(ids).to_tensor(0))
        return (ids, at_least_one(terms.with_flat_values(tokens).to_tensor("")), spellable,
                self._term_spans(term_sources, source, tf.shape(ids)[1]))

    def _term_spans(self, term_sources, source, width):
        """[B, C, Tx] float32: 1 where each term's source term (ragged [B, C]
        strings, "" none; tokenized as the source, so whole words match
        whole words) occurs in `source` [B, Tx], C padded to `width`; none
        for a source term with a word outside the source vocabulary."""
        from nmt_tf.data.text import UNK_ID
        from nmt_tf.inference.constraints import term_starts

        tf = self.tf
        ids = term_sources.with_flat_values(
            self.source_tokenizer.lookup(self.source_tokenizer.tokenize(term_sources.flat_values)))
        ids = tf.cast(ids.to_tensor(0), tf.int32)                                                     # [B, C', Ls]
        ids = tf.pad(ids, [[0, 0], [0, width - tf.shape(ids)[1]], [0, tf.maximum(0, 1 - tf.shape(ids)[2])]])
        lengths = tf.reduce_sum(tf.cast(ids != 0, tf.int32), axis=2)                                  # [B, C]
        lengths = tf.where(tf.reduce_any(ids == UNK_ID, axis=2), 0, lengths)     # [UNK] would match any unknown word
        source = tf.cast(source, tf.int32)
        starts = tf.transpose(term_starts(source[:, None], ids, lengths)[:, 0], [0, 2, 1])           # [B, C, Tx]
        # position x is covered where a match starts in (x - length, x]
        covered = tf.cumsum(tf.cast(starts, tf.int32), axis=2)
        back = tf.range(tf.shape(source)[1])[None, None, :] - lengths[:, :, None]                      # [B, C, Tx]
        earlier = tf.where(back >= 0, tf.gather(covered, tf.maximum(back, 0), batch_dims=2), 0)
        return tf.cast(covered - earlier > 0, tf.float32)

    def _target_ids(self, tokens):
        """Ragged target tokens -> ids, a special token's text in them read as a
        word like any other ([UNK]), not as padding or an end."""
        from nmt_tf.data.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID

        tf = self.tf
        return tf.ragged.map_flat_values(lambda x: tf.where((x == PAD_ID) | (x == BOS_ID) | (x == EOS_ID), UNK_ID, x),
                                         self.target_tokenizer.lookup(tokens))

    def _prefix(self, target_prefix):
        """Target prefixes -> (ids [B, P] 0-padded, their tokens [B, P] "" padded,
        the prefixes themselves without trailing whitespace [B], whether each
        was cut to max_input_length tokens [B])."""
        given = self.tf.strings.regex_replace(target_prefix, r"\s+$", "")
        whole = self.target_tokenizer.tokenize(given)
        cut = whole.row_lengths() > self.max_input_length
        tokens = whole[:, :self.max_input_length]
        return self._dense(self._target_ids(tokens)), tokens.to_tensor(""), given, cut

    def _translate(self, text, target_prefix=None, required_terms=None, options=None):
        from nmt_tf.data.text import PAD_ID, UNK_ID
        from nmt_tf.inference.search import search

        tf = self.tf
        source, _, source_tokens, truncated, empty = self._ids(self.source_tokenizer, text)
        source = self._dense(source)
        options, shortlist, prefix_ids, term_ids = options or self.options, self.shortlist, None, None
        if target_prefix is not None:
            options, shortlist = dataclasses.replace(options, shortlist_size=0), None
            prefix_ids, prefix_tokens, given, prefix_cut = self._prefix(target_prefix)
            truncated = truncated | prefix_cut         # issue 95: a cut prefix said truncated=false
            term_ids, term_tokens, spellable, term_spans = self._required_terms(required_terms, source)
        out = search(self.model, source, options, shortlist, prefix_ids, term_ids,
                     None if term_ids is None else self.target_tokenizer.word_continuation(),
                     None if term_ids is None else term_spans)
        batch, n = tf.shape(out["tokens"])[0], tf.shape(out["tokens"])[1]
        flat = tf.reshape(out["tokens"], [batch * n, -1])
        replaced = None
        if self.unk_replacement is not None or target_prefix is not None:
            tokens = self.target_tokenizer.id_to_token(out["tokens"])
            if self.unk_replacement is not None:
                replacements = self.unk_replacement(out["tokens"], out["alignments"], source_tokens)
                tokens = tf.where((out["tokens"] == UNK_ID) & (replacements != ""), replacements, tokens)
            if target_prefix is not None:
                # The prefix and the required terms show their own tokens (a word outside the vocabulary too).
                tokens = _overlay_terms(tf, _overlay(tf, tokens, prefix_tokens), out["tokens"], term_ids,
                                        term_tokens)
            replaced = tf.reshape(tokens, tf.shape(flat))
        texts = tf.reshape(self.target_tokenizer.decode(flat, replaced), [batch, n])
        if target_prefix is not None:
            shown = self.target_tokenizer.detokenize(tf.RaggedTensor.from_tensor(prefix_tokens, padding=""))
            # A prefix cut to max_input_length tokens is what was forced: the user's text past the cut is not there.
            texts = _splice_prefix(tf, texts, shown, tf.where(prefix_cut, shown, given))
        keep = ~empty
        texts = tf.where(keep[:, None], texts, "")
        scores = tf.where(keep[:, None], out["scores"], 0.0)
        best = out["tokens"][:, 0]
        target_tokens = tf.where((best != PAD_ID) & keep[:, None],
                                 self.target_tokenizer.id_to_token(best), "")
        alignment = out["alignments"][:, 0] * tf.cast(keep, tf.float32)[:, None, None]
        log_prob = tf.where(keep, out["log_probs"][:, 0], 0.0)
        confidence = {} if self.confidence is None else {
            "confidence": self.confidence(log_prob, best, source_tokens, alignment, scores, PAD_ID)}
        return {
            "translation": texts[:, 0], "score": scores[:, 0],
            "log_prob": log_prob, **confidence,
            "source_tokens": source_tokens, "target_tokens": target_tokens,
            "alignment": alignment, "truncated": truncated,
            "nbest_translations": texts, "nbest_scores": scores,
            **({} if "terms_met" not in out else {"terms_met": (out["terms_met"][:, 0] & spellable) | empty,
                                                  "nbest_terms_met": (out["terms_met"] & spellable[:, None])
                                                  | empty[:, None],
                                                  "terms_spellable": spellable}),
        }

    def score(self, source, target):
        from nmt_tf.data.text import PAD_ID

        tf = self.tf
        source_ids, _, _, src_truncated, _ = self._ids(self.source_tokenizer, source)
        labels, target_in, _, tgt_truncated, _ = self._ids(self.target_tokenizer, target, add_bos=True)
        x = {"source_ids": self._dense(source_ids), "target_ids": self._dense(target_in)}
        labels = self._dense(labels)
        token_log_probs = self.model.target_log_probs(x, labels)
        length = tf.reduce_sum(tf.cast(labels != PAD_ID, tf.int32), axis=1)
        log_prob = tf.reduce_sum(token_log_probs, axis=1)
        return {"log_prob": log_prob,
                "log_prob_per_token": log_prob / tf.cast(tf.maximum(length, 1), tf.float32),
                "target_length": length, "token_log_probs": token_log_probs,
                "truncated": src_truncated | tgt_truncated}

    def module(self):
        tf = self.tf
        module = tf.Module()
        # Keras 3 wraps every tf.Variable, and tf.saved_model.save gives the
        # wrapper a *copy* of it ("Variable_N") as the target of the restore
        # op, while the signatures read the wrapped variable. TF2 loading
        # copes; the session loader of tensorflow_model_server (and
        # `saved_model_cli run`) restores the copies and the signatures fail
        # on uninitialized variables (keras-team/keras#20095). Tracking the
        # tf.Variables themselves, not the Keras model, makes the restored
        # variables the ones the graph reads.
        module.model_variables = tf_variables(self.model)
        if self.shortlist is not None:
            module.lexical_shortlist = self.shortlist.module      # its tables become variables of the export
        module.source_tokenizer = self.source_tokenizer
        module.target_tokenizer = self.target_tokenizer
        if self.unk_replacement is not None and self.unk_replacement.table is not None:
            module.unk_dictionary = self.unk_replacement.table      # the dictionary file becomes an asset
        if self.confidence is not None:
            module.confidence_tokens = self.confidence.table         # the calibrator's frequent source tokens
        functions = self.functions()
        module.translate = functions["translate"]
        module.translate_with_options = functions["translate_with_options"]
        if self.shortlist is None:      # forced tokens need the whole output layer, which a shortlist's export drops
            module.translate_constrained = functions["translate_constrained"]
        module.score = functions["score"]
        return module

    def functions(self) -> dict:
        """translate, translate_constrained and score as tf.functions over
        [batch] string vectors, named as the signatures' inputs. Autograph is
        off: the search is written in tf.cond and tf.while_loop, so converting
        its source changed nothing and cost ~40 % of an export's time."""
        tf = self.tf
        strings = lambda *names: [tf.TensorSpec([None], tf.string, name=name) for name in names]
        # Tensors as defaults: tf.saved_model.save writes those (only) as the signature's defaults.
        defaults = (tf.constant(self.options.beam_size, tf.int32), tf.constant(0, tf.int32),
                    tf.constant(self.options.length_alpha, tf.float32))
        with_options = lambda text, beam_size=defaults[0], n_best=defaults[1], length_alpha=defaults[2]: \
            self.translate_with_options(text, beam_size, n_best, length_alpha)
        return {"translate": tf.function(self.translate, autograph=False, input_signature=strings("text")),
                "translate_with_options": tf.function(with_options, autograph=False, input_signature=[
                    *strings("text"), tf.TensorSpec([], tf.int32, name="beam_size"),
                    tf.TensorSpec([], tf.int32, name="n_best"), tf.TensorSpec([], tf.float32, name="length_alpha")]),
                "translate_constrained": tf.function(self.translate_constrained, autograph=False,
                                                     input_signature=strings("text", "target_prefix",
                                                                             "required_terms")),
                "score": tf.function(self.score, autograph=False, input_signature=strings("source", "target"))}


class _RequestOptions:
    """An export's SearchOptions with a request's beam width (a Python int:
    one search is built per width) and its n_best and length_alpha (scalar
    tensors, read where the search reads them)."""

    def __init__(self, options, beam_size: int, n_best, length_alpha):
        for field in dataclasses.fields(options):
            setattr(self, field.name, getattr(options, field.name))
        self.beam_size, self.n_best, self.length_alpha = beam_size, n_best, length_alpha


def _overlay(tf, tokens, prefix_tokens):
    """tokens [B, N, T] string with each row's first positions replaced by
    prefix_tokens [B, P] where those are not ""."""
    width = tf.shape(tokens)[2]
    prefix = tf.pad(prefix_tokens, [[0, 0], [0, tf.maximum(0, width - tf.shape(prefix_tokens)[1])]])[:, :width]
    return tf.where(prefix[:, None, :] != "", prefix[:, None, :], tokens)


def _overlay_terms(tf, tokens, ids, term_ids, term_tokens):
    """tokens [B, N, T] string with every run of output ids (ids [B, N, T])
    that spells a required term (term_ids [B, C, L], 0-padded) written with
    the term's own tokens (term_tokens [B, C, L]): a term word outside the
    vocabulary, generated as [UNK], shows as the user wrote it."""
    from nmt_tf.inference.constraints import term_starts

    steps, width = tf.shape(ids)[2], tf.shape(term_ids)[2]
    lengths = tf.reduce_sum(tf.cast(term_ids != 0, tf.int32), axis=2)                                # [B, C]
    starts = term_starts(ids, term_ids, lengths)                                                      # [B, N, T, C]
    offset = tf.range(width)
    start = tf.range(steps)[:, None] - offset[None, :]                                                # [T, L]
    covered = (tf.gather(starts, tf.maximum(start, 0), axis=2)                                        # [B, N, T, L, C]
               & (start >= 0)[None, None, :, :, None]
               & (offset[None, None, None, :, None] < lengths[:, None, None, None, :]))
    shape = tf.shape(covered)
    flat = tf.reshape(covered, tf.concat([shape[:3], [-1]], 0))
    strings = tf.broadcast_to(tf.transpose(term_tokens, [0, 2, 1])[:, None, None], shape)
    chosen = tf.gather(tf.reshape(strings, tf.shape(flat)), tf.argmax(tf.cast(flat, tf.int32), axis=3,
                                                                       output_type=tf.int32), batch_dims=3)
    return tf.where(tf.reduce_any(flat, axis=3), chosen, tokens)


def _splice_prefix(tf, texts, shown, given):
    """texts [B, N] that start with shown[b] (the prefix as the detokenizer
    writes it) start with given[b] (the prefix as the user wrote it) instead;
    others are left as they are."""
    # (Clipped to each text's length: substr fails past the end, e.g. on a sentence's missing n-th hypothesis.)
    length = tf.minimum(tf.broadcast_to(tf.strings.length(shown)[:, None], tf.shape(texts)), tf.strings.length(texts))
    starts = tf.strings.substr(texts, tf.zeros_like(length), length) == shown[:, None]
    rest = tf.strings.substr(texts, length, tf.fill(tf.shape(texts), -1))
    return tf.where(starts, given[:, None] + rest, texts)


def tf_variables(model) -> list:
    """The tf.Variables under a Keras 3 model's variables (TensorFlow backend),
    of every member of an ensemble."""
    import tensorflow as tf

    if hasattr(model, "members"):
        return [v for member in model.members for v in tf_variables(member)]
    out = [v.value for v in model.variables]
    wrong = [v.path for v, value in zip(model.variables, out) if not isinstance(value, tf.Variable)]
    if wrong:
        raise TypeError(f"not backed by a tf.Variable (is KERAS_BACKEND tensorflow?): {wrong[:3]}")
    return out


def compiled_translate(translator: TranslationGraph):
    """`translator.translate` as a tf.function over a [batch] string vector."""
    return translator.functions()["translate"]
