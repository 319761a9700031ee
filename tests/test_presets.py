"""Presets (nmt_tf.presets) and the Python API (nmt_tf.Translator) on the tiny
trained model: a preset rebuilds the model's export exactly, damaged presets
are refused by name, and the API returns what the signatures do."""

import json
import os
import shutil

import numpy as np
import pytest

from conftest import read_multi30k, run_cli, write_lines
from nmt_tf import presets
from nmt_tf.inference.client import SignatureClient
from nmt_tf.presets import measure

SENTENCES = ["A man in a blue shirt is running.", "", "Two dogs play in the snow near a tree .",
             "A little girl climbs into a wooden playhouse."]


@pytest.fixture(scope="module")
def tiny_preset(exported, tmp_path_factory):
    """The tiny model's best checkpoint as a float32 preset with the `exported`
    fixture's settings, and its build: (preset folder, cache, SavedModel)."""
    model_dir, _, _ = exported
    folder = str(tmp_path_factory.mktemp("presets") / "tiny_en_fr")
    presets.create(model_dir, folder, "tiny_en_fr", weights="best", weights_dtype="float32",
                   export_settings={"beam_size": 3, "n_best": 2, "max_input_length": 20, "max_beam_size": 3},
                   log=lambda *a: None)
    cache = str(tmp_path_factory.mktemp("cache"))
    return folder, cache, presets.build(folder, cache, log=lambda *a: None)


def test_a_preset_rebuilds_the_export_of_its_model(tiny_preset, exported):
    folder, _, saved_model = tiny_preset
    manifest = json.load(open(os.path.join(folder, "preset.json")))
    assert manifest["name"] == "tiny_en_fr" and manifest["export"]["beam_size"] == 3
    assert set(manifest["files"]) >= {"weights.npz", "config.json", "vocab.src.txt", "vocab.tgt.txt"}
    original = SignatureClient(saved_model=exported[2])(text=SENTENCES)
    rebuilt = SignatureClient(saved_model=saved_model)(text=SENTENCES)
    assert list(rebuilt["translation"]) == list(original["translation"])
    np.testing.assert_allclose(rebuilt["nbest_scores"], original["nbest_scores"], atol=1e-5)
    model_dir = os.path.join(os.path.dirname(os.path.dirname(saved_model)), "model")
    assert os.path.exists(os.path.join(model_dir, "averaged", "checkpoint"))       # --checkpoint=averaged reads it


def test_a_built_preset_is_reused_and_a_changed_one_rebuilt(tiny_preset, tmp_path):
    folder, cache, saved_model = tiny_preset
    said = []
    assert presets.build(folder, cache, log=said.append) == saved_model and said == []
    copy = str(tmp_path / "tiny_en_fr")
    shutil.copytree(folder, copy)
    manifest = json.load(open(os.path.join(copy, "preset.json")))
    manifest["export"]["n_best"] = 1                   # another SavedModel: another build folder
    json.dump(manifest, open(os.path.join(copy, "preset.json"), "w"))
    assert presets.build_dir(copy, manifest, cache) != presets.build_dir(folder, presets.read_manifest(folder), cache)


def test_a_damaged_cached_build_is_built_again(tiny_preset, tmp_path):
    """Issue 95: truncated variables, or a deleted saved_model.pb, in the cache: the
    next use says so and builds it again (it used to fail "export it again" forever,
    or "Directory not empty"); a build that cannot be removed names the folder."""
    folder, _, _ = tiny_preset
    cache = str(tmp_path / "cache")
    saved_model = presets.build(folder, cache, log=lambda *a: None)
    variables = os.path.join(saved_model, "variables", "variables.data-00000-of-00001")
    with open(variables, "r+b") as f:
        f.truncate(os.path.getsize(variables) // 2)
    said = []
    assert presets.build(folder, cache, log=said.append) == saved_model
    assert said[0].startswith(f"The cached build {os.path.dirname(os.path.dirname(saved_model))} is damaged "
                              "(export/1/variables/variables.data-00000-of-00001 has ")
    assert SignatureClient(saved_model=saved_model)(text=SENTENCES)["translation"].shape == (len(SENTENCES),)
    os.remove(os.path.join(saved_model, "saved_model.pb"))
    said = []
    assert presets.build(folder, cache, log=said.append) == saved_model
    assert "(export/1/saved_model.pb is missing)" in said[0] and os.path.isfile(os.path.join(saved_model,
                                                                                            "saved_model.pb"))


@pytest.mark.parametrize("dtype, tolerance", [("float16", 1e-3), ("bfloat16", 8e-3), ("float32", 0.0)])
def test_weights_are_stored_in_the_chosen_dtype_and_read_back_as_float32(dtype, tolerance):
    rng = np.random.default_rng(0)
    value = rng.normal(size=(7, 5)).astype(np.float32)
    stored = presets._to_storage(value, dtype)
    assert stored.dtype == {"float16": np.float16, "bfloat16": np.uint16, "float32": np.float32}[dtype]
    back = presets._from_storage(stored, dtype)
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, value, rtol=tolerance, atol=0)


