r"""Issue 93 item 2: placeholders. Training pairs with masks, and how well items survive.

  python pipelines/multi30k_en_fr/placeholders.py --make_training      # placeholders/train.masked.{en,fr}.gz
  python pipelines/multi30k_en_fr/placeholders.py --set=val --preset=multi30k_en_fr     # measure (val chooses)

--make_training: the training pairs again, each with masks (°1°, °2°, ...,
nmt_tf.inference.placeholders) at places that correspond on both sides,
so that a model trained or fine-tuned with them learns to copy a mask where
its source words go. Rules (fixed before any result was seen; seed 93):
- items that nmt_tf.inference.placeholders finds on both sides alike
  ("at 9:30" / "à 9:30") are masked on both;
- then 1 mask (70 %), 2 (22 %) or 3 (8 %) more: each before the
  sentence's final punctuation (40 %), or before a content word of the
  source and, in the target, before the word IBM Model 1 aligns to it
  (both ways, as pipelines/multi30k_en_fr/markup.py; a word without a
  confident match goes to the end); 1 in 10 inside parentheses;
- masks are numbered in source order; targets from --train_tgt (default
  the teachers' ensemble translations the student learns from).

Measure: each line of the set gets one item (two in every third line) of
a kind in turn (url, email, handle, hashtag, number, emoji; fixed lists
below), after a word chosen at random or before the final punctuation, in
turn. The model translates the lines with protect="all":
- survived: items that appear exactly once, verbatim, in their line's
  output (and those put back by the attention, counted apart);
- bleu: sacreBLEU 13a / lc Moses-tok of the outputs with the items taken
  out, against the references, beside the same model's translation of the
  lines without items;
- unprotected: the same two figures for the lines translated with
  protect="none", as every model translated them before.
Written to placeholders/<set>.measured.json with placeholders/<set>.inserted.en
and the outputs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

from markup import STOPWORDS, lexicon, norm, reference_word  # noqa: E402  (the markup pipeline, beside this file)

from nmt_tf.inference import placeholders  # noqa: E402

DATA = os.path.join(REPO, "data", "multi30k")
OUT = os.path.join(HERE, "placeholders")
SEED = 93
END = re.compile(r"^(.*?)([.!?]*)$")
ITEMS = {
    "url": ["https://www.example.com/photos", "www.flickr.com/photos/1234", "http://example.org/a?id=7",
            "https://fr.wikipedia.org/wiki/Chien"],
    "email": ["jo.smith@example.com", "info@example.org", "photo+club@mail.example.net"],
    "handle": ["@bob_smith", "@NatGeo", "@anna99"],
    "hashtag": ["#summer", "#TBT", "#dogsofinstagram", "#Paris2024"],
    "number": ["7:30", "$25.99", "25€", "3,500", "42%", "2026-12-05", "10h30", "3.14", "1999"],
    "emoji": ["🙂", "🐶", "👍🏽", "🎉🎉", "❤️"],
}


def read(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def split_end(words: list[str]) -> tuple[list[str], str]:
    """The words with the final punctuation of the last taken off, and that punctuation."""
    if not words:
        return words, ""
    body, punct = END.match(words[-1]).groups()
    if not body:
        return words[:-1], words[-1]
    return words[:-1] + [body], punct


def masked_pair(source: str, target: str, rng: random.Random, lex) -> tuple[str, str]:
    """`source` and `target` with masks at corresponding places (the module docstring's rules)."""
    s_items = [source[a:b] for a, b in placeholders.find(source)]
    t_items = [target[a:b] for a, b in placeholders.find(target)]
    natural = bool(s_items) and sorted(s_items) == sorted(t_items)
    if natural:                        # the same items on both sides: masked alike (numbered by the source)
        source = placeholders.protect(source).text
        order = {item: i + 1 for i, item in enumerate(s_items)}
        target_items = iter(t_items)
        target = re.sub("|".join(re.escape(t) for t in sorted(set(t_items), key=len, reverse=True)),
                        lambda m: placeholders.mask(order[next(target_items)]), target)
    src, s_end = split_end(source.split())
    tgt, t_end = split_end(target.split())
    count = rng.choices([1, 2, 3], [70, 22, 8])[0]
    taken = len(s_items) if natural else 0
    places = []                        # (source gap, target gap); gap len(words) is the end
    for _ in range(count):
        content = [i for i, w in enumerate(src) if norm(w) and norm(w) not in STOPWORDS and
                   placeholders.OPEN not in w]
        gap = None
        if content and rng.random() >= 0.4:
            i = rng.choice(content)
            word = reference_word(norm(src[i]), " ".join(tgt), lex)
            j = next((j for j, w in enumerate(tgt) if norm(w) == word), None) if word else None
            if j is not None:
                gap = (i, j)
        places.append(gap or (len(src), len(tgt)))
    places.sort()
    shift_s = shift_t = 0
    inserts_t = []
    for n, (i, j) in enumerate(places, taken + 1):
        token = placeholders.mask(n)
        if rng.random() < 0.1:
            token = f"({token})"
        src.insert(i + shift_s, token)
        shift_s += 1
        inserts_t.append((j, n, token))
    for j, _, token in sorted(inserts_t, reverse=True):      # at one place, in source order
        tgt.insert(j, token)
    return " ".join(src) + s_end, " ".join(tgt) + t_end


def make_training(args):
    sources, targets = read(args.train_src), read(args.train_tgt)
    if len(sources) != len(targets):
        raise SystemExit(f"{args.train_src} has {len(sources)} lines, {args.train_tgt} {len(targets)}")
    lex = lexicon()
    rng = random.Random(SEED)
    pairs = [masked_pair(s, t, rng, lex) for s, t in zip(sources, targets)]
    os.makedirs(OUT, exist_ok=True)
    for side, lang in ((0, "en"), (1, "fr")):
        with gzip.open(os.path.join(OUT, f"train.masked.{lang}.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
            f.writelines(pair[side] + "\n" for pair in pairs)
    masks = sum(len(re.findall(r"°\d+°", p[0])) for p in pairs)
    agree = sum(sorted(re.findall(r"°\d+°", a)) == sorted(re.findall(r"°\d+°", b)) for a, b in pairs)
    print(f"{len(pairs):,} pairs, {masks:,} masks; the same masks on both sides in {agree:,}")


def inserted_lines(sources: list[str]) -> list[tuple[str, list[str]]]:
    """Each line with its inserted items (the module docstring's rules)."""
    rng = random.Random(SEED)
    kinds = list(ITEMS)
    out = []
    for n, line in enumerate(sources):
        items = [ITEMS[kinds[n % 6]][n // 6 % len(ITEMS[kinds[n % 6]])]]
        if n % 3 == 2:
            kind = kinds[(n + 1) % 6]
            items.append(ITEMS[kind][(n // 6 + 1) % len(ITEMS[kind])])
        words, end = split_end(line.split())
        for item in items:
            gap = len(words) if (n + len(item)) % 2 else rng.randrange(1, len(words) + 1)
            words.insert(gap, item)
        out.append((" ".join(words) + end, items))
    return out


def without(text: str, items: list[str]) -> str:
    for item in items:
        text = text.replace(item, " ")
    return " ".join(text.split()).replace(" .", ".")


def measure(args):
    import nmt_tf
    from nmt_tf.core.hardware import vector_flags
    from nmt_tf.evaluation.metrics import corpus_scores

    start = time.monotonic()
    sources = read(os.path.join(DATA, f"{args.set}.en.gz"))
    references = read(os.path.join(DATA, f"{args.set}.fr.gz"))
    rows = inserted_lines(sources)
    translator = (nmt_tf.Translator.from_model_dir(args.model_dir, checkpoint=args.checkpoint,
                                                   beam_size=args.beam_size, n_best=1)
                  if args.model_dir else nmt_tf.Translator.from_preset(args.preset))
    results = translator.translate([line for line, _ in rows])
    plain = translator.translate(sources, protect="none")
    unprotected = translator.translate([line for line, _ in rows], protect="none")

    def survived(outputs):
        return sum(r.text.count(item) == 1 for (_, items), r in zip(rows, outputs) for item in items)

    total = sum(len(items) for _, items in rows)
    hyps = {"items_taken_out": [without(r.text, items) for (_, items), r in zip(rows, results)],
            "without_items": [p.text for p in plain],
            "unprotected_items_taken_out": [without(r.text, items) for (_, items), r in zip(rows, unprotected)]}
    scores = {name: corpus_scores(hyp, references, "fr") for name, hyp in hyps.items()}
    record = {
        "set": args.set, "model": args.model_dir or args.preset,
        "search": {"beam_size": args.beam_size} if args.model_dir else (translator.metadata or {}).get("search"),
        "lines": len(rows), "items": total,
        "survived_exactly_once": round(survived(results) / total, 4),
        "lines_put_back_by_attention": sum(r.placeholder_warning is not None for r in results),
        "unprotected_survived_exactly_once": round(survived(unprotected) / total, 4),
        "bleu": {name: {"sacrebleu_13a": round(s["bleu"], 2), "lc_moses_tok": round(s["bleu_lc_moses"], 2)}
                 for name, s in scores.items()},
        "signature": scores["without_items"]["bleu_signature"],
        "lc_moses_signature": scores["without_items"]["bleu_lc_moses_signature"],
        "cpu_flags": " ".join(vector_flags()), "date": time.strftime("%Y-%m-%d %H:%M"),
        "seconds": round(time.monotonic() - start, 1),
    }
    os.makedirs(OUT, exist_ok=True)
    stem = os.path.join(OUT, f"{args.set}.{args.name}" if args.name else args.set)
    with open(f"{stem}.inserted.en", "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line, _ in rows)
    with open(f"{stem}.inserted.fr", "w", encoding="utf-8") as f:
        f.writelines(r.text + "\n" for r in results)
    with open(f"{stem}.measured.json", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(record, indent=1, ensure_ascii=False))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--make_training", action="store_true", help="Write the masked training pairs.")
    parser.add_argument("--train_src", default=os.path.join(DATA, "train.en.gz"))
    parser.add_argument("--train_tgt", default=os.path.join(HERE, "distillation", "train.ensemble.fr.gz"))
    parser.add_argument("--set", default="val", help="A Multi30k set (file stem under data/multi30k) to measure on.")
    parser.add_argument("--preset", default="multi30k_en_fr")
    parser.add_argument("--model_dir", help="Measure a model directory instead of the preset.")
    parser.add_argument("--checkpoint", default="averaged", help="With --model_dir: its weights (nmt_tf.average).")
    parser.add_argument("--beam_size", type=int, default=5, help="With --model_dir: the beam (a preset: its own).")
    parser.add_argument("--name", default="", help="A name for the measured files (several models on one set).")
    args = parser.parse_args()
    if args.make_training:
        make_training(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
