"""Greedy and beam search in TensorFlow ops, batched over sentences.

Both run a `tf.while_loop` over output positions and work eagerly or inside
a `tf.function` (the exported SavedModel runs them in its graph; only core
TensorFlow ops are used). A model provides

    step_weights() -> dict of tensors (fused / cast matrices), taken once per search
    search_inputs(source_ids, weights) -> dict with "state" [B, d] (the
        decoder state s_0 in whatever form decode_step takes it) and
        per-sentence tensors (one row per sentence), taken once per search
    decode_step(previous_ids [B, K], state [B, K, d], inputs, weights)
        -> (log-probs [B, K, V], state [B, K, d], alpha [B, K, Tx])

for K hypotheses per sentence (K = 1 in greedy search).

Beam search follows the RNNsearch papers (docs/SPEC.md §6; paper 000 §4.2): a
hypothesis that ends with [EOS] leaves the beam and the beam shrinks by one,
until `beam_size` hypotheses have finished (or the length limit is reached,
where every live hypothesis is closed with [EOS]). Live hypotheses compete on
their log-probability; finished ones are ranked by log-probability divided by
a length penalty (the papers divide by the length). This is batched by keeping
`beam_size` slots per sentence, of which `beam_size - finished` may be live.
Every step computes all K slots of every unfinished sentence (a [B, K] grid:
no per-hypothesis gathers, and a sentence's hypotheses share its encoder
outputs; once a sentence of the batch is done, the step runs on the others
only); dead slots score NEG and never win. The first step, with
one hypothesis per sentence, is computed for that one alone. Histories are
back-pointers, followed once at the end. A sentence stops as soon as no live
hypothesis can still enter its n best (an exact bound: see the code), which
changes no result; the batch stops when every sentence has.

Options (`SearchOptions`):
  beam_size         width (paper: 10); 1 gives greedy search's result.
  n_best            hypotheses returned per sentence (<= beam_size).
  length_penalty    "average": log p / length^alpha (alpha=1: the papers);
                    "gnmt": log p / ((5 + length) / 6)^alpha (Wu et al. 2016).
  length_alpha      the alpha above; 0 ranks by raw log-probability.
  max_length_ratio  output length (with [EOS]) <= ratio x source length (with
                    [EOS]); the reference implementation uses 3.
  min_length_ratio  [EOS] forbidden before ratio x source length (reference
                    implementation: 0.5 of the source length).
  max_length        absolute cap on output tokens.
  suppress_unk      never generate [UNK] (the "no UNK" decoding of Table 1).
  shortlist_size    > 0 (and below the target vocabulary): the output layer and
                    softmax of every step cover only the candidate tokens
                    chosen once per batch from the sources by a
                    `nmt_tf.data.lexicon.LexicalShortlist` (Jean et al. 2015): at
                    least this many, more when the batch's translations need
                    the room.
  shortlist_per_word  translations per source token in that choice.

A target prefix (`target_prefix`: [B, P] token ids, 0-padded) forces the
first tokens of every hypothesis of a sentence (as CTranslate2's
`target_prefix`, for interactive translation): at output position t below
the sentence's prefix length only the prefix token may be taken (every
other token, [EOS] included, scores NEG; the [UNK] and length masks do not
apply there), so one hypothesis follows the prefix and the search runs freely
after it. The length limit is raised to the prefix length + 1 where the
prefix is longer than the source allows; a prefix longer than max_length - 1
tokens is cut to that. Scores count the prefix tokens' log-probabilities.
Without a prefix the graph is the one built before prefixes existed.

Required terms (`required_terms`: [B, C, L] token ids) make beam search
lexically constrained (nmt_tf.inference.constraints: dynamic beam allocation): every
returned hypothesis holds each term, or, where none can within the length
limit, the best partial ones come back with terms_met False.

Results are dense, batch-major tensors; lengths count [EOS]; tokens past a
hypothesis' end are [PAD] (0); its alignment rows past the end are zero.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from nmt_tf.config import SearchOptions
from nmt_tf.data.lexicon import SPECIALS, uses_shortlist
from nmt_tf.data.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt_tf.inference.constraints import UNMET_COST, RequiredTerms, TermState, contains_terms, eos_mask

NEG = -1e9   # a finite "minus infinity": no inf - inf = nan anywhere

def length_penalty(lengths, options: SearchOptions):
    """The divisor of a finished hypothesis' log-probability."""
    lengths = tf.cast(lengths, tf.float32)
    if options.length_penalty == "gnmt":
        return tf.pow((5.0 + lengths) / 6.0, options.length_alpha)
    return tf.pow(tf.maximum(lengths, 1.0), options.length_alpha)


