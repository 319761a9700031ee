r"""Sequence-level knowledge distillation (Kim & Rush 2016) for Multi30k En→Fr, issue 92.

Teachers are models of `rnnsearch.flags` with different seeds; the shipped
preset's averaged weights (r10, seed 1234) count as one. Each step writes
into pipelines/multi30k_en_fr/distillation/ and can be rerun alone:

  # 1. a teacher (the recipe with another seed; 1.8 hours of training, resumable)
  python -m nmt_tf.train --flagfile=pipelines/multi30k_en_fr/rnnsearch.flags --seed=2 --model_dir=runs/teacher_s2

  # 2. its beam-10 translation of the training source, committed (a teacher's model is lost with the
  #    machine; its translation is what the student needs), with its val score
  python pipelines/multi30k_en_fr/distill.py translate --teacher=runs/teacher_s2 --name=s2
  python pipelines/multi30k_en_fr/distill.py translate --teacher=preset --name=r10

  # 3. the ensemble's translation, when all the teachers are on one machine; with the preset, each
  #    trained teacher's 5 best checkpoints averaged first into its averaged/
  python -m nmt_tf.average --model_dir=runs/teacher_s2 --average_checkpoints=5
  python pipelines/multi30k_en_fr/distill.py translate --teacher=preset --teacher=runs/teacher_s2 \
      --teacher=runs/teacher_s3 --name=ensemble

Each translation is distillation/train.<name>.fr.gz (one line per line of
data/multi30k/train.en.gz, in order), beside distillation/<name>.json: the
teacher, its weights, the search, the time it took, the CPU flags, and its
val BLEU at beam 10 (sacreBLEU 13a and lowercased Moses-tokenized), chosen
on nothing (val is only reported here; the student is chosen on val).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "distillation")
TRAIN_SOURCE = os.path.join(REPO, "data", "multi30k", "train.en.gz")
VAL = (os.path.join(REPO, "data", "multi30k", "val.en.gz"), os.path.join(REPO, "data", "multi30k", "val.fr.gz"))


def cpu_flags() -> str:
    sys.path.insert(0, REPO)
    from nmt_tf.core.hardware import vector_flags

    return " ".join(vector_flags())


def export_teachers(teachers: list[str], export_dir: str, beam: int) -> str:
    """One SavedModel of the teachers (an ensemble when several), beam `beam`,
    n-best 1; "preset" is the shipped model's averaged weights."""
    sys.path.insert(0, REPO)
    from nmt_tf import presets

    model_dirs = []
    for teacher in teachers:
        if teacher == "preset":
            saved_model = presets.build("multi30k_en_fr", log=lambda *a: print(*a, file=sys.stderr))
            model_dirs.append((os.path.join(os.path.dirname(os.path.dirname(saved_model)), "model"), "averaged"))
        else:          # its averaged/ (python -m nmt_tf.average) when it has one, else its 5 best averaged here
            model_dirs.append((teacher, "averaged" if os.path.isdir(os.path.join(teacher, "averaged")) else None))
    averaged = {choice for _, choice in model_dirs}
    command = [sys.executable, "-m", "nmt_tf.export", f"--model_dir={model_dirs[0][0]}",
               *[f"--ensemble={d}" for d, _ in model_dirs[1:]], f"--export_dir={export_dir}",
               f"--beam_size={beam}", "--n_best=1"]
    # The preset's model directory holds its averaged weights; a trained teacher, its 5 best to average.
    command += ["--checkpoint=averaged"] if averaged == {"averaged"} else ["--average_checkpoints=5"]
    if averaged == {"averaged", None}:
        raise SystemExit("an ensemble of the preset and trained teachers: give each teacher as a model directory "
                         "whose averaged/ holds its weights (python -m nmt_tf.average)")
    subprocess.run(command, check=True, cwd=REPO)
    return os.path.join(export_dir, "1")


def translate(saved_model: str, source: str, output: str) -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "nmt_tf.translate", f"--saved_model={saved_model}", f"--input={source}",
                    f"--output={output}", "--lines_per_batch=64"], check=True, cwd=REPO)
    return time.monotonic() - start


def bleu(hypotheses: str, reference: str) -> dict:
    sys.path.insert(0, REPO)
    from nmt_tf.evaluation.metrics import corpus_scores

    with open(hypotheses, encoding="utf-8") as f:
        hyp = f.read().splitlines()
    with gzip.open(reference, "rt", encoding="utf-8") as f:
        ref = f.read().splitlines()
    scores = corpus_scores(hyp, ref, "fr")
    return {"sacrebleu_13a": round(scores["bleu"], 2), "lc_moses_tok": round(scores["bleu_lc_moses"], 2),
            "signature": scores["bleu_signature"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["translate"])
    parser.add_argument("--teacher", action="append", required=True,
                        help="A teacher's model directory (its 5 best checkpoints averaged), or 'preset'; repeat "
                             "for an ensemble.")
    parser.add_argument("--name", required=True, help="Names the outputs: distillation/train.NAME.fr.gz.")
    parser.add_argument("--beam_size", type=int, default=10)
    args = parser.parse_args()
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        saved_model = export_teachers(args.teacher, os.path.join(tmp, "export"), args.beam_size)
        val_out = os.path.join(tmp, "val.fr")
        val_seconds = translate(saved_model, VAL[0], val_out)
        scores = bleu(val_out, VAL[1])
        print(f"val: {scores}", file=sys.stderr)
        train_out = os.path.join(tmp, "train.fr")
        seconds = translate(saved_model, TRAIN_SOURCE, train_out)
        with open(train_out, "rb") as f, gzip.open(os.path.join(OUT, f"train.{args.name}.fr.gz"), "wb") as out:
            data = f.read()
            out.write(data)
    lines = data.count(b"\n")
    with gzip.open(TRAIN_SOURCE, "rb") as f:
        expected = f.read().count(b"\n")
    if lines != expected:
        raise SystemExit(f"{lines} lines translated, the source has {expected}")
    record = {"teachers": args.teacher, "beam_size": args.beam_size, "val_beam": scores,
              "train_lines": lines, "train_seconds": round(seconds, 1), "val_seconds": round(val_seconds, 1),
              "cpu_flags": cpu_flags(), "date": time.strftime("%Y-%m-%d")}
    with open(os.path.join(OUT, f"{args.name}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
