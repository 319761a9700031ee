"""Greedy and beam search in TensorFlow ops, batched over sentences.

Both run a `tf.while_loop` over output positions and work eagerly or inside
a `tf.function` (the exported SavedModel runs them in its graph; only core
TensorFlow ops are used). A model provides

    encode(source_ids) -> dict with "state" [B, n] and per-sentence tensors
    step_weights() -> dict of tensors (fused / cast matrices), taken once per search
    decode_step(previous_ids [N], state [N, n], encoded, weights) -> (log-probs [N, V], state, alpha [N, Tx])

Beam search follows the RNNsearch papers (SPEC §6; paper 000 §4.2): a
hypothesis that ends with [EOS] leaves the beam and the beam shrinks by one,
until `beam_size` hypotheses have finished (or the length limit is reached,
where every live hypothesis is closed with [EOS]). Live hypotheses compete on
their log-probability; finished ones are ranked by log-probability divided by
a length penalty (the papers divide by the length). This is batched by keeping
`beam_size` slots per sentence, of which `beam_size - finished` may be live;
each step computes only the live ones. A sentence also stops as soon as no
live hypothesis can still enter its n best (an exact bound: see the code),
which changes no result.

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

Results are dense, batch-major tensors; lengths count [EOS]; tokens past a
hypothesis' end are [PAD] (0); its alignment rows past the end are zero.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from nmt_tf.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID

NEG = -1e9   # a finite "minus infinity": no inf - inf = nan anywhere


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    beam_size: int = 10
    n_best: int = 1
    length_penalty: str = "average"
    length_alpha: float = 1.0
    max_length_ratio: float = 3.0
    min_length_ratio: float = 0.5
    max_length: int = 256
    suppress_unk: bool = False

    def __post_init__(self):
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError(f"n_best must be between 1 and beam_size ({self.beam_size}), got {self.n_best}")
        if self.length_penalty not in ("average", "gnmt"):
            raise ValueError(f"length_penalty must be 'average' or 'gnmt', got {self.length_penalty!r}")
        if self.length_alpha < 0:   # the early stop of beam_search relies on a non-decreasing penalty
            raise ValueError(f"length_alpha must be >= 0, got {self.length_alpha}")
        if self.max_length_ratio <= 0 or self.max_length < 1:
            raise ValueError("max_length_ratio and max_length must be positive")


def length_penalty(lengths, options: SearchOptions):
    """The divisor of a finished hypothesis' log-probability."""
    lengths = tf.cast(lengths, tf.float32)
    if options.length_penalty == "gnmt":
        return tf.pow((5.0 + lengths) / 6.0, options.length_alpha)
    return tf.pow(tf.maximum(lengths, 1.0), options.length_alpha)


def _length_limits(source_ids, options: SearchOptions):
    """Per-sentence (min, max) output lengths, [EOS] included, and the batch maximum."""
    src_len = tf.cast(tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1), tf.float32)
    max_len = tf.cast(tf.math.ceil(options.max_length_ratio * src_len), tf.int32)
    max_len = tf.clip_by_value(max_len, 1, options.max_length)
    min_len = tf.minimum(tf.cast(tf.floor(options.min_length_ratio * src_len), tf.int32), max_len - 1)
    return min_len, max_len, tf.reduce_max(tf.concat([max_len, [0]], 0))


def _token_penalties(vocab_size, options: SearchOptions):
    """The three additive [V] masks a step can need, stacked [3, V] (built once
    per search): forbidden tokens get NEG.

    [PAD] and [BOS] are never generated, [UNK] optionally. Row 0: any other
    token; row 1 (before min_len): not [EOS] either; row 2 (the last allowed
    position): only [EOS].
    """
    ids = tf.range(vocab_size)
    forbidden = (ids == PAD_ID) | (ids == BOS_ID)
    if options.suppress_unk:
        forbidden |= ids == UNK_ID
    rows = tf.stack([forbidden, forbidden | (ids == EOS_ID), ids != EOS_ID])
    return tf.where(rows, NEG, 0.0)


def _penalty_kind(t, min_len, max_len):
    """Per sentence [B], which row of `_token_penalties` output position t uses."""
    return tf.where(t + 1 >= max_len, 2, tf.where(t + 1 <= min_len, 1, 0))


def _while(cond, body, init):
    """tf.while_loop with the batch dimension of every loop tensor left free
    (an empty batch may be static 0 on entry but dynamic inside)."""
    relaxed = lambda x: tf.TensorShape([None] + x.shape.as_list()[1:]) if x.shape.rank else x.shape
    return tf.while_loop(cond, body, init, shape_invariants=tf.nest.map_structure(relaxed, init))


