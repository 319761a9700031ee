r"""Lists, builds and creates presets: trained models shipped ready to translate.

Usage:
  python -m nmt_tf.presets --list
  python -m nmt_tf.presets --build=multi30k_en_fr       # `make setup` runs this
  python -m nmt_tf.presets --build_litert=multi30k_en_fr [--litert_weights=int8]
  python -m nmt_tf.presets --create=presets/my_model --name=my_model --model_dir=runs/m30k \
      --average_checkpoints=5 [--weights_dtype=float16] [--beam_size=10 --n_best=5 --max_input_length=100]
  python -m nmt_tf.presets --measure_checks=presets/my_model \
      --bleu_src=data/multi30k/test_2016_flickr.en.gz --bleu_ref=data/multi30k/test_2016_flickr.fr.gz \
      --pairs_src=data/multi30k/val.en.gz --pairs_tgt=data/multi30k/val.fr.gz [--pairs=12]

--build checks the SHA-256 of every file of the preset, writes its model
directory and exports its SavedModel into the cache (NMT_TF_CACHE, else
~/.cache/nmt_tf), once, and prints the SavedModel's path; then
`nmt_tf.translate --preset=NAME`, `nmt_tf.serve --preset=NAME` and
`nmt_tf.Translator.from_preset(NAME)` use it without training.
--build_litert does the same for its LiteRT model (docs/litert.md), built
from that SavedModel with --litert_weights, and prints the LiteRT folder;
the tools run it in a child process on first use with --runtime=litert, so
that they never import TensorFlow themselves. --create
writes a preset of a trained model directory (its --checkpoint or the mean
of --average_checkpoints, weights stored in --weights_dtype; the search
flags and --max_input_length are what its SavedModel will be exported with;
--n_best defaults to 5 here). --measure_checks translates --bleu_src with
the preset's SavedModel and scores the first --pairs lines of --pairs_src /
--pairs_tgt, writes what it measured (lc Moses-tok BLEU against --bleu_ref,
log-probabilities) as the preset's checks.json, the figures
tests/test_model_of_record.py holds a model of record to, and prints the
model card's table of files with their SHA-256. A flag that only another
mode reads (a search flag with --measure_checks, say) is an error rather
than ignored. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags
from nmt_tf import presets
from nmt_tf.presets import measure

absl_flags.DEFINE_boolean("list", False, "List the shipped presets with their languages and size.")
absl_flags.DEFINE_string("build", None, "Build (or find in the cache) the SavedModel of this preset and print its path.")
absl_flags.DEFINE_string("create", None, "Write a preset of --model_dir into this folder.")
absl_flags.DEFINE_string("name", None, "With --create: the preset's name (default: the folder's name).")
absl_flags.DEFINE_enum("weights_dtype", "float16", list(presets.WEIGHT_DTYPES),
                       "With --create: how the weights are stored (the model computes in float32 either way).")
absl_flags.DEFINE_string("description", "", "With --create: one line saying what the model is.")
absl_flags.DEFINE_string("measure_checks", None, "Measure this preset (a name or folder) and write its checks.json.")
absl_flags.DEFINE_string("bleu_src", None, "With --measure_checks: the source side of the test set to translate.")
absl_flags.DEFINE_string("bleu_ref", None, "With --measure_checks: its reference translations (raw, line-aligned).")
absl_flags.DEFINE_string("pairs_src", None,
                         "With --measure_checks: sources of the pairs to score (default --bleu_src).")
absl_flags.DEFINE_string("pairs_tgt", None, "With --measure_checks: their targets (default --bleu_ref).")
absl_flags.DEFINE_integer("pairs", 12, "With --measure_checks: how many pairs (the files' first lines) to score.")

absl_flags.DEFINE_string("build_litert", None, "Build (or find in the cache) the LiteRT model of this preset "
                         "(with --litert_weights) and print its folder.")

MODES = ("list", "build", "build_litert", "create", "measure_checks")
# nmt_tf.flags' flags that --create reads: the model and what its SavedModel is exported with.
CREATE_SETTINGS = ("model_dir", "max_input_length", *nmt_flags.SEARCH_FLAGS, *nmt_flags.WEIGHTS_FLAGS)
TOOL_FLAGS = nmt_flags.tool_flags(__name__, (*CREATE_SETTINGS, "litert_weights"))
# The flags only one mode reads; given with another mode they would be ignored, so they are an error.
MODE_FLAGS = {
    "create": ("name", "weights_dtype", "description", *CREATE_SETTINGS),
    "measure_checks": ("bleu_src", "bleu_ref", "pairs_src", "pairs_tgt", "pairs"),
    "build_litert": ("litert_weights",),
}


def flags_of_another_mode(mode: str) -> str | None:
    """One sentence naming the flags given on the command line that only a
    mode other than `mode` reads (None when there are none)."""
    FLAGS = absl_flags.FLAGS
    parts = []
    for other, names in MODE_FLAGS.items():
        given = [f"--{name}" for name in names if other != mode and FLAGS[name].present]
        if given:
            parts.append(f"{', '.join(given)} only with --{other}")
    if not parts:
        return None
    why = (" (a preset's SavedModel searches with the settings it was created with)"
           if mode == "measure_checks" and any(FLAGS[n].present for n in nmt_flags.SEARCH_FLAGS) else "")
    return f"--{mode} does not read every flag given: {'; '.join(parts)}{why}."


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    modes = [name for name in MODES if FLAGS[name].value]
    if len(modes) != 1:
        return nmt_flags.user_error("give one of --list, --build=NAME, --build_litert=NAME, --create=FOLDER and "
                                    "--measure_checks=NAME.")
    unread = flags_of_another_mode(modes[0])
    if unread:
        return nmt_flags.user_error(unread)
    try:
        if FLAGS.list:
            for name in presets.available():
                manifest = presets.read_manifest(presets.preset_dir(name))
                print(f"{name}\t{manifest['src_lang']}->{manifest['tgt_lang']}\t{manifest['model']}\t"
                      f"{manifest['parameters']:,} parameters\t{manifest.get('description', '')}")
        elif FLAGS.build:
            print(presets.build(FLAGS.build, log=lambda *a: print(*a, file=sys.stderr)))
        elif FLAGS.build_litert:
            print(presets.build_litert(FLAGS.build_litert, FLAGS.litert_weights,
                                       log=lambda *a: print(*a, file=sys.stderr)))
        elif FLAGS.measure_checks:
            if not (FLAGS.bleu_src and FLAGS.bleu_ref):
                return nmt_flags.user_error("--measure_checks needs --bleu_src and --bleu_ref.")
            measure.measure_checks(FLAGS.measure_checks, FLAGS.bleu_src, FLAGS.bleu_ref,
                                   FLAGS.pairs_src or FLAGS.bleu_src, FLAGS.pairs_tgt or FLAGS.bleu_ref, FLAGS.pairs,
                                   log=lambda *a: print(*a, file=sys.stderr))
            print(presets.files_table(FLAGS.measure_checks))
        else:
            if not FLAGS.model_dir:
                return nmt_flags.user_error("--create needs --model_dir.")
            options = nmt_flags.search_options()
            settings = {**dataclasses.asdict(options), "max_input_length": FLAGS.max_input_length}
            if not FLAGS["n_best"].present:
                settings["n_best"] = min(5, options.beam_size)
            presets.create(FLAGS.model_dir, FLAGS.create, FLAGS.name or os.path.basename(
                os.path.normpath(FLAGS.create)), nmt_flags.weights_choice(), FLAGS.weights_dtype, settings,
                FLAGS.description)
    except (OSError, ValueError) as e:      # PresetError, FileNotFoundError, a damaged file
        return nmt_flags.user_error(e)
    return 0


if __name__ == "__main__":
    app.run(main)
