"""Lexically constrained beam search: required target terms, in TensorFlow ops.

Dynamic beam allocation (Post & Vilar 2018, "Fast Lexically Constrained
Decoding with Dynamic Beam Allocation for Neural Machine Translation"),
batched over sentences the way `nmt_tf.inference.search.beam_search` batches its
beam, so that the exported graph runs it in stock TF Serving:

- Each sentence has C required terms, each a sequence of target tokens
  (`RequiredTerms`: ids [B, C, L], 0-padded; a term of length 0 is absent).
- Each hypothesis carries which terms it has met and, while it is inside
  one, which term and how many of its tokens (`TermState`). A term counts
  once its tokens have been generated one after the other; a token that
  breaks a started term drops that progress (and may start another term).
- At every step the candidates are the beam's k best extensions, every
  hypothesis' best next token, and for every hypothesis each token that
  would advance it on a term (the next token of the term it is inside, or
  the first token of each term it has not met). Each candidate falls in
  the bank of its number of term tokens met, 0..T (T: the sentence's
  total); the k slots are shared out evenly over the T + 1 banks (the
  remainder one each to the fullest banks that have candidates, so that a
  beam narrower than T + 1 still advances on the terms), each bank filled
  with its best candidates, and the slots of banks short of candidates go to
  the best of the rest.
- A hypothesis ends ([EOS]) only once it has met every term, except at the
  length limit, where every live hypothesis is closed: a sentence whose
  terms do not fit returns its best partial hypotheses, ranked after every
  complete one, and says so (`contains_terms`).

- Placement (issue 93): a term may come with the source tokens it
  translates (`spans` [B, C, Tx]). Its first token is then offered only
  where the hypothesis' attention is on them (PLACEMENT_GATE), or where
  the hypothesis would end (the fallback: a term is appended rather than
  lost); starting it with little attention on them, appending it, and
  letting the attention leave them without it all cost rank
  (`RequiredTerms.transition`). Without this, an unlikely term goes where
  the model minds it least, mostly after the sentence ("... avec une
  balle. poudreuse."). The costs are part of a hypothesis' rank only: its
  log-probability stays the model's (`TermState.cost` carries them, to
  take them back out).

Without terms (C = 0, or every term empty) the search is the unconstrained
one: `beam_search` then takes its usual k best extensions.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from nmt_tf.data.text import PAD_ID

NEG = -1e9          # as nmt_tf.inference.search.NEG (search imports this module)
UNMET_COST = 1e4    # subtracted from a finished hypothesis' rank per term token it misses
# Placement (issue 93; chosen on val, pipelines/multi30k_en_fr/terminology.py): a term's first token is
# offered where the attention on its source tokens is at least PLACEMENT_GATE and the most; a start with less than
# PLACEMENT_MASS on them costs rank; a hypothesis whose attention had PLACEMENT_MASS on them and left without
# the term is charged as missing it; appending costs APPEND_FACTOR times the most a start can cost.
PLACEMENT_GATE = 0.2
PLACEMENT_MASS = 0.5
APPEND_FACTOR = 3.0
PLACEMENT_FLOOR = 1e-4   # the least attention a cost counts: at most placement x log(0.5 / 1e-4) = 8.5 x placement


class TermState(NamedTuple):
    """Per hypothesis ([B, K] leading dimensions): met [.., C] bool (a term
    of length 0 counts as met), term [..] int32 (the term it is inside, -1:
    none), position [..] int32 (its tokens generated so far), closing [..]
    int32 (the term its last token completed, -1: none; a word-continuing
    token next undoes it), cost [..] float32 (the placement costs of the
    terms it started or missed, already subtracted from its score),
    attended [.., C] bool (its attention has been on the term's source
    tokens, at least PLACEMENT_MASS, at some step), missed [.., C] bool
    (its attention left them with the term not written)."""
    met: tf.Tensor
    term: tf.Tensor
    position: tf.Tensor
    closing: tf.Tensor
    cost: tf.Tensor
    attended: tf.Tensor
    missed: tf.Tensor


class RequiredTerms(NamedTuple):
    """A batch's required terms: tokens [B, C, L] int32 (0-padded), lengths
    [B, C]; continuation: None, or [V] bool, the target tokens that continue
    the word before them (sub-word pieces without a word-start mark): a term
    followed by one is not met, as "chien" is not in "chiens"; spans: None,
    or [B, C, Tx] float32, 1 on the source tokens each term translates (all
    0: a term placed anywhere); placement: the weight of the placement cost
    (0: none)."""
    tokens: tf.Tensor
    lengths: tf.Tensor
    continuation: tf.Tensor | None = None
    spans: tf.Tensor | None = None
    placement: float = 0.0

    @classmethod
    def from_ids(cls, ids, continuation=None, spans=None, placement: float = 0.0) -> "RequiredTerms":
        """From ids [B, C, L] (0-padded; C and L may be 0: padded to 1, an empty term) and spans [B, C, Tx]
        (C as the ids')."""
        ids = tf.cast(ids, tf.int32)
        pad_terms = tf.maximum(0, 1 - tf.shape(ids)[1])
        ids = tf.pad(ids, [[0, 0], [0, pad_terms], [0, tf.maximum(0, 1 - tf.shape(ids)[2])]])
        if spans is not None:
            spans = tf.pad(tf.cast(spans, tf.float32), [[0, 0], [0, pad_terms], [0, 0]])
        return cls(ids, tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=2),
                   None if continuation is None else tf.constant(continuation, tf.bool),
                   spans if placement else None, float(placement))

    def rows(self, rows) -> "RequiredTerms":
        return RequiredTerms(tf.gather(self.tokens, rows), tf.gather(self.lengths, rows), self.continuation,
                             None if self.spans is None else tf.gather(self.spans, rows), self.placement)

    def continues_word(self, token):
        """Whether each token (any shape) continues the word before it."""
        if self.continuation is None:
            return tf.zeros_like(token, tf.bool)
        return tf.gather(self.continuation, token)

    def total(self):
        """[B] term tokens per sentence (T)."""
        return tf.reduce_sum(self.lengths, axis=1)

    def initial(self, slots: int) -> TermState:
        batch, terms = tf.shape(self.lengths)[0], tf.shape(self.lengths)[1]
        met = tf.broadcast_to((self.lengths == 0)[:, None, :], tf.stack([batch, slots, terms]))
        zeros = tf.zeros(tf.stack([batch, slots]), tf.int32)
        no = tf.zeros_like(met)
        return TermState(met, zeros - 1, zeros, zeros - 1, tf.zeros(tf.stack([batch, slots])), no, no)

    def met_tokens(self, state: TermState):
        """[B, K] term tokens met: whole terms met, and the progress inside one."""
        return tf.reduce_sum(tf.cast(state.met, tf.int32) * self.lengths[:, None, :], axis=2) + state.position

    def _expected(self, state: TermState):
        """[B, K] the next token of the term each hypothesis is inside (garbage where none)."""
        inside = tf.gather(self.tokens, tf.maximum(state.term, 0), batch_dims=1)              # [B, K, L]
        return tf.gather(inside, tf.minimum(state.position, tf.shape(self.tokens)[2] - 1), batch_dims=2)

    def _mass(self, alpha):
        """[B, K, C] each slot's attention on each term's source tokens, [B, C] whether a term has any."""
        return (tf.einsum("bkx,bcx->bkc", tf.cast(alpha, tf.float32), self.spans),
                tf.reduce_any(self.spans > 0, axis=2))

    def open_starts(self, alpha, ending):
        """[B, K, C] where a hypothesis may be offered the first token of a
        term (dynamic beam allocation's extra candidates). With placement:
        while its attention on the term's source tokens is at least
        PLACEMENT_GATE and at least that on any other source token (not at
        the article before the noun); where it would end (`ending` [B, K]: [EOS] is its
        likeliest token), the fallback that appends a term rather than lose
        it; and a term with no source tokens in the sentence anywhere.
        Without placement, everywhere."""
        if self.spans is None or alpha is None:
            return tf.ones_like(self.lengths[:, None, :] > 0) & tf.ones_like(ending[:, :, None])
        mass, placed = self._mass(alpha)
        outside = tf.reduce_max(tf.cast(alpha, tf.float32)[:, :, None, :] * (1.0 - self.spans[:, None]), axis=3)
        return ((mass >= PLACEMENT_GATE) & (mass >= outside)) | ~placed[:, None, :] | ending[:, :, None]

    def transition(self, state: TermState, token, alpha=None, ending=None):
        """(the state after each hypothesis generates `token` [B, M] from
        its parent's `state`, the placement cost of that step [B, M]).

        With placement (`alpha` [B, M, Tx], the attention that chose the
        token; `ending` [B, M]: [EOS] was the parent's likeliest token),
        with most = placement x log(PLACEMENT_MASS / PLACEMENT_FLOOR):
        - starting a term costs placement x log(PLACEMENT_MASS / the
          attention on its source tokens) where that is below
          PLACEMENT_MASS, and APPEND_FACTOR x most where the hypothesis
          would rather have ended (appending it);
        - missing a term costs most, once, at the step where the attention
          falls below PLACEMENT_GATE on its source tokens after having been
          at least PLACEMENT_MASS there, with the term neither met nor
          begun: so a hypothesis that wrote the term where it belongs is
          not pushed out of its bank by one that wrote another term
          instead and could only append this one later.
        A term with no source tokens in the sentence costs nothing."""
        after, started = self.step(state, token)
        if self.spans is None or alpha is None:
            return after, tf.zeros(tf.shape(token))
        mass, placed = self._mass(alpha)
        most = float(self.placement * (np.log(PLACEMENT_MASS) - np.log(PLACEMENT_FLOOR)))
        column = tf.maximum(started, 0)
        at_start = tf.gather(mass, column, batch_dims=2)
        start = self.placement * tf.nn.relu(np.log(PLACEMENT_MASS) - tf.math.log(tf.maximum(at_start, PLACEMENT_FLOOR)))
        if ending is not None:
            start = tf.where(ending, APPEND_FACTOR * most, start)
        start = tf.where((started >= 0) & tf.gather(placed, column, batch_dims=1), start, 0.0)
        inside = tf.one_hot(after.term, tf.shape(self.lengths)[1], on_value=True, off_value=False)
        missed = (state.attended & (mass < PLACEMENT_GATE) & ~after.met & ~inside & ~state.missed
                  & placed[:, None, :])
        cost = start + most * tf.reduce_sum(tf.cast(missed, tf.float32), axis=2)
        return after._replace(cost=state.cost + cost, attended=state.attended | (mass >= PLACEMENT_MASS),
                              missed=state.missed | missed), cost

    def step(self, state: TermState, token):
        """(The state after each hypothesis generates `token` [B, K], the
        term it starts [B, K], -1: none); placement as `state`'s."""
        terms = tf.shape(self.lengths)[1]
        # A term completed by the previous token is undone if this one continues its last word.
        broken = (state.closing >= 0) & self.continues_word(token)
        met = state.met & ~(tf.one_hot(state.closing, terms, on_value=True, off_value=False) & broken[:, :, None])
        continues = (state.term >= 0) & tf.equal(token, self._expected(state))   # (== loses the static shape)
        term_length = tf.gather(self.lengths, tf.maximum(state.term, 0), batch_dims=1)
        completes = continues & (state.position + 1 >= term_length)
        # Otherwise the token may start a term not met yet (the first such one).
        starts = ((~met) & (self.lengths[:, None, :] > 0)
                  & tf.equal(self.tokens[:, None, :, 0], token[:, :, None]) & ~continues[:, :, None])
        started = tf.argmax(tf.cast(starts, tf.int32), axis=2, output_type=tf.int32)
        any_start = tf.reduce_any(starts, axis=2)
        started_length = tf.gather(self.lengths, started, batch_dims=1)
        one_token = any_start & (started_length == 1)
        met = (met
               | (tf.one_hot(state.term, terms, on_value=True, off_value=False) & completes[:, :, None])
               | (tf.one_hot(started, terms, on_value=True, off_value=False) & one_token[:, :, None]))
        inside = continues & ~completes
        opened = any_start & ~one_token
        term = tf.where(inside, state.term, tf.where(opened, started, -1))
        position = tf.where(inside, state.position + 1, tf.where(opened, 1, 0))
        closing = tf.where(completes, state.term, tf.where(one_token, started, -1))
        return (state._replace(met=met, term=term, position=position, closing=closing),
                tf.where(any_start, started, -1))

    def unmet(self, state: TermState):
        """[B, K] whether a hypothesis still misses a term."""
        return ~tf.reduce_all(state.met, axis=2)

    def extensions(self, log_probs, alive_score, state: TermState, k: int, best_extensions, alpha=None,
                   ending=None):
        """The k slots of the next beam, by dynamic beam allocation.

        Args:
          log_probs: [B, K, V] with every mask already added (forbidden
            tokens at NEG; [EOS] at NEG for hypotheses that miss a term).
          alive_score: [B, K] (NEG: dead slot).
          state: the slots' TermState.
          best_extensions: (log_probs, alive_score, k) -> (score, token,
            parent) [B, k], the unconstrained k best.
          alpha: [B, K, Tx] each slot's attention at this step (for the
            placement cost), or None.
          ending: with alpha, [B, K] bool: [EOS] is a slot's likeliest
            token before the masks (`open_starts`).

        Returns:
          (score, token, parent, cost) [B, k], the allocated candidates
          first (by score), then the best of the rest; dead candidates score
          NEG. A candidate that starts a placed term scores its placement
          cost (`cost`) less.
        """
        ending = tf.zeros_like(alive_score, tf.bool) if ending is None else ending
        beam, vocab = log_probs.shape[1], tf.shape(log_probs)[2]
        top_score, top_token, top_parent = best_extensions(log_probs, alive_score, k)
        # Each hypothesis' best next token.
        best_token = tf.argmax(log_probs, axis=2, output_type=tf.int32)
        best_score = tf.reduce_max(log_probs, axis=2) + alive_score
        # The tokens that advance each hypothesis on a term.
        inside = state.term >= 0
        terms = tf.shape(self.lengths)[1]
        first = tf.broadcast_to(self.tokens[:, None, :, 0], tf.shape(state.met))
        column = tf.range(terms)[None, None, :]
        term_token = tf.where(inside[:, :, None], self._expected(state)[:, :, None], first)          # [B, K, C]
        usable = tf.where(inside[:, :, None], column == 0,
                          (~state.met) & (self.lengths[:, None, :] > 0)
                          & self.open_starts(alpha, ending))
        term_score = tf.where(usable, tf.gather(log_probs, term_token, batch_dims=2) + alive_score[:, :, None],
                              NEG)
        slots = tf.broadcast_to(tf.range(beam)[None, :], tf.shape(alive_score))
        batch = tf.shape(alive_score)[0]
        flat = lambda x: tf.reshape(x, [batch, -1])
        score = tf.concat([top_score, best_score, flat(term_score)], 1)                               # [B, M]
        token = tf.concat([top_token, best_token, flat(term_token)], 1)
        parent = tf.concat([top_parent, slots, flat(tf.broadcast_to(slots[:, :, None], tf.shape(term_token)))], 1)
        # Banks: term tokens met after the candidate's token; a term started away from its source costs.
        before = TermState(*(tf.gather(x, parent, batch_dims=1) for x in state))
        after, cost = self.transition(before, token, None if alpha is None else tf.gather(alpha, parent, batch_dims=1),
                                      tf.gather(ending, parent, batch_dims=1))
        score -= cost
        bank = self.met_tokens(after)                                                                  # [B, M]
        # The same extension offered twice counts once (its first offer).
        key = parent * vocab + token
        valid = score > NEG / 2
        same = tf.equal(key[:, :, None], key[:, None, :]) & valid[:, None, :]
        earlier = tf.linalg.band_part(tf.ones_like(same[0], tf.int32), -1, 0) - tf.eye(tf.shape(key)[1],
                                                                                         dtype=tf.int32)
        duplicate = tf.reduce_any(same & tf.cast(earlier, tf.bool)[None], axis=2)
        score = tf.where(valid & ~duplicate, score, NEG)
        order = tf.argsort(score, axis=1, direction="DESCENDING", stable=True)
        bank, score_sorted = tf.gather(bank, order, batch_dims=1), tf.gather(score, order, batch_dims=1)
        banks = self.total() + 1                                                                       # [B]
        depth = tf.reduce_max(tf.concat([banks, [1]], 0))
        alive = score_sorted > NEG / 2
        seen = tf.cumsum(tf.one_hot(bank, depth, dtype=tf.int32), axis=1)
        rank = tf.gather(seen, bank, batch_dims=2) - 1                                                 # within its bank
        # k // (T + 1) slots per bank; the k % (T + 1) left go one each to the
        # fullest banks that have candidates.
        filled = tf.reduce_any(tf.one_hot(bank, depth, on_value=True, off_value=False) & alive[:, :, None], axis=1)
        above = tf.cumsum(tf.cast(filled, tf.int32), axis=1, exclusive=True, reverse=True)         # [B, depth]
        extra = filled & (above < (k % banks)[:, None])
        capacity = (k // banks)[:, None] + tf.cast(tf.gather(extra, bank, batch_dims=1), tf.int32)
        chosen = (rank < capacity) & alive
        order = tf.gather(order, tf.argsort(tf.cast(chosen, tf.int32), axis=1, direction="DESCENDING", stable=True),
                          batch_dims=1)[:, :k]
        return tuple(tf.reshape(tf.gather(x, order, batch_dims=1), [batch, k]) for x in (score, token, parent, cost))


def term_starts(tokens, term_ids, lengths):
    """[B, N, T, C] whether term c's ids (term_ids [B, C, L], 0-padded;
    lengths [B, C], 0: no term) start at position t of hypothesis n
    (tokens [B, N, T])."""
    steps, width = tf.shape(tokens)[2], tf.shape(term_ids)[2]
    padded = tf.pad(tokens, [[0, 0], [0, 0], [0, width]])
    windows = tf.gather(padded, tf.range(steps)[:, None] + tf.range(width)[None, :], axis=2)         # [B, N, T, L]
    wanted = term_ids[:, None, None, :, :]                                                            # [B, 1, 1, C, L]
    return (tf.reduce_all(tf.equal(windows[:, :, :, None, :], wanted) | (wanted == PAD_ID), axis=4)
            & (lengths > 0)[:, None, None, :])


def contains_terms(tokens, terms: RequiredTerms):
    """[B, N] whether each hypothesis (tokens [B, N, T], [PAD] after its end)
    holds every term of its sentence as consecutive tokens, not followed by
    a token that continues the term's last word."""
    steps, width = tf.shape(tokens)[2], tf.shape(terms.tokens)[2]
    matches = term_starts(tokens, terms.tokens, terms.lengths)                                       # [B, N, T, C]
    padded = tf.pad(tokens, [[0, 0], [0, 0], [0, width + 1]])
    after = tf.range(steps)[None, :, None] + terms.lengths[:, None, :]                                 # [B, T, C]
    following = tf.gather(padded, tf.broadcast_to(after[:, None], tf.shape(matches)), batch_dims=2)
    found = tf.reduce_any(matches & ~terms.continues_word(following), axis=2)                         # [B, N, C]
    return tf.reduce_all(found | (terms.lengths[:, None, :] == 0), axis=2)


def eos_mask(unmet, kind, last_kind: int):
    """[B, K] additive mask for [EOS]: NEG where a hypothesis misses a term,
    except at the last allowed position (`kind` [B] == last_kind), where
    every hypothesis is closed."""
    return tf.where(unmet & (kind != last_kind)[:, None], NEG, 0.0)