def greedy_search(model, source_ids, options: SearchOptions = SearchOptions(beam_size=1)):
    """The most probable next word at every step.

    Args:
      model: see the module docstring.
      source_ids: [B, Tx] int32, right-padded with 0, each ending with [EOS].
      options: only the length limits and suppress_unk matter.

    Returns:
      dict with tokens [B, T] int32, log_probs [B] (sum over the output),
      scores [B] (log_probs / length penalty), lengths [B] int32 and
      alignments [B, T, Tx] float32.
    """
    source_ids = tf.cast(source_ids, tf.int32)
    batch, src_len = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
    min_len, max_len, steps = _length_limits(source_ids, options)
    encoded = model.encode(source_ids)
    per_sentence = {key: v for key, v in encoded.items() if key != "state"}
    weights = model.step_weights()
    penalties = _token_penalties(model.target_vocab_size, options)
    positions = tf.range(steps)

    def body(t, previous, state, done, log_prob, length, tokens, alignments):
        # Only sentences still being decoded are computed.
        rows = tf.cast(tf.where(~done)[:, 0], tf.int32)                              # [R]
        log_probs, new_state, alpha = model.decode_step(
            tf.gather(previous, rows), tf.gather(state, rows),
            {key: tf.gather(v, rows) for key, v in per_sentence.items()}, weights)
        log_probs += tf.gather(penalties, tf.gather(_penalty_kind(t, min_len, max_len), rows))
        at = rows[:, None]
        token = tf.tensor_scatter_nd_update(tf.fill([batch], PAD_ID), at,
                                            tf.argmax(log_probs, axis=-1, output_type=tf.int32))
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


def _gather(x, index):
    """x [B, K, ...] gathered along K by index [B, K'] -> [B, K', ...]."""
    return tf.gather(x, index, batch_dims=1)