def _length_limits(source_ids, options: SearchOptions, prefix_lengths=None):
    """Per-sentence (min, max) output lengths, [EOS] included, and the batch
    maximum; a target prefix of n tokens raises the maximum to n + 1."""
    src_len = tf.cast(tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1), tf.float32)
    max_len = tf.cast(tf.math.ceil(options.max_length_ratio * src_len), tf.int32)
    max_len = tf.clip_by_value(max_len, 1, options.max_length)
    if prefix_lengths is not None:
        max_len = tf.maximum(max_len, prefix_lengths + 1)
    min_len = tf.minimum(tf.cast(tf.floor(options.min_length_ratio * src_len), tf.int32), max_len - 1)
    return min_len, max_len, tf.reduce_max(tf.concat([max_len, [0]], 0))


FORCED = 3   # the row of `_token_penalties` for a position a target prefix fixes


def _token_penalties(vocab_size, options: SearchOptions) -> np.ndarray:
    """The four additive [V] masks a step can need, stacked [4, V] float32
    (constants of the graph): forbidden tokens get NEG.

    [PAD] and [BOS] are never generated, [UNK] optionally. Row 0: any other
    token; row 1 (before min_len): not [EOS] either; row 2 (the last allowed
    position): only [EOS]; row 3 (FORCED, a target prefix's position): no
    mask (the prefix's own mask, `_Prefix.apply`, allows its token alone).
    """
    ids = np.arange(vocab_size)
    forbidden = (ids == PAD_ID) | (ids == BOS_ID)
    if options.suppress_unk:
        forbidden |= ids == UNK_ID
    rows = np.stack([forbidden, forbidden | (ids == EOS_ID), ids != EOS_ID, np.zeros_like(forbidden)])
    return np.where(rows, NEG, 0.0).astype(np.float32)


def _penalty_kind(t, min_len, max_len, prefix_lengths=None):
    """Which row of `_token_penalties` output position t uses, per sentence ([B];
    [steps, B] for a column of positions)."""
    kind = tf.where(t + 1 >= max_len, 2, tf.where(t + 1 <= min_len, 1, 0))
    return kind if prefix_lengths is None else tf.where(t < prefix_lengths, FORCED, kind)


class _Prefix:
    """A batch's target prefixes: ids [B, P] (0-padded; P >= 1) and lengths [B],
    cut to max_length - 1 tokens."""

    def __init__(self, target_prefix, options: SearchOptions):
        ids = tf.cast(target_prefix, tf.int32)[:, :options.max_length - 1]
        self.ids = tf.pad(ids, [[0, 0], [0, tf.maximum(0, 1 - tf.shape(ids)[1])]])
        self.lengths = tf.reduce_sum(tf.cast(self.ids != PAD_ID, tf.int32), axis=1)
        self.longest = tf.reduce_max(tf.concat([self.lengths, [0]], 0))

    def at(self, t):
        """[B] the token forced at output position t, -1 where none is."""
        token = tf.gather(self.ids, tf.minimum(t, tf.shape(self.ids)[1] - 1), axis=1)
        return tf.where(t < self.lengths, token, -1)

    def apply(self, t, log_probs, forced):
        """`log_probs` ([R, V] or [R, K, V]) with every token but `forced` [R]
        (where >= 0) at NEG; untouched (no pass over them) once t is past
        every prefix."""
        def masked():
            allowed = (tf.one_hot(forced, tf.shape(log_probs)[-1], on_value=True, off_value=False)
                       | (forced < 0)[:, None])
            mask = tf.where(allowed, 0.0, NEG)
            return log_probs + tf.cast(mask if log_probs.shape.rank == 2 else mask[:, None, :], log_probs.dtype)
        return tf.cond(t < self.longest, masked, lambda: log_probs)


def _while(cond, body, init, free: int = 0):
    """tf.while_loop with the batch dimension of every loop tensor left free
    (an empty batch may be static 0 on entry but dynamic inside), and every
    dimension of the last `free` loop variables (nested structures)."""
    def relaxed(x):
        if isinstance(x, tf.TensorArray):
            return tf.TensorShape(None)
        return tf.TensorShape([None] + x.shape.as_list()[1:]) if x.shape.rank else x.shape
    fixed, loose = init[:len(init) - free], init[len(init) - free:]
    invariants = (*tf.nest.map_structure(relaxed, fixed),
                  *tf.nest.map_structure(lambda x: tf.TensorShape([None] * x.shape.rank), loose))
    return tf.while_loop(cond, body, init, shape_invariants=invariants)


def _prefix(target_prefix, options: SearchOptions):
    """A `_Prefix`, or None without a target prefix."""
    if target_prefix is None:
        return None
    if options.shortlist_size:
        raise ValueError("a target prefix needs the whole target vocabulary: search with shortlist_size=0")
    return _Prefix(target_prefix, options)


def _required_terms(required_terms, options: SearchOptions, word_continuation=None, term_spans=None):
    """`RequiredTerms`, or None without required terms."""
    if required_terms is None:
        return None
    if options.shortlist_size:
        raise ValueError("required terms need the whole target vocabulary: search with shortlist_size=0")
    return RequiredTerms.from_ids(required_terms, word_continuation, term_spans, options.term_placement)


