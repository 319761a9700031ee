"""Learning-rate schedules (--lr_schedule): plateau, and the budgeted linear / cosine / 1-sqrt decays."""

import math
import os

import numpy as np
import pytest
from test_train import QUIET, read_scalars

from nmt_tf.training import job as training
from nmt_tf.training import schedules


def test_linear_decay_reaches_the_final_rate_at_the_step_budget():
    s = schedules.LearningRateSchedule("linear", 1e-3, warmup_steps=100, max_steps=1100)
    assert s.rate(0) == pytest.approx(1e-5)              # warm-up: (k + 1) / 100 of the rate
    assert s.rate(99) == pytest.approx(1e-3)
    assert s.rate(100) == pytest.approx(1e-3)            # the decay starts at the full rate
    assert s.rate(600) == pytest.approx(5e-4)            # half way through the decay
    assert s.rate(1099) == pytest.approx(1e-6)           # the last update of the budget
    assert s.rate(5000) == 0.0                           # a resumed run past its budget stays at the end


def test_cosine_decay_to_a_final_fraction():
    s = schedules.LearningRateSchedule("cosine", 2e-3, max_steps=1000, final_fraction=0.1)
    assert s.rate(0) == pytest.approx(2e-3)
    assert s.rate(500) == pytest.approx(2e-3 * (0.1 + 0.9 * 0.5))
    assert s.rate(250) == pytest.approx(2e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))))
    assert s.rate(1000) == pytest.approx(2e-4)
    rates = [s.rate(k) for k in range(0, 1001, 50)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))


def test_one_minus_sqrt_decay_falls_fastest_at_its_start():
    # Held over the first 80 % of 1,000 updates, then 1 - sqrt(progress) over the last 200 (Hägele et al. 2024).
    s = schedules.LearningRateSchedule("1-sqrt", 1.0, max_steps=1000, decay_fraction=0.2, final_fraction=0.1)
    assert s.rate(799) == 1.0 and s.rate(800) == pytest.approx(1.0)
    assert s.rate(850) == pytest.approx(0.1 + 0.9 * 0.5)          # a quarter of the decay: half of the way down
    assert s.rate(900) == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(0.5)))
    assert s.rate(1000) == pytest.approx(0.1)
    linear = schedules.LearningRateSchedule("linear", 1.0, max_steps=1000, decay_fraction=0.2, final_fraction=0.1)
    assert all(s.rate(k) < linear.rate(k) for k in range(810, 1000, 10))
    assert "1-sqrt decay to 0.1 of it at update 1,000" in s.describe()


def test_a_decay_fraction_holds_the_rate_until_the_last_part_of_the_budget():
    # Warm-up, stable, decay: 100 warm-up updates, then 1,000 more of which the last 20% decay.
    s = schedules.LearningRateSchedule("linear", 1e-3, warmup_steps=100, max_steps=1100, decay_fraction=0.2)
    assert s.rate(99) == pytest.approx(1e-3)
    assert s.rate(500) == pytest.approx(1e-3) and s.rate(900) == pytest.approx(1e-3)   # held to the decay
    assert s.rate(1000) == pytest.approx(5e-4)           # half way through the last 200 updates
    assert s.rate(1099) == pytest.approx(1e-3 / 200)
    assert s.rate(1100) == 0.0
    cosine = schedules.LearningRateSchedule("cosine", 1.0, max_steps=1000, decay_fraction=0.5, final_fraction=0.1)
    assert cosine.rate(499) == 1.0 and cosine.rate(750) == pytest.approx(0.1 + 0.9 * 0.5)
    # An hour budget: the decay starts when a fifth of the estimated updates is left.
    hours = schedules.LearningRateSchedule("linear", 1.0, max_hours=1.0, decay_fraction=0.2)
    assert hours.rate(100, 1800.0, 0.5) == 1.0                            # ends at 3,700: holds until 2,960
    # 200 s left at 0.5 s per update: the budget ends at update 3,400 and its decay spans 680 updates from 2,720.
    assert hours.rate(3000, 3400.0, 0.5) == pytest.approx(1 - 280 / 680)
    assert "held until the last 20% of the budget, then linear decay to 0 of it at 1 training hours" \
        in hours.describe()


