"""benchmarks/train_ab.py and versus_joeynmt.py: their sides, their turns, and what the JSON says of them."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, run_cli
from nmt_tf.core.hardware import vector_flags

SCRIPT = os.path.join(REPO, "benchmarks", "train_ab.py")


def tiny_args(corpus):
    return [f"--flagfile={REPO}/pipelines/smoke.flags", f"--train_src={corpus['train_src']}",
            f"--train_tgt={corpus['train_tgt']}", "--batch_size=8", "--shuffle_buffer=1000"]


@pytest.mark.skipif(not os.path.isdir(os.path.join(REPO, ".git")), reason="needs this repository's git history")
def test_train_ab_runs_a_revision_and_a_directory_in_turns(tiny_corpus):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    done = run_cli(SCRIPT, "--a=HEAD", "--b", ".", "--b_env=TF_ENABLE_ONEDNN_OPTS=0",
                   "--a_flags=--embedding_size=12", "--rounds=2", "--round_steps=2", *tiny_args(tiny_corpus),
                   timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    a, b = result["a"], result["b"]
    assert a["commit"] == head and a["tree"] != REPO           # the revision, extracted
    assert b["tree"] == REPO and b["commit"].startswith(head)
    assert b["env"] == {"TF_ENABLE_ONEDNN_OPTS": "0"} and "Eigen" in b["cpu_kernels"]
    assert a["env"] == {}
    # --a_flags reached side A only: its embeddings are smaller.
    assert a["flags"] == ["--embedding_size=12"] and b["flags"] == [] and a["parameters"] < b["parameters"]
    for side in (a, b):
        assert len(side["rounds"]) == 2 and all(rate > 0 for rate in side["rounds"])
        assert side["target_tokens_per_sec"] == pytest.approx(sum(side["rounds"]) / 2, abs=0.1)
        assert len(side["round_updates_per_sec"]) == 2 and all(rate > 0 for rate in side["round_updates_per_sec"])
    assert result["ratios"] == [round(rb / ra, 3) for ra, rb in zip(a["rounds"], b["rounds"])]
    assert result["updates_ratios"] == [round(rb / ra, 3) for ra, rb in
                                        zip(a["round_updates_per_sec"], b["round_updates_per_sec"])]
    # The script's own flags are not passed on to the workers.
    own = {"a", "b", "a_env", "b_env", "a_flags", "b_flags"}
    assert "." not in result["common_args"], result["common_args"]
    assert not any(arg.lstrip("-").split("=")[0] in own for arg in result["common_args"]), result["common_args"]


def test_train_ab_reports_a_worker_that_fails(tiny_corpus):
    done = run_cli(SCRIPT, "--a=.", "--b=.", "--a_flags=--no_such_flag=1", *tiny_args(tiny_corpus), timeout=300)
    assert done.returncode != 0
    assert "side a's worker" in done.stderr and "no_such_flag" in done.stderr, done.stderr[-3000:]


def test_train_ab_names_a_side_that_is_neither_directory_nor_revision():
    done = run_cli(SCRIPT, "--a=no-such-revision-or-dir", "--b=.", timeout=120)
    assert done.returncode != 0 and "--a=no-such-revision-or-dir" in done.stderr, done.stderr[-2000:]


VERSUS = os.path.join(REPO, "benchmarks", "versus_joeynmt.py")


def fake_joeynmt(tmp_path):
    """A stand-in for the JoeyNMT harness: run.sh and joey_seeded.py print
    what the real ones print and note how they were called."""
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "run.sh").write_text(
        '#!/usr/bin/env bash\n'
        f'echo "run.sh $* THREADS=$THREADS WORK=$WORK" >> {harness}/calls.log\n'
        'echo "SPEED target_tokens_per_sec=500 (steps 100 after 1 warm-up interval(s), 9.1s)"\n')
    (harness / "joey_seeded.py").write_text(
        "import sys\n"
        f"open({str(harness / 'calls.log')!r}, 'a').write('joey_seeded.py ' + ' '.join(sys.argv[1:]) + '\\n')\n"
        "print('2026-11-26 05:38:09,799 - INFO - joeynmt.prediction - Generation took 4.0[sec].')\n")
    work = tmp_path / "work"
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "test.yaml").write_text("name: test\nrandom_seed: 7\n")
    (work / "test_2016_flickr.en").write_text("a\n" * 8)      # 8 sentences in 4 s: 2 sentences/s
    return harness, work


def versus_json(done):
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_versus_joeynmt_decoding_alternates_the_sides_and_takes_ratios_per_round(tmp_path, exported, tiny_corpus):
    harness, work = fake_joeynmt(tmp_path)
    _, _, version = exported
    done = run_cli(VERSUS, f"--joeynmt={harness}", f"--joeynmt_work={work}", f"--joeynmt_python={sys.executable}",
                   "--measure=decoding", f"--saved_model={version}", "--parallel_batches=1", "--rounds=2",
                   "--decode_runs=1", f"--nmt_tf_args=--source={tiny_corpus['dev_src']}", timeout=600)
    result = versus_json(done)
    ours = "nmt_tf --parallel_batches=1"
    first, second = result["rounds"]
    assert first["order"] == ["joeynmt", ours] and second["order"] == [ours, "joeynmt"]
    for row in (first, second):
        assert row["rates"]["joeynmt"] == 2.0 and row["rates"][ours] > 0
        assert row["ratios"][ours] == pytest.approx(row["rates"][ours] / 2.0, abs=1e-3)
    assert result["median_ratios"][ours] == pytest.approx((first["ratios"][ours] + second["ratios"][ours]) / 2,
                                                          abs=0.01)
    assert result["cpu_flags"] == vector_flags() and result["saved_model"] == version
    # JoeyNMT decoded with its own work folder's config and seed, twice.
    calls = (harness / "calls.log").read_text().splitlines()
    assert len(calls) == 2
    assert all(call.startswith(f"joey_seeded.py 7 test {work}/configs/test.yaml -o ") for call in calls), calls


def test_versus_joeynmt_training_reads_both_sides_rates(tmp_path, tiny_corpus):
    harness, work = fake_joeynmt(tmp_path)
    done = run_cli(VERSUS, f"--joeynmt={harness}", f"--joeynmt_work={work}", "--rounds=1", "--mixed_precision=none",
                   "--joeynmt_updates=40", f"--nmt_tf_flagfile={REPO}/pipelines/smoke.flags", "--windows=1",
                   "--nmt_tf_args=" + " ".join([f"--train_src={tiny_corpus['train_src']}", "--batch_size=8",
                                                f"--train_tgt={tiny_corpus['train_tgt']}", "--shuffle_buffer=1000",
                                                "--untimed_steps=1", "--window_steps=2"]), timeout=600)
    result = versus_json(done)
    (row,) = result["rounds"]
    ours = "nmt_tf --mixed_precision=none"
    assert row["rates"]["joeynmt"] == 500 and row["rates"][ours] > 0
    assert row["ratios"][ours] == pytest.approx(row["rates"][ours] / 500, abs=1e-3)
    assert result["nmt_tf_flagfile"] == "pipelines/smoke.flags" and result["unit"] == "target tokens/s"
    assert (harness / "calls.log").read_text() == f"run.sh speed 40 THREADS={os.cpu_count()} WORK={work}\n"


def test_versus_joeynmt_names_the_side_that_failed(tmp_path):
    harness, work = fake_joeynmt(tmp_path)
    (harness / "run.sh").write_text('#!/usr/bin/env bash\necho "No module named torch"; exit 3\n')
    done = run_cli(VERSUS, f"--joeynmt={harness}", f"--joeynmt_work={work}", timeout=120)
    assert done.returncode != 0
    assert "JoeyNMT's training failed (exit 3)" in done.stderr and "No module named torch" in done.stderr, \
        done.stderr[-2000:]
    missing = run_cli(VERSUS, f"--joeynmt={tmp_path / 'nowhere'}", timeout=120)
    assert missing.returncode != 0 and "no run.sh in it" in missing.stderr, missing.stderr[-2000:]
    no_model = run_cli(VERSUS, f"--joeynmt={harness}", f"--joeynmt_work={work}", "--measure=decoding",
                       f"--saved_model={tmp_path}", timeout=120)
    assert no_model.returncode != 0 and "is not a SavedModel version directory" in no_model.stderr
