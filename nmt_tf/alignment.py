"""IBM Model 1 (Brown et al. 1993): word translation probabilities learned by
EM from sentence pairs, for the [UNK] dictionary (nmt_tf.unk_dictionary) and
the vocabulary shortlists of search (nmt_tf.shortlist)."""

from __future__ import annotations

import numpy as np

NULL = 0    # id of the NULL word added to every given sentence; real tokens never use it


def _links(given, generated, generated_size: int):
    """The alignment links of some sentence pairs: (keys [E] int64, given
    token x generated_size + generated token, one per (given position with
    NULL, generated position); position [E], the generated position each
    belongs to, numbered across the pairs; the number of such positions)."""
    keys, occurrence, position = [], [], 0
    for g, e in zip(given, generated):
        g = np.concatenate([[NULL], g]).astype(np.int64)
        e = np.asarray(e, np.int64)
        keys.append((g[:, None] * generated_size + e[None, :]).ravel())     # [len(g) * len(e)]
        occurrence.append(np.tile(np.arange(position, position + len(e)), len(g)))
        position += len(e)
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    return np.concatenate(keys), np.concatenate(occurrence), position


def model1(given: list, generated: list, given_size: int, generated_size: int, iterations: int,
           chunk_pairs: int = 20000):
    """IBM Model 1: p(generated token | given token), EM from uniform, with a
    NULL word (id 0) added to every `given` sentence. Returns (keys, probs):
    keys = given_id * generated_size + generated_id, sorted, of every pair
    that co-occurs; probs their probabilities. The links of at most
    `chunk_pairs` sentence pairs are in memory at once (an iteration walks
    the pairs chunk by chunk), besides one value per co-occurring pair."""
    chunks = [slice(start, start + chunk_pairs) for start in range(0, len(given), chunk_pairs)]
    unique = np.unique(np.concatenate([np.unique(_links(given[c], generated[c], generated_size)[0])
                                       for c in chunks] or [np.zeros(0, np.int64)]))
    given_of_unique = unique // generated_size
    prob = np.ones(len(unique))
    for _ in range(iterations):
        counts = np.zeros(len(unique))
        for c in chunks:
            keys, occurrence, positions = _links(given[c], generated[c], generated_size)
            pair = np.searchsorted(unique, keys)
            p = prob[pair]
            posterior = p / np.bincount(occurrence, weights=p, minlength=positions)[occurrence]
            counts += np.bincount(pair, weights=posterior, minlength=len(unique))
        prob = counts / np.bincount(given_of_unique, weights=counts, minlength=given_size)[given_of_unique]
    return unique, prob
