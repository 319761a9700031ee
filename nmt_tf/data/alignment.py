"""IBM Model 1 (Brown et al. 1993): word translation probabilities learned by
EM from sentence pairs, for the [UNK] dictionary (`learn_dictionary`, from a
corpus `split_corpus` cut into words; nmt_tf.unk_dictionary) and the
vocabulary shortlists of search (nmt_tf.shortlist)."""

from __future__ import annotations

import collections
import itertools

import numpy as np

from nmt_tf.core.files import InputError

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


def split_corpus(src_lines, tgt_lines, src_lang: str, tgt_lang: str, max_len: int, max_sentences: int,
                 names=("source", "target"), chunk: int = 8192):
    """Reads line-aligned byte lines and splits them into words as nmt_tf's
    word tokenizer does. Returns (pairs, skipped): pairs is a list of
    (source words, target words) lists of str; skipped counts the pairs left
    out, by reason. Unequal numbers of lines are an InputError naming the
    shorter file."""
    from nmt_tf.data.text import words_of_lines

    pairs, skipped = [], collections.Counter()
    both = itertools.zip_longest(src_lines, tgt_lines)       # a missing line shows as None
    while len(pairs) < max_sentences:
        block = list(itertools.islice(both, min(chunk, max_sentences - len(pairs))))
        if not block:
            break
        if block[-1][0] is None or block[-1][1] is None:
            shorter = names[0] if block[-1][0] is None else names[1]
            raise InputError(f"{shorter} has fewer lines than the other side of the corpus "
                             f"({names[0]}, {names[1]}): they must be line-aligned.")
        src_words = words_of_lines([s for s, _ in block], src_lang)
        tgt_words = words_of_lines([t for _, t in block], tgt_lang)
        for s, t in zip(src_words, tgt_words):
            if not s or not t:
                skipped["an empty side"] += 1
            elif len(s) > max_len or len(t) > max_len:
                skipped[f"more than {max_len} words"] += 1
            else:
                pairs.append((s, t))
    return pairs, skipped


class Vocabulary:
    """Word <-> id, id 0 the NULL word; counts occurrences."""

    def __init__(self):
        self.ids = {}
        self.words = ["<NULL>"]
        self.counts = [0]

    def encode(self, words) -> np.ndarray:
        out = np.empty(len(words), np.int64)
        for i, w in enumerate(words):
            j = self.ids.get(w)
            if j is None:
                j = self.ids[w] = len(self.words)
                self.words.append(w)
                self.counts.append(0)
            self.counts[j] += 1
            out[i] = j
        return out


def learn_dictionary(pairs, iterations: int = 5, log=print) -> list[tuple[str, str]]:
    """(source, target) word-list pairs -> [(source word, target word)], one
    per source word, most frequent source words first: IBM Model 1 in both
    directions (source->target with a NULL source word, target->source with a
    NULL target word), and for each source word the target word w that
    maximises p(w | source word) * p(source word | w) among those it co-occurs
    with (nmt_tf.unk_dictionary's dictionary)."""
    src_vocab, tgt_vocab = Vocabulary(), Vocabulary()
    src = [src_vocab.encode(s) for s, _ in pairs]
    tgt = [tgt_vocab.encode(t) for _, t in pairs]
    ns, nt = len(src_vocab.words), len(tgt_vocab.words)
    log(f"IBM Model 1 on {len(pairs):,} pairs, {ns - 1:,} source and {nt - 1:,} target words, "
        f"{iterations} iterations each way")
    forward_keys, forward = model1(src, tgt, ns, nt, iterations)          # p(t | s), keys s * nt + t
    backward_keys, backward = model1(tgt, src, nt, ns, iterations)       # p(s | t), keys t * ns + s
    # The same pairs in the forward key order (both sets hold every co-occurring pair; NULL only on one side).
    words = forward_keys // nt != NULL
    keys = forward_keys[words]
    s, t = keys // nt, keys % nt
    index = np.searchsorted(backward_keys, t * ns + s)
    score = forward[words] * backward[index]
    # For each source word (keys are sorted by s), the target word of the largest score.
    order = np.lexsort((-score, s))
    first = np.ones(len(order), bool)
    first[1:] = s[order][1:] != s[order][:-1]
    best = order[first]
    entries = [(src_vocab.words[s[i]], tgt_vocab.words[t[i]], src_vocab.counts[s[i]]) for i in best]
    entries.sort(key=lambda e: (-e[2], e[0]))
    return [(a, b) for a, b, _ in entries]
