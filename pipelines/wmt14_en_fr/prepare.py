#!/usr/bin/env python3
r"""Prepares the WMT'14 English-French files you downloaded for the paper's recipes.

  python pipelines/wmt14_en_fr/prepare.py --out_dir=data/wmt14_en_fr \
      --train=europarl-v7.fr-en.en,europarl-v7.fr-en.fr \
      --train=commoncrawl.fr-en.en,commoncrawl.fr-en.fr \
      --train=news-commentary-v9.fr-en.en,news-commentary-v9.fr-en.fr \
      --train=undoc.2000.fr-en.en,undoc.2000.fr-en.fr \
      --train=giga-fren.release2.fixed.en.gz,giga-fren.release2.fixed.fr.gz \
      --dev=newstest2012.en,newstest2012.fr --dev=newstest2013.en,newstest2013.fr \
      --test=newstest2014-fren-src.en.sgm,newstest2014-fren-ref.fr.sgm

Writes OUT_DIR/{train,dev,test}.{en,fr}.gz: the given parallel files of each
split concatenated in order, one sentence per line, UTF-8. Inputs may be
plain, gzip, or WMT's SGML (`<seg id=...>` lines; entities unescaped). Each
pair must have equal line counts (else an error naming both files and both
counts). Nothing is tokenized, filtered or cut here: the paper's Moses-style
tokenization, the 30 / 50-word length filters (--max_len) and the 30,000-word
shortlists (--src_vocab_size / --tgt_vocab_size) are applied by
nmt_tf.train, in the graph, from the flagfiles beside this script, so that an
exported model reads raw text exactly as it was trained on. Only the standard
library is used; the files stream through (memory does not grow with them).

The paper trained on a 348M-word selection of these corpora (Axelrod et al.,
2011, as distributed with Cho et al. 2014a); pass that selection as --train
instead of the full corpora to match it.
"""

from __future__ import annotations

import argparse
import gzip
import html
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from nmt_tf.core.files import open_binary  # noqa: E402  (TensorFlow-free)

_SEG = re.compile(rb"<seg[^>]*>(.*)</seg>", re.IGNORECASE)


class PrepareError(ValueError):
    pass


def _open(path: str):
    if not os.path.exists(path):
        raise PrepareError(f"{path} does not exist.")
    return open_binary(path)


def sentences(path: str):
    """Lines of a plain / gzip file, or the segments of an SGML file, as UTF-8 text."""
    is_sgml = path.endswith((".sgm", ".sgm.gz", ".sgml"))
    with _open(path) as f:
        for raw in f:
            if is_sgml:
                match = _SEG.search(raw)
                if not match:
                    continue
                raw = html.unescape(match.group(1).decode("utf-8", errors="replace")).encode("utf-8")
            yield raw.rstrip(b"\r\n").replace(b"\r", b" ")


def count(path: str) -> int:
    return sum(1 for _ in sentences(path))


def write_split(pairs: list[tuple[str, str]], out_dir: str, split: str, langs=("en", "fr"), log=print) -> int:
    """Concatenates the (source, target) file pairs into OUT_DIR/split.{en,fr}.gz; returns the line count."""
    for src, tgt in pairs:
        n_src, n_tgt = count(src), count(tgt)
        if n_src != n_tgt:
            raise PrepareError(f"{src} has {n_src:,} sentences but {tgt} has {n_tgt:,}.")
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f"{split}.{lang}.gz") for lang in langs]
    total = 0
    tmp = [p + ".tmp" for p in paths]
    with gzip.open(tmp[0], "wb") as out_src, gzip.open(tmp[1], "wb") as out_tgt:
        for src, tgt in pairs:
            n = 0
            for a, b in zip(sentences(src), sentences(tgt)):
                out_src.write(a + b"\n")
                out_tgt.write(b + b"\n")
                n += 1
            log(f"  {split}: {n:,} pairs from {src} / {tgt}")
            total += n
    for t, p in zip(tmp, paths):
        os.replace(t, p)
    log(f"{split}: {total:,} pairs -> {paths[0]}, {paths[1]}")
    return total


def _pair(value: str) -> tuple[str, str]:
    parts = value.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected SOURCE_FILE,TARGET_FILE, got {value!r}")
    return parts[0], parts[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default="data/wmt14_en_fr", help="where {train,dev,test}.{en,fr}.gz go")
    for split in ("train", "dev", "test"):
        parser.add_argument(f"--{split}", type=_pair, action="append", default=[],
                            help=f"SOURCE_FILE,TARGET_FILE of the {split} split (repeat to concatenate)")
    args = parser.parse_args(argv)
    if not args.train:
        parser.error("give at least one --train SOURCE,TARGET pair")
    try:
        for split in ("train", "dev", "test"):
            if getattr(args, split):
                write_split(getattr(args, split), args.out_dir, split)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
