"""Pictures of what a model learned: the library behind `python -m
nmt_tf.visualize` (whose help describes each picture), usable from Python
without command-line flags:

    from nmt_tf.evaluation import visualization
    translate = visualization.translate_function(saved_model="exports/nmt/1")
    visualization.render(translate, ["A man is riding a bike."], ["one"], ["attention.png"])

`render` draws attention heatmaps (paper 000 Fig. 3), `render_grconv` the
trees a grConv encoder's gates build (paper 002 Fig. 6) and
`render_representations` the word and phrase maps of paper 004 Figs. 4
and 5; each writes PNG files and, given a log directory, TensorBoard images.
The drawing itself is nmt_tf.evaluation.plots, the vectors nmt_tf.evaluation.representations.
"""

from __future__ import annotations

import os

from nmt_tf.config import DecodingConfig
from nmt_tf.data.lexicon import for_search
from nmt_tf.evaluation import plots
from nmt_tf.evaluation import representations as reps
from nmt_tf.inference.client import SignatureClient
from nmt_tf.inference.line_batches import translate_lines
from nmt_tf.inference.restore import restore_model
from nmt_tf.inference.translation_graph import TranslationGraph, UnkReplacement, compiled_translate


class VisualizeError(ValueError):
    """A problem with the user's flags or files, in one sentence."""


def translate_function(saved_model: str | None = None, model_dir: str | None = None,
                       decoding: DecodingConfig | None = None):
    """[batch] string -> the serving signature's outputs, from a SavedModel (as
    exported) or a model directory (decoded as `decoding` says: which weights,
    the search, the longest input, the precision; default DecodingConfig())."""
    if saved_model:
        client = SignatureClient(saved_model=saved_model)
        return lambda lines: client(text=lines)
    decoding = decoding or DecodingConfig()
    model, src_tok, tgt_tok = restore_model(model_dir, decoding.weights, log=lambda *a: None,
                                            precision=decoding.precision)[:3]
    return compiled_translate(TranslationGraph(model, src_tok, tgt_tok, decoding.search, decoding.max_input_length,
                                               UnkReplacement.of(decoding),
                                               shortlist=for_search(model_dir, model, decoding.search)))


def _save(png: bytes, path: str, writer, tag: str, description: str) -> None:
    """Writes one picture to `path` and, with a summary writer, as a TensorBoard image."""
    import tensorflow as tf

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(png)
    if writer is not None:
        with writer.as_default(step=0):
            tf.summary.image(tag, plots.png_to_tensor(png), description=description)


def render(translate_fn, sentences: list[str], names: list[str], out_paths: list[str],
           logdir: str | None = None) -> list[dict]:
    """Translates `sentences`, writes one heatmap PNG each; returns what was drawn."""
    import tensorflow as tf

    out = translate_lines(translate_fn, sentences, batch_size=16)
    drawn = []
    writer = tf.summary.create_file_writer(logdir) if logdir else None
    for i, (name, path) in enumerate(zip(names, out_paths)):
        png = plots.attention_png(out["source_tokens"][i], out["target_tokens"][i], out["alignment"][i],
                                  title=out["translation"][i][:100])
        _save(png, path, writer, f"attention/{name}", f"{sentences[i]} -> {out['translation'][i]}")
        drawn.append({"path": path, "translation": out["translation"][i],
                      "source_tokens": out["source_tokens"][i], "target_tokens": out["target_tokens"][i]})
    if writer is not None:
        writer.flush()
    return drawn