def beam_search(model, source_ids, options: SearchOptions = SearchOptions()):
    """Beam search as in the RNNsearch papers (see the module docstring).

    Args:
      model: see the module docstring.
      source_ids: [B, Tx] int32, right-padded with 0, each ending with [EOS].
      options: `SearchOptions`.

    Returns:
      dict, hypotheses best first (N = options.n_best, T = longest output):
        tokens [B, N, T] int32 ([EOS] included, [PAD] after it),
        scores [B, N] float32 (log_probs / length penalty; NEG if a sentence
          has fewer than N finished hypotheses),
        log_probs [B, N], lengths [B, N] int32,
        alignments [B, N, T, Tx] float32.
    """
    k, n = options.beam_size, options.n_best
    source_ids = tf.cast(source_ids, tf.int32)
    batch, src_len = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
    min_len, max_len, steps = _length_limits(source_ids, options)
    vocab_size = model.target_vocab_size
    per_row = min(k, vocab_size)          # a live hypothesis contributes at most K candidates
    encoded = model.encode(source_ids)
    state = tf.repeat(encoded["state"][:, None], k, axis=1)                 # [B, K, n]
    per_sentence = {key: v for key, v in encoded.items() if key != "state"}
    weights = model.step_weights()
    penalties = _token_penalties(vocab_size, options)
    best_final_penalty = length_penalty(max_len, options)        # [B], the largest a sentence can reach
    positions = tf.range(steps)

    def body(t, previous, state, alive_score, alive_tokens, alive_align, fin_norm, fin_logp,
             fin_len, fin_tokens, fin_align, fin_count, done):
        # Only live hypotheses are computed: one row at the first step, and
        # fewer as the beam shrinks and sentences finish. Each row reads its
        # sentence's encoder outputs by index (no tiling of the annotations).
        rows = tf.cast(tf.where((alive_score > NEG / 2) & ~done[:, None]), tf.int32)   # [R, 2]
        sentence = rows[:, 0]
        log_probs, new_state, alpha = model.decode_step(
            tf.gather_nd(previous, rows), tf.gather_nd(state, rows),
            {key: tf.gather(v, sentence) for key, v in per_sentence.items()}, weights)
        scores = (tf.gather_nd(alive_score, rows)[:, None] + log_probs
                  + tf.gather(penalties, tf.gather(_penalty_kind(t, min_len, max_len), sentence)))
        row_score, row_token = tf.math.top_k(scores, k=per_row)                         # [R, per_row]
        candidates = tf.tensor_scatter_nd_update(tf.fill([batch, k, per_row], NEG), rows, row_score)
        tokens_of = tf.tensor_scatter_nd_update(tf.zeros([batch, k, per_row], tf.int32), rows, row_token)
        top_score, top_index = tf.math.top_k(tf.reshape(candidates, [batch, k * per_row]), k=k)  # best first
        parent = top_index // per_row
        token = tf.gather(tf.reshape(tokens_of, [batch, k * per_row]), top_index, batch_dims=1)
        # The beam shrinks by one for every finished hypothesis (SPEC §6).
        rank = tf.range(k)[None, :]
        valid = (rank < (k - fin_count)[:, None]) & (top_score > NEG / 2) & ~done[:, None]
        is_eos = token == EOS_ID

        at_t = tf.equal(positions, t)
        tokens = tf.where(at_t[None, None, :], token[:, :, None], _gather(alive_tokens, parent))
        alpha = _gather(tf.tensor_scatter_nd_update(tf.zeros_like(alive_align[:, :, 0]), rows, alpha), parent)
        align = tf.where(at_t[None, None, :, None], alpha[:, :, None, :], _gather(alive_align, parent))

        finished_now = valid & is_eos
        length = tf.fill([batch, k], t + 1)
        pool_norm = tf.concat([fin_norm, tf.where(finished_now, top_score / length_penalty(t + 1, options), NEG)], 1)
        fin_norm, pick = tf.math.top_k(pool_norm, k=k)                    # at most K valid: none lost
        fin_logp = _gather(tf.concat([fin_logp, top_score], 1), pick)
        fin_len = _gather(tf.concat([fin_len, length], 1), pick)
        fin_tokens = _gather(tf.concat([fin_tokens, tokens], 1), pick)
        fin_align = _gather(tf.concat([fin_align, align], 1), pick)
        fin_count += tf.reduce_sum(tf.cast(finished_now, tf.int32), axis=1)

        alive = valid & ~is_eos
        alive_score = tf.where(alive, top_score, NEG)
        state = _gather(tf.tensor_scatter_nd_update(tf.zeros_like(state), rows,
                                                    tf.cast(new_state, state.dtype)), parent)
        # Exact early stop for the n best: log-probabilities only fall and the
        # length penalty only grows, so a live hypothesis with log p = a < 0
        # can at best finish with a / penalty(max_len). Once no live one can
        # beat the n-th best finished hypothesis, the returned list is final.
        hopeless = (fin_count >= n) & (tf.reduce_max(alive_score, axis=1) / best_final_penalty
                                       <= fin_norm[:, n - 1])
        done = done | hopeless | (fin_count >= k) | (t + 1 >= max_len) | ~tf.reduce_any(alive, axis=1)
        return (t + 1, token, state, alive_score, tokens, align, fin_norm, fin_logp,
                fin_len, fin_tokens, fin_align, fin_count, done)

    first_live = tf.concat([tf.zeros([batch, 1]), tf.fill([batch, k - 1], NEG)], axis=1)
    zeros_tokens = tf.zeros([batch, k, steps], tf.int32)
    zeros_align = tf.zeros([batch, k, steps, src_len], tf.float32)
    init = (tf.constant(0), tf.fill([batch, k], BOS_ID), state, first_live, zeros_tokens, zeros_align,
            tf.fill([batch, k], NEG), tf.fill([batch, k], NEG), tf.zeros([batch, k], tf.int32),
            zeros_tokens, zeros_align, tf.zeros([batch], tf.int32), tf.zeros([batch], tf.bool))
    out = _while(lambda t, *rest: (t < steps) & ~tf.reduce_all(rest[-1]), body, init)
    t, fin_norm, fin_logp, fin_len, fin_tokens, fin_align = out[0], *out[6:11]
    found = fin_norm[:, :n] > NEG / 2
    return {
        "tokens": tf.where(found[:, :, None], fin_tokens[:, :n, :t], PAD_ID),
        "scores": fin_norm[:, :n],
        "log_probs": tf.where(found, fin_logp[:, :n], NEG),
        "lengths": tf.where(found, fin_len[:, :n], 0),
        "alignments": fin_align[:, :n, :t] * tf.cast(found, tf.float32)[:, :, None, None],
    }


def search(model, source_ids, options: SearchOptions = SearchOptions()):
    """Greedy search for beam_size 1, beam search otherwise; beam-shaped results.

    Returns the dict of `beam_search` ([B, N, ...] tensors) in both cases.
    """
    if options.beam_size > 1:
        return beam_search(model, source_ids, options)
    out = greedy_search(model, source_ids, options)
    return {key: v[:, None] for key, v in out.items()}
