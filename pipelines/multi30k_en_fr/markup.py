r"""Issue 93 item 3: how well inline markup lands, measured on a tagged test 2016.

  python pipelines/multi30k_en_fr/markup.py            # writes markup/measured.json, markup/tagged.en, markup/tagged.fr
  python pipelines/multi30k_en_fr/markup.py --set=val --sweep    # the placement rules compared on val: markup/val.json

The tagged set (rules fixed before any result was seen): in each test 2016
English sentence, one word is wrapped in <b>...</b>: the longest word made
of letters only that is not a stopword (the first of equal length); a
sentence without one is left out. Where it belongs in the reference: IBM
Model 1 learned both ways on the training corpus (nmt_tf.data.alignment,
words lowercased and stripped of punctuation, 5 iterations each way), the
reference word w that maximises p(w | word) * p(word | w), as
nmt_tf.unk_dictionary chooses a translation.

The shipped preset translates the tagged lines with --markup=html
(Translator.translate(markup="html"), its served search). Measured:

  well_formed      outputs that parse as balanced markup, the element once
  placement        of the sentences whose output holds the reference's word
                   (lowercased, punctuation stripped) exactly once: the share
                   where <b> wraps exactly that word ("exact"), or wraps it
                   among others ("covers")
  bleu             sacreBLEU 13a / lc Moses-tok of the outputs with their
                   tags stripped, against the plain outputs of the same
                   sentences without markup (the model reads the same text,
                   so they must be equal) and against the references

--sweep also places the tags with each share in SHARES (`min_share` of
nmt_tf.inference.markup.restore: the share of a target word's attention
that must be on the element's words) and reports each; the rule is chosen
on val (--set=val), test 2016 only measured with the chosen one.
"""

from __future__ import annotations

import gzip
import html
import html.parser
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
DATA = os.path.join(REPO, "data", "multi30k")
OUT = os.path.join(HERE, "markup")
STOPWORDS = set("""a an the and or of in on at to for with by from into onto over under near while their there
their they them this that these those his her its our your who what which where when some other another
each both many several very just about through behind front next around along across""".split())
PUNCT = re.compile(r"^\W+|\W+$")
SHARES = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9)