def render_grconv(model_dir: str, checkpoint, sentences: list[str], names: list[str], out_paths: list[str],
                  threshold: float = 0.1, logdir: str | None = None) -> list[dict]:
    """Draws the grConv structure of each sentence; returns what was drawn."""
    import tensorflow as tf

    from nmt_tf.data.text import EOS

    model, src_tok = restore_model(model_dir, checkpoint, log=lambda *a: None)[:2]
    if getattr(model, "encoder_type", None) != "grconv":
        raise VisualizeError(f"{model_dir} is not a grConv model (train with --model=rnnencdec --encoder=grconv).")
    writer = tf.summary.create_file_writer(logdir) if logdir else None
    drawn = []
    for sentence, name, path in zip(sentences, names, out_paths):
        ids, (tokens,) = reps.source_batch(src_tok, [sentence])
        labels = tokens + [EOS]
        gates = model.encode(ids, return_gates=True)["gates"].numpy()[:, 0]
        png = plots.grconv_tree_png(labels, gates, threshold, title=f"grConv structure: {sentence[:80]}")
        _save(png, path, writer, f"grconv/{name}", sentence)
        drawn.append({"path": path, "tokens": labels, "gates": gates})
    if writer is not None:
        writer.flush()
    return drawn


def _length_group(words: int) -> str:
    """Legend entry of a phrase of `words` words on the phrase map (paper 004 Fig. 5 shows 4 or more)."""
    return "4+ words" if words >= 4 else f"{words} word{'s' if words > 1 else ''}"


def render_representations(model_dir: str, checkpoint, out_dir: str, phrases: str | None = None,
                           phrase_vector: str = "auto", most_frequent: int = 200, logdir: str | None = None,
                           log=print) -> list[dict]:
    """Writes paper 004's representation maps (Figs. 4, 5) of a model into `out_dir`.

    For the words and phrases of the file `phrases` (default: the
    `most_frequent` words and n-grams of the training source), computes the
    source word embeddings and the phrase vectors (`phrase_vector`, see
    nmt_tf.evaluation.representations), writes them as TensorBoard projector files and
    draws each kind with 3 or more points as a t-SNE map <kind>.png (also a
    TensorBoard image under `logdir`). Notes on what was left out go to `log`.

    Returns one dict per kind: name, description, count, width, left_out,
    png and tsv (the files written; None when too few points for them).
    """
    import tensorflow as tf

    lines, notes = reps.read_phrases(phrases) if phrases else (None, [])
    model, src_tok, _, config = restore_model(model_dir, checkpoint, log=lambda *a: None)[:4]
    vector = reps.resolve_phrase_vector(model, phrase_vector)
    if lines is None:
        lines = reps.frequent_phrases(config.train_src, src_tok.words, most_frequent)
        notes.append(f"{len(lines)} words and phrases: the most frequent words and n-grams of {config.train_src}")
    maps = [reps.word_vectors(model, src_tok, lines), reps.phrase_vectors(model, src_tok, lines, vector)]
    reps.write_projector(out_dir, maps)
    writer = tf.summary.create_file_writer(logdir) if logdir else None
    drawn = []
    for rep in maps:
        if rep.left_out:
            more = " ..." if len(rep.left_out) > 10 else ""
            notes.append(f"{len(rep.left_out)} {rep.name} with [UNK] tokens (outside the source vocabulary) left out "
                         f"of the {rep.name} map: {', '.join(rep.left_out[:10])}{more}")
        png_path = None
        if len(rep.labels) >= 3:
            groups = [_length_group(w) for w in rep.columns["words"]] if "words" in rep.columns else None
            png = plots.representation_map_png(reps.tsne_2d(rep.vectors), rep.labels,
                                               f"{rep.name}: {rep.description}", groups)
            png_path = os.path.join(out_dir, f"{rep.name}.png")
            _save(png, png_path, writer, f"representations/{rep.name}", rep.description)
        else:
            notes.append(f"only {len(rep.labels)} {rep.name}: too few for a t-SNE map (3 needed), no {rep.name}.png")
        drawn.append({"name": rep.name, "description": rep.description, "count": len(rep.labels),
                      "width": int(rep.vectors.shape[1]), "left_out": rep.left_out, "png": png_path,
                      "tsv": os.path.join(out_dir, f"{rep.name}.tsv") if rep.labels else None})
    if writer is not None:
        writer.flush()
    for note in notes:
        log(note)
    return drawn