def _edit_manifest(folder, change):
    path = os.path.join(folder, "preset.json")
    with open(path) as f:
        manifest = json.load(f)
    change(manifest)
    with open(path, "w") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize("damage, fragment", [
    (lambda d: open(os.path.join(d, "vocab.tgt.txt"), "a").write("extra\n"), "vocab.tgt.txt is damaged"),
    (lambda d: os.remove(os.path.join(d, "weights.npz")), "weights.npz is missing"),
    (lambda d: open(os.path.join(d, "preset.json"), "w").write("{"), "preset.json cannot be read"),
    # issue 95: a list, a manifest without files, and a file entry outside the folder are one error, no traceback
    (lambda d: open(os.path.join(d, "preset.json"), "w").write("[1, 2]"), "holds a JSON list, not a preset"),
    (lambda d: _edit_manifest(d, lambda m: m.pop("files")), 'has no "files" object'),
    (lambda d: _edit_manifest(d, lambda m: m["files"].update({"../../../../etc/hostname": "0" * 64})),
     "the file entry '../../../../etc/hostname' is not a plain file name"),
])
def test_a_damaged_preset_is_refused_naming_the_file(tiny_preset, tmp_path, damage, fragment):
    copy = str(tmp_path / "p")
    shutil.copytree(tiny_preset[0], copy)
    damage(copy)
    with pytest.raises(presets.PresetError, match=fragment):
        presets.build(copy, str(tmp_path / "cache"), log=lambda *a: None)


def test_weights_that_do_not_fit_the_model_are_refused(tiny_preset, exported, tmp_path):
    from nmt_tf.inference.restore import restore_model

    model = restore_model(exported[0], log=lambda *a: None).model
    arrays = presets.weight_arrays(model, "float32")
    name = next(iter(arrays))
    with pytest.raises(presets.PresetError, match="shape"):
        presets.set_weights(model, {**arrays, name: np.zeros((1, 2, 3), np.float32)})
    with pytest.raises(presets.PresetError, match="missing"):
        presets.set_weights(model, {k: v for k, v in arrays.items() if k != name})
    with pytest.raises(presets.PresetError, match="holds a preset already"):
        presets.create(exported[0], tiny_preset[0], "again", log=lambda *a: None)


