r"""Builds the word dictionary that --replace_unk --unk_dictionary uses, from a parallel corpus.

Usage:
  python -m nmt_tf.unk_dictionary --train_src=train.en.gz --train_tgt=train.fr.gz \
      --src_lang=en --tgt_lang=fr --output=unk_dictionary.tsv

[UNK] replacement (Luong et al. 2015; Jean et al. 2015) puts, for each [UNK]
the model generates, the source word it attended to most, or that word's
translation from a dictionary. Copying is right for names and numbers; the
dictionary is for the other case, a source word the model knows whose
translation is too rare for the target shortlist (the published systems
took it from a word aligner). This tool learns one from the training
corpus: IBM Model 1 (Brown et al. 1993; EM, --dictionary_iterations) in both
directions, source->target with a NULL source word and target->source with
a NULL target word, and for each source word the target word w that
maximises p(w | source word) * p(source word | w) among the words it
co-occurs with. The product of the two directions keeps frequent function
words ("le", ".") from becoming the translation of a rare word, which one
direction alone does (a rare word "explains" whatever its sentence has left).

Words are split exactly as the word tokenizer of nmt_tf splits them (the
same TF ops, case kept), so the entries match the source tokens and target
words of a `--tokenizer=word` model. The output is `source<TAB>target`, one
line per source word, most frequent source words first (UTF-8). Pairs with
an empty side or more than --max_len words on either side are skipped and
counted; corpora of unequal length are an error. The whole corpus (up to
--dictionary_max_sentences pairs) is held in memory.
"""

from __future__ import annotations

import collections
import itertools
import sys

import numpy as np
from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags
from nmt_tf.alignment import NULL, model1
from nmt_tf.files import InputError, input_lines, write_atomically

absl_flags.DEFINE_integer("dictionary_iterations", 5, "EM iterations of IBM Model 1 in each direction.",
                          lower_bound=1)
absl_flags.DEFINE_integer("dictionary_max_sentences", 1_000_000,
                          "Learn from at most this many sentence pairs (the first ones).", lower_bound=1)
TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("train_src", "train_tgt", "src_lang", "tgt_lang", "max_len",
                                             "output"))

def split_corpus(src_lines, tgt_lines, src_lang: str, tgt_lang: str, max_len: int, max_sentences: int,
                 names=("source", "target"), chunk: int = 8192):
    """Reads line-aligned byte lines and splits them into words as nmt_tf's
    word tokenizer does. Returns (pairs, skipped): pairs is a list of
    (source words, target words) lists of str; skipped counts the pairs left
    out, by reason. Unequal numbers of lines are an InputError naming the
    shorter file."""
    from nmt_tf.text import words_of_lines

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


def learn(pairs, iterations: int = 5, log=print) -> list[tuple[str, str]]:
    """(source, target) word-list pairs -> [(source word, target word)], one
    per source word, most frequent source words first."""
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


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    missing = [f"--{name}" for name in ("train_src", "train_tgt", "output") if not FLAGS[name].value]
    if missing:
        return nmt_flags.user_error(f"{' and '.join(missing)} required.")
    log = lambda message: print(message, file=sys.stderr)      # noqa: E731
    try:
        pairs, skipped = split_corpus(
            input_lines(FLAGS.train_src, "train_src"), input_lines(FLAGS.train_tgt, "train_tgt"),
            FLAGS.src_lang, FLAGS.tgt_lang, FLAGS.max_len, FLAGS.dictionary_max_sentences,
            names=(f"{FLAGS.train_src} (--train_src)", f"{FLAGS.train_tgt} (--train_tgt)"))
        if skipped:
            log("Skipped " + ", ".join(f"{n:,} pairs with {why}" for why, n in skipped.items()))
        if not pairs:
            return nmt_flags.user_error(f"no usable sentence pairs in {FLAGS.train_src} and {FLAGS.train_tgt}.")
        entries = learn(pairs, FLAGS.dictionary_iterations, log)
        write_atomically(FLAGS.output, "".join(f"{s}\t{t}\n" for s, t in entries))
    except (OSError, ValueError) as e:      # InputError, WriteFailed, ...
        return nmt_flags.user_error(e)
    log(f"Wrote {len(entries):,} entries to {FLAGS.output}; "
        f"{sum(s != t for s, t in entries):,} of them translate the word into another.")
    return 0


if __name__ == "__main__":
    app.run(main)
