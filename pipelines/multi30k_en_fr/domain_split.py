r"""A held-out domain of Multi30k for measuring fine-tuning (issue 43): sport.

  python pipelines/multi30k_en_fr/domain_split.py --out=runs/sport_split

The rule, written down before any model was trained on the split: a
training pair is in the sport domain when its English side holds, as a
whole word in any case, one of SPORT_WORDS (team, racket, combat and board
sports and their players). Of the 29,000 training pairs 2,246 are (7.7 %).

Writes to --out (gzip, line-aligned):
  base.{en,fr}.gz          the 26,754 other pairs: the base model's training data
  sport_train.{en,fr}.gz   sport pairs 2-5 of every 6 (in corpus order): fine-tuning data
  sport_dev.{en,fr}.gz     sport pair 1 of every 6: choices (checkpoints, epochs)
  sport_test.{en,fr}.gz    sport pair 0 of every 6: the report only
  split.json               the rule and the counts
The general domain is measured on Multi30k val (data/multi30k/val.*), which
neither part of the split touches.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys

from absl import app
from absl import flags as absl_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPORT_WORDS = (
    "soccer football footballs basketball basketballs baseball baseballs tennis volleyball hockey rugby golf "
    "golfer golfers lacrosse softball cricket boxing boxer boxers wrestling wrestler wrestlers karate skateboard "
    "skateboards skateboarder skateboarders skateboarding surfer surfers surfing surfboard surfboards skier skiers "
    "skiing snowboard snowboarder snowboarders snowboarding bmx motocross").split()
PATTERN = re.compile(rf"\b({'|'.join(SPORT_WORDS)})\b", re.IGNORECASE)

absl_flags.DEFINE_string("out", None, "Folder to write the split into.")


def read(name: str) -> list[str]:
    with gzip.open(os.path.join(REPO, "data", "multi30k", name), "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def write(path: str, lines: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def split(en: list[str], fr: list[str]) -> dict:
    """{part: (English lines, French lines)} by the rule of the module docstring."""
    parts = {name: ([], []) for name in ("base", "sport_train", "sport_dev", "sport_test")}
    sport = 0
    for source, target in zip(en, fr):
        if PATTERN.search(source):
            name = {0: "sport_test", 1: "sport_dev"}.get(sport % 6, "sport_train")
            sport += 1
        else:
            name = "base"
        parts[name][0].append(source)
        parts[name][1].append(target)
    return parts


def main(argv):
    out = absl_flags.FLAGS.out
    if not out:
        print("--out is required", file=sys.stderr)
        return 1
    os.makedirs(out, exist_ok=True)
    parts = split(read("train.en.gz"), read("train.fr.gz"))
    for name, (en, fr) in parts.items():
        write(os.path.join(out, f"{name}.en.gz"), en)
        write(os.path.join(out, f"{name}.fr.gz"), fr)
    counts = {name: len(en) for name, (en, _) in parts.items()}
    with open(os.path.join(out, "split.json"), "w", encoding="utf-8") as f:
        json.dump({"rule": "English side holds one of sport_words (whole word, any case)",
                   "sport_words": SPORT_WORDS, "pairs": counts}, f, indent=1)
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    app.run(main)
