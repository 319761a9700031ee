"""benchmarks/train_ab.py: two sides' workers, their turns, and what the JSON says of them."""

import json
import os
import subprocess

import pytest

from conftest import REPO, run_cli

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
    assert result["ratios"] == [round(rb / ra, 3) for ra, rb in zip(a["rounds"], b["rounds"])]
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
