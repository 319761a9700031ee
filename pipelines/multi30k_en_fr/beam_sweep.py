r"""BLEU and speed of one model at several beam sizes (issues 91 and 92).

  python pipelines/multi30k_en_fr/beam_sweep.py --name=r10                       # the shipped preset
  python pipelines/multi30k_en_fr/beam_sweep.py --name=student --model_dir=runs/student --checkpoint=averaged
  python pipelines/multi30k_en_fr/beam_sweep.py --name=r10 --sets=val,test_2016_flickr,test_2017_flickr \
      --no-speed         # the test sets: only after the served beam was chosen on val

For each beam size (--beams, default 1,2,3,5,10) the model is exported with
the preset's other search settings (length penalty, limits; n-best 1) as a
SavedModel and as a LiteRT int8 folder into a temporary directory. Each set
is translated by both (batches of 64 sentences of similar length) and scored
(sacreBLEU 13a and lowercased Moses-tokenized BLEU, nmt_tf.evaluation.metrics;
three decimals, so that a rule such as "at most 0.1 below beam 10" is decided
on the scores, not on their rounding);
the LiteRT lines that differ from the SavedModel's are counted. Then, unless
--no-speed, benchmarks/decode_speed.py --compare measures the sentences/s of
all the folders side by side in one run on test 2016 (one sentence at a time
for the first 200 sentences, and batches of 64 sorted by length; --runs
runs, the median). Choose the served beam on val only.

--shortlist_size=C searches over a per-batch vocabulary shortlist of at
least C target tokens (the model directory needs its lexical table:
`python -m nmt_tf.shortlist --model_dir=...`; SavedModel only, since a
LiteRT export has no shortlist yet, so the LiteRT column is left out):

  python -m nmt_tf.shortlist --model_dir=runs/preset_model      # a copy of the preset's model/ folder
  python pipelines/multi30k_en_fr/beam_sweep.py --name=r10_shortlist1000 --model_dir=runs/preset_model \
      --beams=5 --shortlist_size=1000 --no-speed

Writes beams/<name>.json beside this script (the figures, the CPU flags, the
date) and prints a table.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
DATA = os.path.join(REPO, "data", "multi30k")
OUT = os.path.join(HERE, "beams")
RUNTIMES = ("savedmodel", "litert")


def read(path: str) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def exports(model_dir: str, checkpoint: str, settings: dict, beams: list[int], where: str,
            runtimes=RUNTIMES) -> dict:
    """{(runtime, beam): folder} of a SavedModel and a LiteRT int8 export per beam (`runtimes`)."""
    from nmt_tf import config as nmt_config
    from nmt_tf.exporting.litert import export_litert
    from nmt_tf.exporting.saved_model import export

    folders = {}
    for beam in beams:
        search = {k: v for k, v in settings.items() if k not in ("max_input_length", "max_beam_size")}
        search.update(beam_size=beam, n_best=1)
        config = nmt_config.ExportConfig(nmt_config.SearchOptions(**search), weights=checkpoint,
                                         max_input_length=settings["max_input_length"])
        for runtime, write in (("savedmodel", export), ("litert", functools.partial(export_litert, weights="int8"))):
            if runtime not in runtimes:
                continue
            folder = os.path.join(where, f"{runtime}-{beam}")
            if not os.path.isdir(os.path.join(folder, "1")):         # else kept in --work_dir by an earlier run
                write(model_dir, folder, config, version=1, log=lambda *a: None)
            folders[runtime, beam] = os.path.join(folder, "1")
    return folders


def translations(runtime: str, folder: str, lines: list[str]) -> tuple[list[str], float]:
    from nmt_tf.inference.line_batches import translate_lines

    if runtime == "litert":
        from nmt_tf.inference.litert_runtime import LiteRTClient
        client = LiteRTClient(folder, outputs=["translation", "source_tokens", "target_tokens"], num_threads=1)
        call = client
    else:
        from nmt_tf.inference.client import SignatureClient
        client = SignatureClient(saved_model=folder, outputs=["translation", "source_tokens", "target_tokens"])
        call = lambda batch: client(text=batch)          # noqa: E731
    start = time.monotonic()
    out = translate_lines(call, lines, batch_size=64, keys=("translation",), parallel_batches=1)
    return out["translation"], time.monotonic() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="Names the output: beams/NAME.json.")
    parser.add_argument("--model_dir", help="A model directory (default: the shipped preset's, built on first use).")
    parser.add_argument("--checkpoint", default="averaged", help="Its weights (nmt_tf.export --checkpoint).")
    parser.add_argument("--beams", default="1,2,3,5,10")
    parser.add_argument("--sets", default="val", help="Comma-separated Multi30k sets (file stems under data/multi30k).")
    parser.add_argument("--speed", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--shortlist_size", type=int, default=0, help="Search over a per-batch shortlist of at least "
                        "this many target tokens (SavedModel only; needs the model directory's lexical table).")
    parser.add_argument("--work_dir", help="Keep the exports here and reuse those already there (default: a "
                        "temporary directory): a later run can measure the speed alone with --sets=.")
    args = parser.parse_args()
    from nmt_tf import presets
    from nmt_tf.core.hardware import vector_flags
    from nmt_tf.evaluation.metrics import corpus_scores

    manifest = presets.read_manifest(presets.preset_dir("multi30k_en_fr"))
    model_dir = args.model_dir
    if model_dir is None:
        saved_model = presets.build("multi30k_en_fr", log=lambda *a: print(*a, file=sys.stderr))
        model_dir = os.path.join(os.path.dirname(os.path.dirname(saved_model)), "model")
    beams = [int(b) for b in args.beams.split(",")]
    sets = [name for name in args.sets.split(",") if name]
    settings = dict(manifest["export"])
    runtimes = RUNTIMES
    if args.shortlist_size:
        settings["shortlist_size"] = args.shortlist_size
        runtimes = ("savedmodel",)
    record = {"name": args.name, "model_dir": args.model_dir or "preset multi30k_en_fr", "checkpoint": args.checkpoint,
              "search": {k: v for k, v in settings.items() if k not in ("beam_size", "n_best")},
              "cpu_flags": " ".join(vector_flags()),
              "date": time.strftime("%Y-%m-%d %H:%M"), "quality": {}, "speed": None}
    with tempfile.TemporaryDirectory() as tmp:
        folders = exports(model_dir, args.checkpoint, settings, beams, args.work_dir or tmp, runtimes)
        for name in sets:
            sources, references = read(os.path.join(DATA, f"{name}.en.gz")), read(os.path.join(DATA, f"{name}.fr.gz"))
            for beam in beams:
                row = {}
                outputs = {}
                for runtime in runtimes:
                    outputs[runtime], seconds = translations(runtime, folders[runtime, beam], sources)
                    scores = corpus_scores(outputs[runtime], references, "fr")
                    row[runtime] = {"sacrebleu_13a": round(scores["bleu"], 3),
                                    "lc_moses_tok": round(scores["bleu_lc_moses"], 3), "seconds": round(seconds, 1)}
                    row["signature"] = scores["bleu_signature"]
                if "litert" in outputs:
                    row["litert_lines_differ"] = sum(a != b for a, b in zip(outputs["savedmodel"], outputs["litert"]))
                record["quality"].setdefault(name, {})[beam] = row
                print(f"{name} beam {beam}: {json.dumps(row)}", file=sys.stderr)
        if args.speed:
            # one sentence at a time: the first 200 of test 2016 in file order; files: batches of 64 by length
            compare = ",".join(folders[runtime, beam] for beam in beams for runtime in runtimes)
            names = {folders[key]: f"{key[0]}-{key[1]}" for key in folders}
            record["speed"] = {}
            for options in (["--batch_sizes=1", "--limit_batch1=200"], ["--batch_sizes=64", "--sort_by_length"]):
                done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "decode_speed.py"),
                                       f"--compare={compare}", *options, f"--runs={args.runs}", "--litert_threads=1"],
                                      check=True, cwd=REPO, capture_output=True, text=True)
                speed = _renamed(json.loads(done.stdout.strip().splitlines()[-1]), names)
                record["speed"].setdefault("configs", {}).update(speed.pop("configs"))
                record["speed"].update(speed)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"{args.name}.json")
    if os.path.exists(path):             # a later run of other sets adds to the record
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        old["quality"].update(record["quality"])
        record = {**old, **{k: v for k, v in record.items() if k != "quality" and v is not None},
                  "quality": old["quality"]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    print(json.dumps(record, indent=2))


def _renamed(value, names: dict):
    """decode_speed's JSON with the temporary folders' paths replaced by runtime-beam names."""
    if isinstance(value, dict):
        return {_renamed(k, names): _renamed(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, names) for v in value]
    if isinstance(value, str):
        for path, name in names.items():
            value = value.replace(path, name)
    return value


if __name__ == "__main__":
    main()