def _allocated_extensions(log_probs, alive_score, k, penalties, kind, term_state, terms, alpha):
    """The k slots of the next beam under required terms
    (`nmt_tf.inference.constraints.RequiredTerms.extensions`): the token masks, and
    [EOS] masked for hypotheses that miss a term, added to every
    log-probability first."""
    eos = tf.one_hot(EOS_ID, log_probs.shape[2] or tf.shape(log_probs)[2])
    allowed = log_probs + tf.gather(penalties, kind)[:, None, :]
    masked = allowed + eos_mask(terms.unmet(term_state), kind, 2)[:, :, None] * eos
    # The beam's width stays static (a beam of 1 broadcast with the mask's unknown width lost it).
    masked = tf.ensure_shape(masked, log_probs.shape)
    ending = tf.equal(tf.argmax(allowed, axis=2, output_type=tf.int32), EOS_ID)
    return terms.extensions(masked, alive_score, term_state, k,
                            lambda lp, score, width: _best_extensions(lp, score, width), alpha, ending)


def _search_vocabulary(model, source_ids, weights, options: SearchOptions, shortlist):
    """(step weights, V: the width of a step's log-probabilities, or with a
    shortlist its least width, the target id of each position [width] int32
    or None for the whole vocabulary).

    With a shortlist (`options.shortlist_size`), the output layer's weights
    are cut to the batch's candidate tokens once, before the loop; the
    special tokens keep their ids as positions, so the token masks apply
    unchanged. The list is at least shortlist_size long, longer when the
    batch's translations need it (`nmt_tf.data.lexicon.shortlist_ids`), in
    multiples of `_best_extensions`' block width."""
    vocab = model.target_vocab_size
    if not uses_shortlist(options, vocab):
        return weights, vocab, None
    if shortlist is None:
        raise ValueError(f"shortlist_size={options.shortlist_size} needs the model's lexical shortlist "
                         "(python -m nmt_tf.shortlist)")
    ids = shortlist.select(source_ids, options.shortlist_size, options.shortlist_per_word,
                           multiple=_block_size(options.shortlist_size))
    return model.restrict_output(weights, ids), options.shortlist_size, ids


def _widen_penalties(penalties, width):
    """`_token_penalties` [P, V] for log-probabilities `width` wide (a
    shortlist's width, known when the graph runs): the special tokens'
    columns come first and every other column of a row holds the same mask."""
    tail = penalties[:, SPECIALS:SPECIALS + 1]
    return tf.concat([penalties[:, :SPECIALS], tf.repeat(tail, width - SPECIALS, axis=1)], axis=1)


def greedy_search(model, source_ids, options: SearchOptions = SearchOptions(beam_size=1), shortlist=None,
                  target_prefix=None):
    """The most probable next word at every step.

    Args:
      model: see the module docstring.
      source_ids: [B, Tx] int32, right-padded with 0, each ending with [EOS].
      options: only the length limits, suppress_unk and the shortlist matter.
      shortlist: a `nmt_tf.data.lexicon.LexicalShortlist` when
        options.shortlist_size asks for one.
      target_prefix: optional [B, P] int32 target ids (0-padded, no [EOS])
        every output starts with (see the module docstring); not with a
        shortlist.

    Returns:
      dict with tokens [B, T] int32, log_probs [B] (sum over the output),
      scores [B] (log_probs / length penalty), lengths [B] int32 and
      alignments [B, T, Tx] float32.
    """
    source_ids = tf.cast(source_ids, tf.int32)
    batch, src_len = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
    prefix = _prefix(target_prefix, options)
    min_len, max_len, steps = _length_limits(source_ids, options, prefix and prefix.lengths)
    weights, vocab, vocabulary_ids = _search_vocabulary(model, source_ids, model.step_weights(), options, shortlist)
    encoded = model.search_inputs(source_ids, weights)
    per_sentence = {key: v for key, v in encoded.items() if key != "state"}
    penalties = _token_penalties(vocab, options)
    if vocabulary_ids is not None:
        penalties = _widen_penalties(penalties, tf.shape(vocabulary_ids)[0])
    positions = tf.range(steps)
    kinds = _penalty_kind(positions[:, None], min_len, max_len, prefix and prefix.lengths)      # [steps, B]

    def body(t, previous, state, done, log_prob, length, tokens, alignments):
        # Only sentences still being decoded are computed (one hypothesis each).
        rows = tf.cast(tf.where(~done)[:, 0], tf.int32)                              # [R]
        log_probs, new_state, alpha = (x[:, 0] for x in model.decode_step(
            tf.gather(previous, rows)[:, None], tf.gather(state, rows)[:, None],
            {key: tf.gather(v, rows) for key, v in per_sentence.items()}, weights))
        log_probs += tf.gather(penalties, tf.gather(kinds[t], rows))
        if prefix:
            log_probs = prefix.apply(t, log_probs, tf.gather(prefix.at(t), rows))
        at = rows[:, None]
        best = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        if vocabulary_ids is not None:
            best = tf.gather(vocabulary_ids, best)
        token = tf.tensor_scatter_nd_update(tf.fill([batch], PAD_ID), at, best)
        log_prob = tf.tensor_scatter_nd_add(log_prob, at, tf.reduce_max(log_probs, axis=-1))
        length = tf.tensor_scatter_nd_add(length, at, tf.ones_like(rows))
        state = tf.tensor_scatter_nd_update(state, at, tf.cast(new_state, state.dtype))
        alpha = tf.tensor_scatter_nd_update(tf.zeros_like(alignments[:, 0]), at, alpha)
        at_t = tf.equal(positions, t)[None, :]
        tokens = tf.where(at_t, token[:, None], tokens)
        alignments = tf.where(at_t[:, :, None], alpha[:, None, :], alignments)
        done = done | (token == EOS_ID) | (t + 1 >= max_len)
        return t + 1, token, state, done, log_prob, length, tokens, alignments

    init = (tf.constant(0), tf.fill([batch], BOS_ID), encoded["state"], tf.zeros([batch], tf.bool),
            tf.zeros([batch], tf.float32), tf.zeros([batch], tf.int32),
            tf.zeros([batch, steps], tf.int32), tf.zeros([batch, steps, src_len], tf.float32))
    t, _, _, _, log_prob, length, tokens, alignments = _while(
        lambda t, previous, state, done, *_: (t < steps) & ~tf.reduce_all(done), body, init)
    return {"tokens": tokens[:, :t], "log_probs": log_prob, "lengths": length,
            "scores": log_prob / length_penalty(length, options), "alignments": alignments[:, :t]}