def test_an_hour_budget_is_turned_into_updates_from_the_measured_rate():
    s = schedules.LearningRateSchedule("linear", 1.0, max_hours=1.0)
    assert s.rate(10, train_seconds=5.0, seconds_per_step=None) == 1.0    # nothing measured yet: full rate
    # 1,800 s left at 0.5 s per update: 3,600 updates more, the budget ends at update 3,700.
    assert s.budget_steps(100, 1800.0, 0.5) == pytest.approx(3700.0)
    assert s.rate(100, 1800.0, 0.5) == pytest.approx(1 - 100 / 3700)
    # A slower CPU after a resume: the same time left buys fewer updates, and the rate falls faster.
    assert s.rate(100, 1800.0, 2.0) == pytest.approx(1 - 100 / 1000)
    assert s.rate(100, 3600.0, 2.0) == 0.0
    both = schedules.LearningRateSchedule("linear", 1.0, max_steps=500, max_hours=1.0)
    assert both.budget_steps(100, 1800.0, 0.5) == 500.0                  # the earlier end wins
    assert both.budget_steps(100, 1800.0, None) == 500.0


def test_plateau_leaves_the_rate_alone_after_the_warm_up():
    s = schedules.LearningRateSchedule("plateau", 1e-3, warmup_steps=10)
    assert s.rate(4) == pytest.approx(5e-4) and s.rate(9) == pytest.approx(1e-3)
    assert s.rate(10) is None and schedules.LearningRateSchedule("plateau", 1e-3).rate(0) is None


@pytest.mark.parametrize("overrides, message", [
    (dict(lr_schedule="cosine"), "give --max_steps or --max_hours"),
    (dict(lr_schedule="linear", max_steps=100, decay_factor=0.5), "set --decay_factor=1"),
    (dict(lr_schedule="linear", max_steps=100, warmup_steps=100), "leaves nothing of --max_steps=100"),
    (dict(lr_schedule="linear", max_hours=1.0, distribution="multi_worker"), "under --distribution=multi_worker"),
    (dict(lr_decay_fraction=0.2), "--lr_schedule=plateau would ignore it"),
])
def test_schedule_flags_that_cannot_work_are_one_error(tiny_config, tmp_path, overrides, message):
    with pytest.raises(training.TrainingError, match=message):
        training.train(tiny_config(model_dir=str(tmp_path / "m"), **overrides), **QUIET)
    assert not os.path.exists(tmp_path / "m" / "checkpoints")


def test_training_with_a_linear_budget_ends_annealed(tiny_config, tmp_path):
    model_dir = str(tmp_path / "m")
    lines = []
    summary = training.train(tiny_config(model_dir=model_dir, max_epochs=5, max_steps=8, warmup_steps=2,
                                      lr_schedule="linear", lr_decay_fraction=0.5), log=lines.append)
    assert summary["steps"] == 8 and summary["status"] == "max_steps"
    assert any("Learning rate (linear): 0.01, warm-up over 2 updates, held until the last 50% of the budget, "
               "then linear decay to 0 of it at update 8" in line for line in lines), lines
    rates = [v for _, v in sorted(read_scalars(os.path.join(model_dir, "logs", "train"))["learning_rate"])]
    # Update k (from 0) is logged at step k + 1: warm-up 0.005, 0.01; held at 0.01 for the first half of
    # the 6 updates after it; then 0.01 x (1 - (k - 5) / 3).
    np.testing.assert_allclose(rates, [0.005, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01 * 2 / 3, 0.01 / 3], rtol=1e-5)


def test_an_hour_budget_decays_to_its_end_in_training(tiny_config, tmp_path, monkeypatch):
    """--max_hours through the training callback: the updates' time becomes the
    budget's update count, and the rate reaches ~0 at the last update. The
    callback's clock is faked to 0.5 s per reading, so every update takes
    exactly 0.5 s and 0.0025 hours (9 s) buy 18 updates."""
    import time
    import types

    from nmt_tf.training import callbacks

    clock = {"now": 0.0}

    def perf_counter():
        clock["now"] += 0.5
        return clock["now"]

    monkeypatch.setattr(callbacks, "time", types.SimpleNamespace(**{**vars(time), "perf_counter": perf_counter}))
    model_dir = str(tmp_path / "m")
    lines = []
    summary = training.train(tiny_config(model_dir=model_dir, max_epochs=5, max_hours=0.0025,
                                         lr_schedule="linear"), log=lines.append)
    assert summary["status"] == "max_hours" and summary["steps"] == 18, summary
    assert any("Learning rate (linear): 0.01, linear decay to 0 of it at 0.0025 training hours" in line
               for line in lines), lines
    rates = [v for _, v in sorted(read_scalars(os.path.join(model_dir, "logs", "train"))["learning_rate"])]
    # The first 6 updates run at the full rate: the first 5 are not timed (they trace the step), so no rate
    # is known before update 6. From there 9 s at 0.5 s per update end the budget at update 18.
    np.testing.assert_allclose(rates, [0.01] * 6 + [0.01 * (1 - k / 18) for k in range(6, 18)], rtol=1e-5)
