"""Several trained models decoded as one (ensemble decoding).

At every search step each member computes log p_m(y_i | y_<i, x) from its
own state, and the ensemble's distribution is their mean,

    log p(y_i | y_<i, x) = 1/M sum_m log p_m(y_i | y_<i, x),

the log-probability averaging of Marian and Nematus (an unnormalised
geometric mean: the beam ranks hypotheses by it). Forced decoding (the score
signature) averages the members' token log-probabilities the same way. The
attention of an ensemble is the mean of the members' (RNNencdec members have
none: zeros).

An `Ensemble` offers what nmt_tf.inference.search and nmt_tf.inference.translation_graph need of a model
(`step_weights`, `search_inputs`, `decode_step`, `target_log_probs`,
`freeze_step_weights`), so an exported SavedModel runs the ensemble inside
its graph and TF Serving serves it as one model. The members must share
their vocabularies (`nmt_tf.inference.restore.restore_ensemble` checks); they may
differ in architecture and size.
"""

from __future__ import annotations

import tensorflow as tf


class Ensemble(tf.Module):
    """Members' log-probabilities averaged at every step.

    Args:
      members: trained `Seq2SeqModel`s with the same target vocabulary (one
        member gives that model's results).

    Search state: the members' search states side by side, [batch, K,
    sum of member.search_state_size]; per-sentence inputs: each member's, keyed
    "<member index>/<key>" (search gathers them row by row like any model's).
    """

    def __init__(self, members, name="ensemble"):
        super().__init__(name=name)
        if not members:
            raise ValueError("an ensemble needs at least one model")
        sizes = {m.target_vocab_size for m in members}
        if len(sizes) != 1:
            raise ValueError(f"ensemble members must share the target vocabulary; sizes {sorted(sizes)}")
        self.members = list(members)
        self.target_vocab_size = members[0].target_vocab_size
        self.source_vocab_size = members[0].source_vocab_size

    @property
    def search_state_size(self) -> int:
        return sum(m.search_state_size for m in self.members)

    def step_weights(self) -> list:
        return [m.step_weights() for m in self.members]

    def freeze_step_weights(self, token_products: bool = True, output_layer: bool = True) -> list:
        return [v for m in self.members for v in m.freeze_step_weights(token_products, output_layer)]

    def restrict_output(self, weights: list, ids) -> list:
        return [m.restrict_output(w, ids) for m, w in zip(self.members, weights)]

    def search_inputs(self, source_ids, weights):
        inputs, states = {}, []
        for i, (member, member_weights) in enumerate(zip(self.members, weights)):
            member_inputs = member.search_inputs(source_ids, member_weights)
            states.append(member_inputs.pop("state"))
            inputs.update({f"{i}/{key}": value for key, value in member_inputs.items()})
        return {**inputs, "state": tf.concat(states, axis=-1)}

    def decode_step(self, previous_ids, state, inputs, weights=None):
        """As `RNNSearch.decode_step`, for the members together."""
        weights = weights or self.step_weights()
        log_probs, states, alphas, start = [], [], [], 0
        for i, (member, member_weights) in enumerate(zip(self.members, weights)):
            width = member.search_state_size
            prefix = f"{i}/"
            member_inputs = {key[len(prefix):]: value for key, value in inputs.items() if key.startswith(prefix)}
            lp, new_state, alpha = member.decode_step(previous_ids, state[..., start:start + width],
                                                      member_inputs, member_weights)
            start += width
            log_probs.append(lp)
            states.append(new_state)
            alphas.append(alpha)
        return tf.add_n(log_probs) / len(log_probs), tf.concat(states, axis=-1), tf.add_n(alphas) / len(alphas)

    def target_log_probs(self, x, y):
        """Forced decoding: the mean of the members' log p(y_i | y_<i, x), [batch, Ty]."""
        return tf.add_n([m.target_log_probs(x, y) for m in self.members]) / len(self.members)
