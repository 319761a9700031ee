r"""Fine-tuning measured on a held-out domain of Multi30k (issue 43): sport.

The split (domain_split.py, its rule fixed before any training on it):
base pairs for the base model, sport_train to fine-tune on, sport_dev for
every choice, sport_test for the report only. The general domain is Multi30k
val, which neither touches. ../shared/blind is never used.

The runs (hours of CPU; this script only measures them):

  python pipelines/multi30k_en_fr/domain_split.py --out=runs/sport_split
  python -m nmt_tf.train --flagfile=pipelines/multi30k_en_fr/rnnsearch.flags \
      --train_src=runs/sport_split/base.en.gz --train_tgt=runs/sport_split/base.fr.gz \
      --model_dir=runs/sport_base --max_hours=1.5
  python -m nmt_tf.average --model_dir=runs/sport_base --average_checkpoints=5 --average_from=best
  python -m nmt_tf.train --flagfile=pipelines/multi30k_en_fr/sport_fine_tune.flags \
      --init_from=runs/sport_base --learning_rate=LR --model_dir=runs/sport_ft_LR      # LR = 0.0001, 0.0003
  python -m nmt_tf.average --model_dir=runs/sport_ft_LR --average_checkpoints=5 --average_from=best

then

  python pipelines/multi30k_en_fr/sport_adaptation.py --base=runs/sport_base \
      --tuned=runs/sport_ft_A --tuned=runs/sport_ft_B [--out=pipelines/multi30k_en_fr/fine_tuning/sport.json]

It scores, with nmt_tf.evaluate's beam search (beam 10 and the other
defaults): the base model (its averaged checkpoint, the recipe's choice) on
sport_dev, sport_test and val; every fine-tuned candidate, with its best
checkpoint and with the mean of its 5 best, on sport_dev; and the one of
those that sport_dev prefers on sport_test and val. BLEU of both kinds:
sacreBLEU (with its signature) and lowercased Moses-tokenized, as the
Multi30k papers publish.

Run on 2026-11-27 (Intel Xeon with AMX, bfloat16): fine_tuning/sport.json,
and the table in docs/training.md ("Fine-tuning on your own data").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app
from absl import flags as absl_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

absl_flags.DEFINE_string("split", "runs/sport_split", "Folder domain_split.py wrote.")
absl_flags.DEFINE_string("base", None, "Model directory of the base model (trained without the sport pairs).")
absl_flags.DEFINE_multi_string("tuned", None, "Model directories of the fine-tuned candidates.")
absl_flags.DEFINE_string("out", os.path.join(REPO, "pipelines", "multi30k_en_fr", "fine_tuning", "sport.json"),
                         "Where the results go (JSON).")
FLAGS = absl_flags.FLAGS

WEIGHTS = {"averaged": ["--checkpoint=averaged"], "best": ["--checkpoint=best"]}


def evaluate(model_dir: str, weights: str, name: str) -> dict:
    """nmt_tf.evaluate of one model on one set (val, sport_dev, sport_test); the report's scores."""
    if name == "val":
        src, ref = (os.path.join(REPO, "data", "multi30k", f"val.{lang}.gz") for lang in ("en", "fr"))
    else:
        src, ref = (os.path.join(FLAGS.split, f"{name}.{lang}.gz") for lang in ("en", "fr"))
    out_dir = os.path.join(model_dir, f"eval_{weights}_{name}")
    subprocess.run([sys.executable, "-m", "nmt_tf.evaluate", f"--model_dir={model_dir}", *WEIGHTS[weights],
                    f"--src={src}", f"--ref={ref}", f"--out_dir={out_dir}"], check=True, cwd=REPO,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "report.json"), encoding="utf-8") as f:
        scores = json.load(f)["all"]
    return {key: scores[key] for key in ("sentences", "bleu", "bleu_signature", "bleu_lc_moses",
                                         "bleu_lc_moses_signature")}


def training(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "train_summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    return {key: summary[key] for key in ("status", "steps", "epochs", "train_seconds", "target_tokens_per_sec")}


def main(argv):
    del argv
    results = {"split": FLAGS.split, "base": {"model_dir": FLAGS.base, "weights": "averaged",
                                             "training": training(FLAGS.base)}}
    for name in ("sport_dev", "sport_test", "val"):
        results["base"][name] = evaluate(FLAGS.base, "averaged", name)
    candidates = []
    for model_dir in FLAGS.tuned or []:
        for weights in WEIGHTS:
            dev = evaluate(model_dir, weights, "sport_dev")
            candidates.append({"model_dir": model_dir, "weights": weights, "training": training(model_dir),
                               "sport_dev": dev})
            print(f"{model_dir} ({weights}): sport_dev {dev['bleu']:.2f} / {dev['bleu_lc_moses']:.2f}")
    chosen = max(candidates, key=lambda c: c["sport_dev"]["bleu"])
    for name in ("sport_test", "val"):
        chosen[name] = evaluate(chosen["model_dir"], chosen["weights"], name)
    results.update(candidates=candidates, chosen=chosen)
    os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
    with open(FLAGS.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(f"{'':28} {'sport_dev':>15} {'sport_test':>15} {'val':>15}   (sacreBLEU / lc Moses-tok)")
    for label, row in (("base", results["base"]), (f"fine-tuned ({chosen['weights']})", chosen)):
        print(f"{label:28} " + " ".join(f"{row[n]['bleu']:6.2f} / {row[n]['bleu_lc_moses']:6.2f}"
                                        for n in ("sport_dev", "sport_test", "val")))
    print(f"written to {FLAGS.out}")


if __name__ == "__main__":
    absl_flags.mark_flags_as_required(["base", "tuned"])
    app.run(main)
