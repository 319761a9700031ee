"""The WMT'14 recipe: prepare.py on small files, and the four flagfiles build the paper's models."""

import gzip
import os
import subprocess
import sys

import pytest

from conftest import REPO
from nmt_tf import flags
from nmt_tf.training import job as training

RECIPE = os.path.join(REPO, "pipelines", "wmt14_en_fr")


def run_prepare(*args):
    return subprocess.run([sys.executable, os.path.join(RECIPE, "prepare.py"), *args], capture_output=True,
                          text=True)


def test_prepare_concatenates_plain_gzip_and_sgml(tmp_path):
    (tmp_path / "a.en").write_text("Hello .\nA man .\n")
    (tmp_path / "a.fr").write_text("Bonjour .\nUn homme .\n")
    with gzip.open(tmp_path / "b.en.gz", "wt") as f:
        f.write("Two dogs .\n")
    with gzip.open(tmp_path / "b.fr.gz", "wt") as f:
        f.write("Deux chiens .\n")
    (tmp_path / "t.en.sgm").write_text('<srcset>\n<doc docid="d">\n<seg id="1">Tom &amp; Jerry</seg>\n'
                                       '<seg id="2">It&#39;s late.</seg>\n</doc>\n</srcset>\n')
    (tmp_path / "t.fr.sgm").write_text('<refset>\n<doc docid="d">\n<seg id="1">Tom et Jerry</seg>\n'
                                       '<seg id="2">Il est tard.</seg>\n</doc>\n</refset>\n')
    out = tmp_path / "out"
    result = run_prepare(f"--out_dir={out}", f"--train={tmp_path / 'a.en'},{tmp_path / 'a.fr'}",
                         f"--train={tmp_path / 'b.en.gz'},{tmp_path / 'b.fr.gz'}",
                         f"--test={tmp_path / 't.en.sgm'},{tmp_path / 't.fr.sgm'}")
    assert result.returncode == 0, result.stderr
    read = lambda name: gzip.open(out / name, "rt", encoding="utf-8").read().splitlines()
    assert read("train.en.gz") == ["Hello .", "A man .", "Two dogs ."]
    assert read("train.fr.gz") == ["Bonjour .", "Un homme .", "Deux chiens ."]
    assert read("test.en.gz") == ["Tom & Jerry", "It's late."]
    assert not os.path.exists(out / "dev.en.gz")


def test_prepare_rejects_unequal_pairs(tmp_path):
    (tmp_path / "a.en").write_text("x\ny\n")
    (tmp_path / "a.fr").write_text("x\n")
    result = run_prepare(f"--out_dir={tmp_path}", f"--train={tmp_path / 'a.en'},{tmp_path / 'a.fr'}")
    assert result.returncode == 1
    assert "a.en has 2 sentences but" in result.stderr and "a.fr has 1" in result.stderr


@pytest.mark.parametrize("name, total", [("rnnencdec30", 69_579_000), ("rnnencdec50", 69_579_000),
                                         ("rnnsearch30", 80_443_000), ("rnnsearch50", 80_443_000)])
def test_recipe_flagfiles_build_the_papers_models(name, total):
    try:
        flags.FLAGS(["train", f"--flagfile={os.path.join(RECIPE, name + '.flags')}"])
        config = flags.config_from_flags()
    finally:
        flags.FLAGS.unparse_flags()
    assert config.max_len == int(name[-2:]) and config.optimizer == "adadelta" and config.dropout == 0.0
    assert config.model == name[:-2] and config.src_vocab_size == config.tgt_vocab_size == 30000
    assert training.dry_run(config, log=lambda *a: None) == total