def _block_size(vocab_size: int) -> int:
    """Block width for `_best_extensions`: a divisor of the vocabulary size near
    its square root (so that neither the blocks nor their number is large), or
    that square root (the logits are then padded) when V has no such divisor."""
    root = max(1, round(vocab_size ** 0.5))
    divisors = [d for d in range(max(1, root // 4), 4 * root + 1) if vocab_size % d == 0]
    return min(divisors, key=lambda d: abs(d - root)) if divisors else root


def _best_extensions(log_probs, alive_score, k, penalties=None, kind=None, least_vocab=None):
    """The k best one-token extensions of a sentence's hypotheses.

    Args:
      log_probs: [B, K, V] float32 log p(y | hypothesis).
      alive_score: [B, K] log-probability of each hypothesis (NEG: dead slot).
      k: how many to return (<= K x V).
      penalties: optional [P, V] float32 NumPy table of additive token masks
        (`_token_penalties`: 0, or NEG for a forbidden token), of which
        sentence b takes row kind[b] ([B] int).
      least_vocab: when V is known only when the graph runs (a shortlist),
        the least it can be, which sets the block width; `penalties` is then
        that wide, and its last column is the mask of every token past it.

    Returns:
      (score [B, k] = alive_score[parent] + (log_probs + penalty)[parent, token],
       best first; token [B, k] int32; parent [B, k] int32).

    Exact, and cheaper than a top-k over all K x V candidates: the candidates
    are cut into blocks of `_block_size(V)` (or `_block_size(least_vocab)`)
    tokens of one hypothesis; a block's
    best is its maximum log-probability plus the hypothesis' score. A block
    holding one of the k best candidates has a best no lower than that
    candidate, and fewer than k candidates (so fewer than k blocks) beat it, so
    it is among the k blocks with the highest bests. The top-k then runs over
    those k blocks only. (Exact ties may be ordered differently.)

    The penalties are never added to all of log_probs (a pass over [B, K, V]
    per step): the forbidden tokens are a few special ids, so only the blocks
    holding them ("head" blocks) see the mask token by token, every other
    block's mask is one value per kind (0, or NEG in the last step's
    only-[EOS] row), added to its maximum, and the k kept blocks get their
    mask when gathered. Rounding is monotonic, so a block's maximum plus its
    constant equals the maximum of the block plus that constant: the same
    numbers as adding the mask first.
    """
    beam = log_probs.shape[1]
    # The whole vocabulary's width is static (no shape ops in the loop); a
    # shortlist's is known when the graph runs, at least least_vocab.
    vocab = log_probs.shape[2] if least_vocab is None else tf.shape(log_probs)[2]
    width = _block_size(least_vocab or vocab)
    least_blocks = -(-(least_vocab or vocab) // width)
    blocks_per_row = -(-vocab // width)
    padding = blocks_per_row * width - vocab
    if least_vocab is not None or padding:      # padding ranks below every real candidate
        log_probs = tf.pad(log_probs, [[0, 0], [0, 0], [0, padding]], constant_values=2 * NEG)
    blocks = tf.reshape(log_probs, [-1, beam * blocks_per_row, width])
    block_max = tf.reduce_max(tf.reshape(log_probs, [-1, beam, blocks_per_row, width]), -1)    # [B, K, nb]
    if penalties is not None:
        least_padding = least_blocks * width - penalties.shape[1]
        by_block = np.pad(penalties, [[0, 0], [0, least_padding]], mode="edge").reshape(
            len(penalties), least_blocks, width)
        # Past the "head" blocks every token is masked as the last column is
        # (the masks differ only at the special tokens, the first ids, and
        # any column of a wider shortlist is an ordinary token): one value
        # per sentence, added to the blocks' maxima.
        tail = penalties[:, -1]
        mixed = np.flatnonzero((by_block != tail[:, None, None]).any(axis=(0, 2)))
        head = int(mixed[-1]) + 1 if mixed.size else 0                # blocks masked token by token
        parts = []
        if head:
            masked = (log_probs[:, :, :head * width]
                      + tf.gather(by_block[:, :head].reshape(len(penalties), -1), kind)[:, None, :])
            parts.append(tf.reduce_max(tf.reshape(masked, [-1, beam, head, width]), -1))
        if least_vocab is not None or head < blocks_per_row:
            parts.append(block_max[:, :, head:] + tf.gather(tail, kind)[:, None, None])
        block_max = parts[0] if len(parts) == 1 else tf.concat(parts, -1)
    block_best = tf.reshape(block_max + alive_score[:, :, None], [-1, beam * blocks_per_row])
    kept = min(k, beam * least_blocks)
    _, top_blocks = tf.math.top_k(block_best, k=kept)                                    # [B, kept]
    values = tf.gather(blocks, top_blocks, batch_dims=1)
    if penalties is not None:
        # a block's masks: its own for the head blocks, the tail's for the rest
        masks = np.concatenate([by_block[:, :head], np.repeat(tail[:, None, None], width, axis=2)], axis=1)
        where = tf.stack([tf.broadcast_to(kind[:, None], tf.shape(top_blocks)),
                          tf.minimum(top_blocks % blocks_per_row, head)], -1)
        values += tf.gather_nd(masks, where)
    values += tf.gather(alive_score, top_blocks // blocks_per_row, batch_dims=1)[:, :, None]
    score, index = tf.math.top_k(tf.reshape(values, [-1, kept * width]), k=k)           # best first
    block = tf.gather(top_blocks, index // width, batch_dims=1)
    return score, (block % blocks_per_row) * width + index % width, block // blocks_per_row


def _backtrack(tokens, parents, alphas, t_end, slot):
    """Follows back-pointers from finished hypotheses to their starts.

    Args:
      tokens, parents: [T, B, K] int32, the token and parent slot of each
        slot's hypothesis after step t.
      alphas: [T, B, K, Tx] the attention of each slot's step-t query (the
        parent's), before the beam was reordered.
      t_end, slot: [B, N] where each hypothesis ended ([EOS] at step t_end).

    Returns:
      (tokens [B, N, T] int32 with [PAD] after t_end, alignments [B, N, T, Tx]
       with zero rows after t_end).
    """
    steps = tf.shape(tokens)[0]

    def back(carry, inputs):
        current, _, _ = carry
        t, token_t, parent_t, alpha_t = inputs
        here = tf.where(t_end == t, slot, current)                 # the hypothesis' slot after step t
        active = t <= t_end
        parent = tf.gather(parent_t, here, batch_dims=1)
        token = tf.where(active, tf.gather(token_t, here, batch_dims=1), PAD_ID)
        alpha = tf.gather(alpha_t, parent, batch_dims=1) * tf.cast(active, alpha_t.dtype)[:, :, None]
        return parent, token, alpha

    init = (slot, tf.zeros_like(slot), tf.zeros(tf.concat([tf.shape(slot), tf.shape(alphas)[3:]], 0)))
    _, out_tokens, out_alphas = tf.scan(back, (tf.range(steps), tokens, parents, alphas),
                                        initializer=init, reverse=True)
    return tf.transpose(out_tokens, [1, 2, 0]), tf.transpose(out_alphas, [1, 2, 0, 3])


def beam_search(model, source_ids, options: SearchOptions = SearchOptions(), shortlist=None, target_prefix=None,
                required_terms=None, word_continuation=None, term_spans=None):
    """Beam search as in the RNNsearch papers (see the module docstring).

    Args:
      model: see the module docstring.
      source_ids: [B, Tx] int32, right-padded with 0, each ending with [EOS].
      options: `SearchOptions`.
      shortlist: a `nmt_tf.data.lexicon.LexicalShortlist` when
        options.shortlist_size asks for one.
      target_prefix: optional [B, P] int32 target ids (0-padded, no [EOS])
        every hypothesis starts with (see the module docstring); not with a
        shortlist.
      required_terms: optional [B, C, L] int32 target ids (0-padded): C
        terms per sentence that every returned hypothesis must contain
        (lexically constrained search: nmt_tf.inference.constraints); not with a
        shortlist.
      word_continuation: with required_terms, optional [V] bool NumPy: the
        target tokens that continue the word before them (a term followed by
        one is not met).
      term_spans: with required_terms, optional [B, C, Tx] float32: 1 on
        the source tokens each term translates; with options.term_placement
        a term started where the attention is off them costs rank
        (nmt_tf.inference.constraints, "Placement").

    Returns:
      dict, hypotheses best first (N = options.n_best, T = longest output):
        tokens [B, N, T] int32 ([EOS] included, [PAD] after it),
        scores [B, N] float32 (log_probs / length penalty; NEG if a sentence
          has fewer than N finished hypotheses),
        log_probs [B, N], lengths [B, N] int32,
        alignments [B, N, T, Tx] float32,
        with required_terms also terms_met [B, N] bool (False: a partial
          hypothesis, the terms did not fit in the length limit; these rank
          after every complete one); its hypotheses are ranked with their
          placement costs, and scores are the model's own.
    """
    return _BeamSearch(model, source_ids, options, shortlist, target_prefix, required_terms,
                       word_continuation, term_spans).run()


class _BeamSearch:
    """One call of `beam_search`: the batch's constants, set once before the
    loop, and the loop's parts as methods (`run` puts them together).

    The loop carries (t, previous tokens [B, K], state [B, K, d], alive
    scores [B, K], the finished pool: normalised scores [B, K], where each
    ended (t * K + slot) [B, K] and how many finished [B], done [B], the
    histories (TensorArrays of tokens, parents, alignments and scores per
    step), and with required terms the slots' TermState)."""

    def __init__(self, model, source_ids, options: SearchOptions, shortlist, target_prefix, required_terms,
                 word_continuation, term_spans=None):
        self.model, self.options = model, options
        self.k, self.n = options.beam_size, options.n_best
        self.source_ids = tf.cast(source_ids, tf.int32)
        self.batch = tf.shape(self.source_ids)[0]
        self.prefix = _prefix(target_prefix, options)
        self.terms = _required_terms(required_terms, options, word_continuation, term_spans)
        prefix_lengths = self.prefix and self.prefix.lengths
        min_len, self.max_len, self.steps = _length_limits(self.source_ids, options, prefix_lengths)
        self.weights, self.vocab, self.vocabulary_ids = _search_vocabulary(
            model, self.source_ids, model.step_weights(), options, shortlist)
        self.encoded = model.search_inputs(self.source_ids, self.weights)
        self.per_sentence = {key: v for key, v in self.encoded.items() if key != "state"}
        self.penalties = _token_penalties(self.vocab, options)
        self.best_final_penalty = length_penalty(self.max_len, options)   # [B], the largest a sentence can reach
        # Per-step values, computed once: which token mask each sentence uses, the
        # length penalty of a hypothesis finishing at step t, and t * K + slot.
        # (At least one row: step 0 runs before the loop, also for an empty batch.)
        self.table_steps = tf.maximum(self.steps, 1)
        self.kinds = _penalty_kind(tf.range(self.table_steps)[:, None], min_len, self.max_len,
                                   prefix_lengths)                                           # [steps, B]
        self.finish_penalty = length_penalty(tf.range(1, self.table_steps + 1), options)     # [steps]
        self.slots = tf.range(self.k)[None, :]
        self.slot_ids = tf.zeros([self.batch, self.k], tf.int32) + self.slots

    def advance(self, t, top_score, token, parent, new_state, alpha, cost, fin_norm, fin_id, fin_count, done,
                history, term_state=()):
        """Step t's bookkeeping, given the best extensions of the beam."""
        k, terms = self.k, self.terms
        # The beam shrinks by one for every finished hypothesis (docs/SPEC.md §6).
        valid = (self.slots < (k - fin_count)[:, None]) & (top_score > NEG / 2) & ~done[:, None]
        is_eos = token == EOS_ID
        log_prob = top_score
        if terms:
            # (the placement costs in the score are taken back out of the log-probability kept)
            parents = TermState(*(tf.gather(x, parent, batch_dims=1) for x in term_state))
            term_state, _ = terms.transition(parents, token, tf.gather(alpha, parent, batch_dims=1))
            # (the cost as the candidates were ranked with it: it depends on the parent's `ending` too)
            term_state = term_state._replace(cost=parents.cost + cost)
            log_prob = top_score + term_state.cost
        # Histories are kept as back-pointers (read once, at the end).
        history = tuple(h.write(t, x) for h, x in zip(history, (token, parent, alpha, log_prob)))

        # The finished pool: the K best finished so far (by normalised score),
        # each known by where it ended, t * K + slot; with required terms, a
        # hypothesis closed at the length limit without all of them ranks
        # after every complete one.
        finished_now = valid & is_eos
        rank = top_score / self.finish_penalty[t]
        if terms:
            rank -= UNMET_COST * tf.cast(terms.total()[:, None] - terms.met_tokens(term_state), tf.float32)
        pool_norm = tf.concat([fin_norm, tf.where(finished_now, rank, NEG)], 1)
        fin_norm, pick = tf.math.top_k(pool_norm, k=k)                    # at most K valid: none lost
        fin_id = tf.gather(tf.concat([fin_id, t * k + self.slot_ids], 1), pick, batch_dims=1)
        fin_count += tf.reduce_sum(tf.cast(finished_now, tf.int32), axis=1)

        alive = valid & ~is_eos
        alive_score = tf.where(alive, top_score, NEG)
        state = tf.gather(new_state, parent, batch_dims=1)
        # Exact early stop for the n best: log-probabilities only fall and the
        # length penalty only grows, so a live hypothesis with log p = a < 0
        # can at best finish with a / penalty(max_len). Once no live one can
        # beat the n-th best finished hypothesis, the returned list is final.
        hopeless = (fin_count >= self.n) & (tf.reduce_max(alive_score, axis=1) / self.best_final_penalty
                                            <= fin_norm[:, self.n - 1])
        done = done | hopeless | (fin_count >= k) | (t + 1 >= self.max_len) | ~tf.reduce_any(alive, axis=1)
        return t + 1, token, state, alive_score, fin_norm, fin_id, fin_count, done, history, term_state

    def expand(self, t, previous, state, alive_score, inputs, kind, forced, term_state=(), sentence_terms=None):
        """The model's step for every slot, and the k best extensions (`kind`:
        each sentence's row of the token penalties; `forced`: its prefix
        token at t, -1 for none, or None without prefixes; with required
        terms, the slots' TermState and the sentences' RequiredTerms)."""
        log_probs, new_state, alpha = self.model.decode_step(previous, state, inputs, self.weights)
        if self.prefix:
            log_probs = self.prefix.apply(t, log_probs, forced)
        best = lambda: _best_extensions(log_probs, alive_score, self.k, self.penalties, kind,
                                        None if self.vocabulary_ids is None else self.vocab)
        if self.terms:
            allocated = lambda: _allocated_extensions(log_probs, alive_score, self.k, self.penalties, kind,
                                                      term_state, sentence_terms, alpha)
            unplaced = lambda: (*best(), tf.zeros([tf.shape(alive_score)[0], self.k]))
            top_score, token, parent, cost = tf.cond(tf.reduce_any(sentence_terms.lengths > 0), allocated, unplaced)
        else:
            (top_score, token, parent), cost = best(), tf.zeros([tf.shape(alive_score)[0], self.k])
        if self.vocabulary_ids is not None:
            token = tf.gather(self.vocabulary_ids, token)
        return top_score, token, parent, tf.cast(new_state, self.encoded["state"].dtype), alpha, cost

    def expand_unfinished(self, t, previous, state, alive_score, done, term_state):
        """`expand` for the sentences not done yet only, the others filled in
        (dead: NEG scores). Used once a sentence of the batch is done, so that
        long and short sentences batched together do not cost the long one's
        steps for all."""
        rows = tf.cast(tf.where(~done)[:, 0], tf.int32)
        take = lambda x: tf.gather(x, rows)
        out = self.expand(t, take(previous), take(state), take(alive_score),
                          {key: take(v) for key, v in self.per_sentence.items()}, take(self.kinds[t]),
                          self.prefix and take(self.prefix.at(t)), tf.nest.map_structure(take, term_state),
                          self.terms and self.terms.rows(rows))
        fill = lambda x, value: tf.tensor_scatter_nd_update(
            tf.fill(tf.concat([[self.batch], tf.shape(x)[1:]], 0), tf.cast(value, x.dtype)), rows[:, None], x)
        return tuple(fill(x, value) for x, value in zip(out, (NEG, 0, 0, 0, 0, 0)))

    def body(self, t, previous, state, alive_score, fin_norm, fin_id, fin_count, done, history, term_state):
        # All K slots of every unfinished sentence are computed (a [batch, K]
        # grid: no per-hypothesis gathers; the K hypotheses of a sentence share
        # its encoder outputs); dead slots carry NEG and never reach the top K.
        extensions = tf.cond(tf.reduce_any(done),
                             lambda: self.expand_unfinished(t, previous, state, alive_score, done, term_state),
                             lambda: self.expand(t, previous, state, alive_score, self.per_sentence, self.kinds[t],
                                                 self.prefix and self.prefix.at(t), term_state, self.terms))
        return self.advance(t, *extensions, fin_norm, fin_id, fin_count, done, history, term_state)

    def initial(self):
        """The loop's first state: after step 0 where the vocabulary has at
        least K words, before it otherwise."""
        batch, k, terms = self.batch, self.k, self.terms
        history = tuple(tf.TensorArray(dtype, size=self.table_steps, element_shape=shape)
                        for dtype, shape in ((tf.int32, [None, k]), (tf.int32, [None, k]),
                                             (tf.float32, [None, k, None]), (tf.float32, [None, k])))
        pool = (tf.fill([batch, k], NEG), tf.zeros([batch, k], tf.int32), tf.zeros([batch], tf.int32),
                tf.zeros([batch], tf.bool), history)
        if self.vocab >= k:
            # Step 0 has one hypothesis per sentence ([BOS]): computed for it
            # alone, its k best extensions fill the beam.
            first = tf.constant(0)
            top_score, token, parent, new_state, alpha, cost = self.expand(
                first, tf.fill([batch, 1], BOS_ID), self.encoded["state"][:, None], tf.zeros([batch, 1]),
                self.per_sentence, self.kinds[0], self.prefix and self.prefix.at(first),
                terms and terms.initial(1), terms)
            return self.advance(first, top_score, token, parent, new_state, tf.repeat(alpha, k, axis=1), cost,
                                *pool, terms.initial(1) if terms else ())
        # fewer words than slots: step 0 runs in the loop, K - 1 slots dead
        first_live = tf.concat([tf.zeros([batch, 1]), tf.fill([batch, k - 1], NEG)], axis=1)
        return (tf.constant(0), tf.fill([batch, k], BOS_ID), tf.repeat(self.encoded["state"][:, None], k, axis=1),
                first_live, *pool, terms.initial(k) if terms else ())

    def run(self) -> dict:
        """The search: the loop, then the n best read back from the histories."""
        k, n = self.k, self.n
        out = _while(lambda t, *rest: (t < self.steps) & ~tf.reduce_all(rest[6]), self.body, self.initial(),
                     free=1)   # the TermState
        t, fin_norm, fin_id, history = out[0], out[4][:, :n], out[5][:, :n], out[8]
        found = fin_norm > NEG / 2
        t_end = tf.where(found, fin_id // k, -1)                 # -1: nothing (all [PAD], zero alignment)
        slot = fin_id % k

        def read_histories():
            written = tf.range(t)      # the steps taken (the arrays have room for the length limit)
            tokens, parents, alphas, step_scores = (h.gather(written) for h in history)
            out_tokens, alignments = _backtrack(tokens, parents, alphas, t_end, slot)
            log_probs = tf.gather_nd(tf.transpose(step_scores, [1, 0, 2]),
                                     tf.stack([tf.maximum(t_end, 0), slot], -1), batch_dims=1)
            return out_tokens, alignments, log_probs

        def nothing():     # an empty batch stops before the first step
            shape = tf.stack([self.batch, n, 0])
            return (tf.zeros(shape, tf.int32), tf.zeros(tf.concat([shape, tf.shape(self.source_ids)[1:]], 0)),
                    tf.zeros(shape[:2]))

        out_tokens, alignments, log_probs = tf.cond(t > 0, read_histories, nothing)
        result = {
            "tokens": out_tokens,
            "scores": fin_norm,
            "log_probs": tf.where(found, log_probs, NEG),
            "lengths": tf.where(found, t_end + 1, 0),
            "alignments": alignments,
        }
        if self.terms:
            result = _complete_first(result, contains_terms(out_tokens, self.terms) & found, found, self.options)
        return result


def _complete_first(result: dict, met, found, options: SearchOptions) -> dict:
    """Constrained search's results: where a sentence has a hypothesis with
    every required term (`met` [B, N]), its partial ones (closed at the
    length limit) are dropped as unfound; otherwise its partial ones stay,
    best first, with terms_met False. The scores are recomputed: the ranks of
    partial hypotheses carried UNMET_COST."""
    drop = found & ~met & tf.reduce_any(met, axis=1, keepdims=True)
    keep = found & ~drop
    return {"tokens": tf.where(keep[:, :, None], result["tokens"], PAD_ID),
            "scores": tf.where(keep, result["log_probs"] / length_penalty(result["lengths"], options), NEG),
            "log_probs": tf.where(keep, result["log_probs"], NEG),
            "lengths": tf.where(keep, result["lengths"], 0),
            "alignments": result["alignments"] * tf.cast(keep, result["alignments"].dtype)[:, :, None, None],
            "terms_met": met}


def search(model, source_ids, options: SearchOptions = SearchOptions(), shortlist=None, target_prefix=None,
           required_terms=None, word_continuation=None, term_spans=None):
    """Greedy search for beam_size 1, beam search otherwise (always with
    required terms); beam-shaped results.

    Returns the dict of `beam_search` ([B, N, ...] tensors) in both cases.
    """
    if options.beam_size > 1 or required_terms is not None:
        return beam_search(model, source_ids, options, shortlist, target_prefix, required_terms, word_continuation,
                           term_spans)
    out = greedy_search(model, source_ids, options, shortlist, target_prefix)
    return {key: v[:, None] for key, v in out.items()}