def read(name: str, lang: str) -> list[str]:
    with gzip.open(os.path.join(DATA, f"{name}.{lang}.gz"), "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def norm(word: str) -> str:
    return PUNCT.sub("", word.lower())


def tagged_word(sentence: str) -> int | None:
    best = None
    for i, word in enumerate(sentence.split()):
        w = norm(word)
        if w.isalpha() and w not in STOPWORDS and (best is None or len(w) > len(norm(sentence.split()[best]))):
            best = i
    return best


def lexicon():
    """p(f | e) and p(e | f) of IBM Model 1 on the training corpus, as dicts of dicts."""
    from nmt_tf.data.alignment import Vocabulary, model1

    pairs = [([norm(w) for w in e.split() if norm(w)], [norm(w) for w in f.split() if norm(w)])
             for e, f in zip(read("train", "en"), read("train", "fr"))]
    pairs = [(e, f) for e, f in pairs if e and f]
    ve, vf = Vocabulary(), Vocabulary()
    src, tgt = [ve.encode(e) for e, _ in pairs], [vf.encode(f) for _, f in pairs]
    forward = model1(src, tgt, len(ve.words), len(vf.words), 5)       # p(f | e)
    backward = model1(tgt, src, len(vf.words), len(ve.words), 5)      # p(e | f)
    return ve, vf, dict(zip(*forward)), dict(zip(*backward))


def reference_word(word: str, reference: str, lex) -> str | None:
    ve, vf, forward, backward = lex
    e = ve.ids.get(word)
    if e is None:
        return None
    best, score = None, 0.0
    nf, ne = len(vf.words), len(ve.words)
    # the reference's words in their order (a set's order changed with the hash seed, and so did ties)
    for w in dict.fromkeys(norm(x) for x in reference.split() if norm(x)):
        f = vf.ids.get(w)
        if f is None:
            continue
        p = forward.get(e * nf + f, 0.0) * backward.get(f * ne + e, 0.0)
        if p > score:
            best, score = w, p
    return best


class _Elements(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.ok, self.inside, self.wrapped, self.count = [], True, False, [], 0

    def handle_starttag(self, tag, attrs):
        self.stack.append(tag)
        self.count += tag == "b"
        self.inside = self.inside or tag == "b"

    def handle_endtag(self, tag):
        self.ok = self.ok and bool(self.stack) and self.stack.pop() == tag
        if tag == "b":
            self.inside = False

    def handle_data(self, data):
        if self.inside:
            self.wrapped.append(data)


def placement(rows, results, min_share: float) -> dict:
    """Well-formedness and placement of `results` (Translations of the
    tagged lines' plain text) with their tags put back by `min_share`."""
    from nmt_tf.inference import markup

    exact = covers = eligible = formed = 0
    for row, result in zip(rows, results):
        text, _ = markup.restore(markup.strip(row["tagged"], "html"), result.text, result.source_tokens,
                                 result.target_tokens, result.alignment, min_share=min_share)
        parser = _Elements()
        parser.feed(text)
        parser.close()
        formed += parser.ok and not parser.stack and parser.count == 1
        plain = html.unescape(re.sub(r"<[^>]*>", "", text))
        wrapped = [norm(w) for w in " ".join(parser.wrapped).split() if norm(w)]
        row.update(output=text, plain=plain)
        target = row["reference_word"]
        if target and [norm(w) for w in plain.split()].count(target) == 1:
            eligible += 1
            exact += wrapped == [target]
            covers += target in wrapped
    return {"min_share": min_share, "well_formed": round(formed / len(rows), 4), "eligible": eligible,
            "exact": round(exact / max(eligible, 1), 4), "covers": round(covers / max(eligible, 1), 4)}


def main():
    import argparse

    import nmt_tf
    from nmt_tf.core.hardware import vector_flags
    from nmt_tf.evaluation.metrics import corpus_scores
    from nmt_tf.inference import markup

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", default="test_2016_flickr", help="A Multi30k set (file stem under data/multi30k).")
    parser.add_argument("--sweep", action="store_true", help="Also place with each share in SHARES.")
    args = parser.parse_args()
    start = time.monotonic()
    sources, references = read(args.set, "en"), read(args.set, "fr")
    lex = lexicon()
    rows = []
    for i, (source, reference) in enumerate(zip(sources, references)):
        k = tagged_word(source)
        if k is None:
            continue
        words = [html.escape(w, quote=False) for w in source.split()]
        tagged = " ".join(words[:k] + [f"<b>{words[k]}</b>"] + words[k + 1:])
        word = norm(source.split()[k])
        rows.append({"line": i, "source": source, "tagged": tagged, "word": word,
                     "reference_word": reference_word(word, reference, lex)})
    translator = nmt_tf.Translator.from_preset("multi30k_en_fr")
    results = translator.translate([markup.strip(r["tagged"], "html").text for r in rows])
    plain = translator.translate([r["source"] for r in rows])
    sweep = [placement(rows, results, share) for share in SHARES] if args.sweep else []
    shipped = placement(rows, results, markup.DEFAULT_MIN_SHARE)
    stripped, plain_text = [r["plain"] for r in rows], [p.text for p in plain]
    refs = [references[r["line"]] for r in rows]
    scores = {name: corpus_scores(hyp, refs, "fr") for name, hyp in (("tags_stripped", stripped),
                                                                    ("plain", plain_text))}
    record = {
        "set": args.set, "sentences": len(sources), "tagged": len(rows), "well_formed": shipped["well_formed"],
        "placement": {k: shipped[k] for k in ("min_share", "eligible", "exact", "covers")},
        "sweep": sweep,
        "stripped_equals_plain": sum(a == b for a, b in zip(stripped, plain_text)),
        "bleu": {name: {"sacrebleu_13a": round(s["bleu"], 2), "lc_moses_tok": round(s["bleu_lc_moses"], 2)}
                 for name, s in scores.items()},
        "signature": scores["plain"]["bleu_signature"], "lc_moses_signature": scores["plain"]["bleu_lc_moses_signature"],
        "search": (translator.metadata or {}).get("search"),
        "cpu_flags": " ".join(vector_flags()), "date": time.strftime("%Y-%m-%d %H:%M"),
        "seconds": round(time.monotonic() - start, 1),
    }
    os.makedirs(OUT, exist_ok=True)
    stem = "" if args.set == "test_2016_flickr" else f"{args.set}."
    with open(os.path.join(OUT, f"{stem}tagged.en"), "w", encoding="utf-8") as f:
        f.writelines(r["tagged"] + "\n" for r in rows)
    with open(os.path.join(OUT, f"{stem}tagged.fr"), "w", encoding="utf-8") as f:
        f.writelines(r["output"] + "\n" for r in rows)
    with open(os.path.join(OUT, f"{stem}measured.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(record, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