def test_weights_fit_a_model_built_after_others_in_the_same_process():
    """Keras numbers dropout's random-state variables by how many were made
    before in the process (seed_generator_16/...): they are not weights, so a
    preset made in one process fits the same model built in another, after
    other models (what broke Translator.from_preset in a busy process)."""
    from nmt_tf import models
    from nmt_tf.config import TrainingConfig

    config = TrainingConfig(embedding_size=8, hidden_size=8, attention_size=8, maxout_size=4, dropout=0.3,
                            recurrent_dropout=0.2).model_config()
    first = models.build_model(config, 12, 14)
    arrays = presets.weight_arrays(first, "float32")
    assert arrays and not [path for path in arrays if "seed_generator" in path]
    later = models.build_model(config, 12, 14)
    generators = [v.path for v in later.variables if not presets.is_weight(v.path)]
    assert generators and not set(generators) & {v.path for v in first.variables}   # numbered anew
    presets.set_weights(later, {**arrays, "seed_generator_1/seed_generator_state": np.zeros(2, np.int64)})
    for a, b in zip(first.weights, later.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_an_unknown_preset_name_lists_the_shipped_ones():
    with pytest.raises(presets.PresetError, match="multi30k_en_fr"):
        presets.preset_dir("no_such_model")
    assert "multi30k_en_fr" in presets.available()


def test_the_translator_api_returns_what_the_signature_does(tiny_preset, exported):
    import nmt_tf

    translator = nmt_tf.Translator.from_saved_model(tiny_preset[2])
    results = translator.translate(SENTENCES)
    reference = SignatureClient(saved_model=exported[2])(text=SENTENCES)
    assert [r.text for r in results] == [t.decode() for t in reference["translation"]]
    for i, r in enumerate(results):
        assert r.nbest[0][0] == r.text and len(r.nbest) <= 2
        assert r.alignment.shape == (len(r.target_tokens), len(r.source_tokens))
        assert r.score == pytest.approx(float(reference["score"][i]), abs=1e-5)
    assert results[1].text == "" and results[1].source_tokens == ["[EOS]"]
    assert results[0].source_tokens[-1] == "[EOS]" and results[0].target_tokens[-1] == "[EOS]"
    np.testing.assert_allclose(results[0].alignment.sum(axis=1), 1.0, atol=1e-4)   # a distribution per output token
    single = translator.translate(SENTENCES[0], n_best=1)
    assert single.text == results[0].text and len(single.nbest) == 1
    with pytest.raises(ValueError, match="n_best=3"):
        translator.translate(SENTENCES, n_best=3)
    scores = translator.score(["A dog runs.", "Two men."], ["Un chien court.", "Deux hommes."])
    direct = SignatureClient("score", saved_model=exported[2])(source=["A dog runs.", "Two men."],
                                                               target=["Un chien court.", "Deux hommes."])
    assert [s.log_prob for s in scores] == pytest.approx(list(direct["log_prob"]), abs=1e-5)
    assert len(scores[0].token_log_probs) == scores[0].target_length


def test_the_translator_of_a_model_dir_or_a_preset_translates_alike(tiny_preset, exported):
    import nmt_tf

    said = []
    from_dir = nmt_tf.Translator.from_model_dir(exported[0], average_checkpoints=50, beam_size=3, n_best=2,
                                                max_input_length=20, log=said.append)
    assert any(line.startswith("Only ") and "not 50: averaging those" in line for line in said), said
    from_dir = nmt_tf.Translator.from_model_dir(exported[0], beam_size=3, n_best=2, max_input_length=20)
    from_preset = nmt_tf.Translator.from_preset(tiny_preset[0], cache_dir=tiny_preset[1])
    assert [r.text for r in from_dir.translate(SENTENCES)] == [r.text for r in from_preset.translate(SENTENCES)]
    assert from_dir.metadata["search"]["beam_size"] == 3 and from_preset.metadata["src_lang"] == "en"
    prefixes = ["Un homme", ""] + ["Deux"] * (len(SENTENCES) - 2)
    steered = [from_dir.translate(SENTENCES, target_prefix=prefixes),
               from_preset.translate(SENTENCES, target_prefix=prefixes)]
    assert [r.text for r in steered[0]] == [r.text for r in steered[1]]
    assert all(r.text.startswith(p) for r, p in zip(steered[0], prefixes))
    assert from_dir.translate(SENTENCES[0], target_prefix="Un").text.startswith("Un")
    with pytest.raises(ValueError, match="but 1 target prefixes"):
        from_dir.translate(SENTENCES, target_prefix=["Un"])
    required = from_preset.translate(SENTENCES[0], required_terms=["chien", "bleue"])
    assert "chien" in required.text and "bleue" in required.text and required.terms_met
    assert from_preset.translate(SENTENCES[0]).terms_met is None
    with pytest.raises(ValueError, match="a tab or a line break"):
        from_dir.translate(SENTENCES[0], required_terms=["un\tdeux"])
    with pytest.raises(ValueError, match="17 required terms for one sentence; the model takes at most 16"):
        from_dir.translate(SENTENCES[0], required_terms=["chien"] * 17)


def test_the_translator_takes_search_settings_per_call_and_per_translator(tiny_preset, exported):
    """Issue 91: a SavedModel Translator searches with the beam, n-best and
    length alpha a call (or the Translator) asks for, as the model directory
    searched with those settings does; a setting out of range is one
    ValueError naming its bound."""
    import nmt_tf

    translator = nmt_tf.Translator.from_saved_model(tiny_preset[2])
    greedy = translator.translate(SENTENCES, beam_size=1, length_alpha=0.5)
    reference = nmt_tf.Translator.from_model_dir(exported[0], beam_size=1, n_best=1, length_alpha=0.5,
                                                 max_input_length=20)
    assert [r.text for r in greedy] == [r.text for r in reference.translate(SENTENCES)]
    assert all(len(r.nbest) <= 1 for r in greedy)
    wide = translator.translate(SENTENCES[0], beam_size=3, n_best=3)
    assert 2 <= len(wide.nbest) <= 3 and wide.nbest[0][0] == wide.text
    fixed = nmt_tf.Translator.from_preset(tiny_preset[0], cache_dir=tiny_preset[1], beam_size=1, length_alpha=0.5)
    assert [r.text for r in fixed.translate(SENTENCES)] == [r.text for r in greedy]
    assert [r.text for r in translator.translate(SENTENCES)] == [r.text for r in translator.translate(
        SENTENCES, beam_size=3)]                                 # the export's beam, either way
    with pytest.raises(ValueError, match="beam_size must be at most 3, the widest beam of this export"):
        translator.translate(SENTENCES[0], beam_size=4)
    with pytest.raises(ValueError, match="n_best must be at most beam_size"):
        translator.translate(SENTENCES[0], beam_size=1, n_best=2)
    with pytest.raises(ValueError, match="the export's search serves"):
        translator.translate(SENTENCES[0], beam_size=1, target_prefix="Un")


def test_a_dropped_translator_lets_go_of_its_graphs_and_a_live_one_keeps_translating(tiny_preset, exported):
    """Loading a SavedModel and tracing a model's search register custom
    gradients that TensorFlow keeps, with their graphs, for the process's
    life (nmt_tf.core.custom_gradients): a Translator forgets its own when it is
    collected, and not those of another that is still in use."""
    import gc

    import nmt_tf
    from nmt_tf.core import custom_gradients

    kept = custom_gradients.registered()
    live = nmt_tf.Translator.from_saved_model(tiny_preset[2])
    expected = live.translate(SENTENCES[0]).text
    with_live = custom_gradients.registered()
    assert with_live > kept                        # the premise: the load registered some
    for make in (lambda: nmt_tf.Translator.from_saved_model(tiny_preset[2]),
                 lambda: nmt_tf.Translator.from_model_dir(exported[0], beam_size=3, n_best=2, max_input_length=20)):
        translator = make()
        translator.translate(SENTENCES)            # from_model_dir's functions are traced at their first call
        translator.score(SENTENCES[:1], ["Un homme court."])
        assert custom_gradients.registered() > with_live
        del translator
        gc.collect()
        assert custom_gradients.registered() == with_live
    assert live.translate(SENTENCES[0]).text == expected


def test_translate_and_presets_cli_with_a_preset(tiny_preset, tmp_path):
    folder, cache, saved_model = tiny_preset
    source = tmp_path / "in.en"
    source.write_text("\n".join(SENTENCES) + "\n")
    env = {"NMT_TF_CACHE": cache}
    out = run_cli("-m", "nmt_tf.translate", f"--preset={folder}", f"--input={source}", env=env)
    assert out.returncode == 0, out.stderr
    direct = run_cli("-m", "nmt_tf.translate", f"--saved_model={saved_model}", f"--input={source}")
    assert out.stdout == direct.stdout and len(out.stdout.splitlines()) == len(SENTENCES)
    both = run_cli("-m", "nmt_tf.translate", f"--preset={folder}", f"--saved_model={saved_model}", env=env)
    assert both.returncode == 1 and "exactly one of --saved_model, --preset and --server" in both.stderr
    unknown = run_cli("-m", "nmt_tf.translate", "--preset=no_such_model", env=env)
    assert unknown.returncode == 1 and "no preset named 'no_such_model'" in unknown.stderr
    listed = run_cli("-m", "nmt_tf.presets", "--list")
    assert listed.returncode == 0 and listed.stdout.startswith("multi30k_en_fr\ten->fr\trnnsearch")
    built = run_cli("-m", "nmt_tf.presets", f"--build={folder}", env=env)
    assert built.returncode == 0 and built.stdout.strip() == saved_model


def test_a_preset_whose_litert_model_cannot_be_built_is_one_error_from_the_child_process(tiny_preset, tmp_path):
    """presets.litert_model builds in a child process (python -m nmt_tf.presets
    --build_litert); what the child refuses comes back as one PresetError in
    its own words, without a traceback. (This preset's word tokenizer has no
    LiteRT export; tests/test_export.py builds a SentencePiece one.)"""
    folder, _, _ = tiny_preset
    with pytest.raises(presets.PresetError) as refused:
        presets.litert_model(folder, "float32", str(tmp_path / "cache"), log=lambda *a: None)
    assert "uses --tokenizer=word; a LiteRT export needs --tokenizer=sentencepiece" in str(refused.value)
    assert "Traceback" not in str(refused.value)


def test_measured_checks_are_what_the_preset_translates_and_scores(tiny_preset, tmp_path):
    from nmt_tf.api import Translator
    from nmt_tf.evaluation import metrics

    folder, cache, _ = tiny_preset
    copy = str(tmp_path / "tiny_en_fr")
    shutil.copytree(folder, copy)            # the same manifest: the same build in the cache
    sources, references = read_multi30k("val.en.gz", 6), read_multi30k("val.fr.gz", 6)
    src, ref = write_lines(tmp_path / "set.en.gz", sources, gz=True), write_lines(tmp_path / "set.fr", references)
    checks = measure.measure_checks(copy, src, ref, src, ref, pairs=4, cache_dir=cache, log=lambda *a: None)
    assert checks == json.load(open(os.path.join(copy, "checks.json"), encoding="utf-8")) == presets.read_checks(copy)
    translator = Translator.from_preset(copy, cache, log=lambda *a: None)
    bleu, signature = metrics.moses_lc_bleu([t.text for t in translator.translate(sources)], references, "fr")
    assert checks["bleu"] == {"source": "set.en.gz", "reference": "set.fr", "lines": 6,
                              "bleu_lc_moses": round(bleu, 2), "signature": signature}
    scored = translator.score(sources[:4], references[:4])
    assert [(p["source"], p["target"], p["target_length"]) for p in checks["score"]] == [
        (s, t, score.target_length) for s, t, score in zip(sources, references, scored)]
    np.testing.assert_allclose([p["log_prob"] for p in checks["score"]], [s.log_prob for s in scored], atol=1e-4)
    table = presets.files_table(copy).splitlines()
    assert table[:2] == ["| SHA-256 | file | bytes |", "|---|---|---|"]
    assert [row.split("`")[3] for row in table[2:]] == sorted(os.listdir(copy))      # no card in this preset
    assert f"| `{presets.sha256(os.path.join(copy, 'checks.json'))}` | `checks.json` |" in table[2]
    out = run_cli("-m", "nmt_tf.presets", f"--measure_checks={copy}", f"--bleu_src={src}", f"--bleu_ref={ref}",
                  "--pairs=3", env={"NMT_TF_CACHE": cache})          # the pairs default to the BLEU files
    assert out.returncode == 0, out.stderr
    assert [p["source"] for p in presets.read_checks(copy)["score"]] == sources[:3]
    assert out.stdout.splitlines() == presets.files_table(copy).splitlines() and "checks.json" in out.stdout
    no_ref = run_cli("-m", "nmt_tf.presets", f"--measure_checks={copy}", f"--bleu_src={src}")
    assert no_ref.returncode == 1 and "--measure_checks needs --bleu_src and --bleu_ref" in no_ref.stderr
    unread = run_cli("-m", "nmt_tf.presets", f"--measure_checks={copy}", f"--bleu_src={src}", f"--bleu_ref={ref}",
                     "--beam_size=5", "--name=other")      # --create's flags: an error, not silently ignored
    assert unread.returncode == 1 and ("--measure_checks does not read every flag given: --name, --beam_size only "
                                       "with --create (a preset's SavedModel searches with the settings it was "
                                       "created with).") in unread.stderr, unread.stderr
    short = write_lines(tmp_path / "short.fr", references[:5])
    with pytest.raises(presets.PresetError, match="the BLEU source has 6 lines but the BLEU reference 5"):
        measure.measure_checks(copy, src, short, src, ref, cache_dir=cache, log=lambda *a: None)
    with pytest.raises(presets.PresetError, match="pairs=7: the pairs files have 6 lines"):
        measure.measure_checks(copy, src, ref, src, ref, pairs=7, cache_dir=cache, log=lambda *a: None)
    latin1 = tmp_path / "latin1.fr"
    latin1.write_bytes("".join(r + "\n" for r in references).encode("latin-1", errors="replace") + b"\xe9\n")
    with pytest.raises(presets.PresetError, match=r"latin1\.fr \(--bleu_ref\) is not UTF-8"):
        measure.measure_checks(copy, src, str(latin1), src, ref, cache_dir=cache, log=lambda *a: None)
    with pytest.raises(presets.PresetError, match=r"missing\.fr does not exist \(--pairs_tgt\)"):
        measure.measure_checks(copy, src, ref, src, str(tmp_path / "missing.fr"), cache_dir=cache,
                               log=lambda *a: None)
