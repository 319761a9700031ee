r"""Attention (alignment) heatmaps of translations, as in paper 000 Fig. 3.

Usage:
  python -m nmt_tf.visualize --saved_model=exports/nmt/1 --text="A man is riding a bike." --out=attention.png
  python -m nmt_tf.visualize --saved_model=exports/nmt/1 --input=sentences.en --out=heatmaps/ [--logdir=tb/]
  python -m nmt_tf.visualize --model_dir=runs/m30k --text="..."      # a trained model directory works too

Translates each sentence (beam search as exported, or the search flags with
--model_dir) and draws its alignment matrix alpha: source tokens along the x
axis, generated tokens along the y axis, each pixel the weight alpha_ij in
grey scale (black 0, white 1), labelled with the real tokens ([EOS] included).
One sentence (--text) goes to --out as a PNG file; several (--input) go to
--out as a directory of attention_<line>.png. With --logdir the images are
also written as TensorBoard image summaries (tag attention/<line>).

  python -m nmt_tf.visualize --grconv --model_dir=runs/grconv --text="Obama is the president of the United States ."

--grconv draws, for a model with the gated recursive convolutional encoder,
the tree its gates build over each source sentence, as in paper 002 Fig. 6:
words at the bottom, each node above the words it covers, a solid edge to a
child whose copy coefficient (w_l or w_r) exceeds --grconv_threshold (0.1),
dashed edges to both children where the new activation's w_c does; opacity
is the coefficient (grconv_<line>.png, TensorBoard tag grconv/<line>).

  python -m nmt_tf.visualize --representations --model_dir=runs/m30k [--phrases=phrases.txt] --out=maps/

--representations writes the learned representations of paper 004 Figs. 4
and 5 into --out (default representations/): the source word embeddings
and a vector per phrase (RNNencdec: its summary c; RNNsearch: the mean of
the annotations h_j, or s_0 with --phrase_vector=initial_state), each as
TensorBoard Embedding Projector files (<kind>.tsv, <kind>_metadata.tsv,
projector_config.pbtxt: `tensorboard --logdir OUT`) and as a labelled
2-D t-SNE map (<kind>.png, TensorBoard tag representations/<kind>).
--phrases lists the words or phrases, one per line; without it, the
--most_frequent words and 2- to 4-word n-grams of the training source.
See nmt_tf.evaluation.representations.
"""

from __future__ import annotations

import os

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags
from nmt_tf.core.files import InputError, input_lines
from nmt_tf.evaluation.representations import PHRASE_VECTORS, RepresentationError
from nmt_tf.evaluation.visualization import (
    VisualizeError,
    render,
    render_grconv,
    render_representations,
    translate_function,
)
from nmt_tf.inference.client import ClientError

absl_flags.DEFINE_string("text", None, "One sentence to translate and draw.")
absl_flags.DEFINE_string("out", None, "PNG file (--text) or directory (--input, --representations); default "
                         "attention.png / attention/ (grconv.png / grconv/ with --grconv; representations/).")
absl_flags.DEFINE_string("logdir", None, "Also write the heatmaps as TensorBoard images into this log directory.")
absl_flags.DEFINE_boolean("grconv", False, "Instead of attention, draw the structure a grConv encoder learned for each "
                          "sentence (paper 002 Fig. 6; needs --model_dir of a --encoder=grconv model).")
absl_flags.DEFINE_float("grconv_threshold", 0.1, "Gating coefficients above this are drawn as edges (paper: 0.1).")
absl_flags.DEFINE_boolean("representations", False, "Instead of attention, write the learned word and phrase "
                          "representations (paper 004 Figs. 4, 5) into --out: TensorBoard Embedding Projector "
                          "files and labelled t-SNE maps (needs --model_dir).")
absl_flags.DEFINE_string("phrases", None, "--representations: a file of words or phrases, one per line (plain or "
                         "gzip); default: the --most_frequent words and 2- to 4-word n-grams of the model's "
                         "training source.")
absl_flags.DEFINE_enum("phrase_vector", "auto", list(PHRASE_VECTORS),
                       "--representations: the vector of a phrase. summary: RNNencdec's c = tanh(V h_T) (paper 004 "
                       "Fig. 5); mean_annotation: RNNsearch's annotations h_j averaged over the phrase and [EOS]; "
                       "initial_state: the decoder's s_0; auto: summary for RNNencdec, mean_annotation for RNNsearch.")
absl_flags.DEFINE_integer("most_frequent", 200, "--representations without --phrases: how many of the most frequent "
                          "words, and how many frequent n-grams, of the training source to map.", lower_bound=1)
REPRESENTATION_FLAGS = ("phrases", "phrase_vector", "most_frequent")
TOOL_FLAGS = nmt_flags.tool_flags(
    __name__, ("model_dir", "saved_model", "input", "max_input_length", *nmt_flags.WEIGHTS_FLAGS,
               *(name for name in nmt_flags.SEARCH_FLAGS if name not in ("replace_unk", "unk_dictionary"))))


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    try:
        if bool(FLAGS.saved_model) == bool(FLAGS.model_dir):
            raise VisualizeError("give exactly one of --saved_model and --model_dir.")
        if FLAGS.saved_model and nmt_flags.fixed_at_export_given():
            raise VisualizeError(f"--{', --'.join(nmt_flags.fixed_at_export_given())}: "
                                 f"{nmt_flags.FIXED_AT_EXPORT_REASON}, or draw from --model_dir.")
        given = [f"--{name}" for name in REPRESENTATION_FLAGS if FLAGS[name].present]
        if FLAGS.representations:
            if not FLAGS.model_dir:
                raise VisualizeError("--representations needs --model_dir (a SavedModel keeps neither the "
                                     "embeddings nor the encoder's vectors).")
            if FLAGS.text or FLAGS.input or FLAGS.grconv:
                raise VisualizeError("--representations reads its words and phrases from --phrases (or the "
                                     "training source), not --text or --input, and does not go with --grconv.")
            if FLAGS.phrases and FLAGS["most_frequent"].present:
                raise VisualizeError("--most_frequent sizes the default list; it does not go with --phrases.")
            out_dir = FLAGS.out or "representations"
            for item in render_representations(FLAGS.model_dir, nmt_flags.weights_choice(), out_dir, FLAGS.phrases,
                                               FLAGS.phrase_vector, FLAGS.most_frequent, FLAGS.logdir):
                files = ", ".join(f for f in (item["tsv"], item["png"]) if f) or "nothing written"
                print(f"{item['name']}: {item['count']} vectors of width {item['width']} ({item['description']}): "
                      f"{files}")
            print(f"Projector files in {out_dir}: tensorboard --logdir {out_dir}")
            return 0
        if given:
            raise VisualizeError(f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with --representations.")
        if bool(FLAGS.text) == bool(FLAGS.input):
            raise VisualizeError("give exactly one of --text and --input.")
        kind = "grconv" if FLAGS.grconv else "attention"
        if FLAGS.grconv and not FLAGS.model_dir:
            raise VisualizeError("--grconv needs --model_dir (a SavedModel does not carry the encoder's gates).")
        if FLAGS.text:
            sentences, names = [FLAGS.text], ["text"]
            paths = [FLAGS.out or f"{kind}.png"]
        else:
            sentences = [l.decode("utf-8", errors="replace") for l in input_lines(FLAGS.input, "input")]
            names = [f"{i + 1:04d}" for i in range(len(sentences))]
            out_dir = FLAGS.out or kind
            paths = [os.path.join(out_dir, f"{kind}_{n}.png") for n in names]
        if FLAGS.grconv:
            for item in render_grconv(FLAGS.model_dir, nmt_flags.weights_choice(), sentences, names, paths,
                                      FLAGS.grconv_threshold, FLAGS.logdir):
                print(f"{item['path']}: {' '.join(item['tokens'])}")
            return 0
        fn = translate_function(FLAGS.saved_model, FLAGS.model_dir, nmt_flags.decoding_config())
        for item in render(fn, sentences, names, paths, FLAGS.logdir):
            print(f"{item['path']}: {item['translation']}")
    except (VisualizeError, RepresentationError, InputError, ClientError, OSError) as e:
        return nmt_flags.user_error(e)
    return 0


if __name__ == "__main__":
    app.run(main)
