"""Learning-rate schedules of `--lr_schedule`, as a function of the update count.

- plateau (the default): --learning_rate after an optional linear warm-up,
  multiplied by --decay_factor whenever dev stops improving
  (nmt_tf.training.callbacks.LearningRateControl does that part, at
  evaluations).
- linear, cosine, 1-sqrt: budgeted training (Li, Yumer & Ramanan 2020, "Budgeted
  Training: Rethinking Deep Neural Network Training Under Resource
  Constraints"). After the warm-up the rate falls from --learning_rate to
  --final_lr_fraction of it exactly when the budget ends, so a run cut by
  --max_steps or --max_hours ends annealed instead of at full rate. A step
  budget is known; an hour budget is converted to updates from the measured
  seconds per update of this run, re-estimated at every update (a resumed
  run on another CPU measures its own).
  With --lr_decay_fraction below 1 the rate stays at --learning_rate until
  only that share of the budget is left and decays over it ("warm-up,
  stable, decay": Hu et al. 2024, MiniCPM; Hägele et al. 2024, "Scaling Laws
  and Compute-Optimal Training Beyond Fixed Training Durations", where a
  linear cool-down over the last 20% matched a cosine over the whole run).
  1-sqrt is Hägele et al.'s cool-down shape, 1 - sqrt(progress): it falls
  fastest at the start of the decay and spends longer at small rates than
  a linear decay, which it beat in their runs.
"""

from __future__ import annotations

import math

from nmt_tf.config import LR_SCHEDULES

SCHEDULES = LR_SCHEDULES            # named where the configuration checks --lr_schedule
BUDGETED = SCHEDULES[1:]


class ScheduleError(ValueError):
    """Flags of the schedule that cannot work together."""


def check(schedule: str, warmup_steps: int, max_steps: int, max_hours: float, decay_factor: float,
          multi_worker: bool = False, decay_fraction: float = 1.0) -> None:
    """Raises ScheduleError for a budgeted schedule without a budget, with
    plateau decay on top, or with a warm-up as long as its step budget; for a
    decay fraction given to the plateau schedule (its range, above 0 and at
    most 1, is the configuration's to check); and under a multi-worker
    strategy without --max_steps (each worker measures its own time, and
    workers that set different rates would apply the same gradient
    differently: the schedule follows the step budget alone there)."""
    if schedule not in SCHEDULES:
        raise ScheduleError(f"--lr_schedule={schedule}: not one of {', '.join(SCHEDULES)}.")
    if schedule not in BUDGETED:
        if decay_fraction != 1.0:
            raise ScheduleError(f"--lr_decay_fraction={decay_fraction:g} shapes the decay of --lr_schedule=linear "
                                f"or cosine; --lr_schedule={schedule} would ignore it.")
        return
    if multi_worker and not max_steps:
        raise ScheduleError(f"--lr_schedule={schedule} under --distribution=multi_worker decays over --max_steps "
                            "(each worker would measure its own time for --max_hours): give --max_steps.")
    if not max_steps and not max_hours:
        raise ScheduleError(f"--lr_schedule={schedule} decays the learning rate to the end of the training "
                            "budget: give --max_steps or --max_hours.")
    if decay_factor < 1.0:
        raise ScheduleError(f"--lr_schedule={schedule} sets the learning rate at every update, so the plateau "
                            f"decay of --decay_factor={decay_factor:g} cannot apply: set --decay_factor=1, or use "
                            "--lr_schedule=plateau.")
    if max_steps and warmup_steps >= max_steps:
        raise ScheduleError(f"--warmup_steps={warmup_steps} leaves nothing of --max_steps={max_steps} "
                            f"for --lr_schedule={schedule} to decay over.")


class LearningRateSchedule:
    """The learning rate of an update, from the update count and the time spent.

    `rate(step, train_seconds, seconds_per_step)` is the rate update `step`
    (counted from 0) uses, or None where the schedule leaves the optimizer's
    current rate alone (plateau after its warm-up, whose rate the plateau decay
    owns). `train_seconds` is the training time summed over resumed runs (what
    --max_hours bounds) and `seconds_per_step` this run's measured time per
    update, or None before it is known.
    """

    def __init__(self, schedule: str, base_rate: float, warmup_steps: int = 0, max_steps: int = 0,
                 max_hours: float = 0.0, final_fraction: float = 0.0, decay_fraction: float = 1.0):
        self.schedule = schedule
        self.base_rate = float(base_rate)
        self.warmup_steps = int(warmup_steps)
        self.max_steps = int(max_steps)
        self.max_hours = float(max_hours)
        self.final_fraction = float(final_fraction)
        self.decay_fraction = float(decay_fraction)

    def describe(self) -> str:
        """One line for the training log."""
        warmup = f", warm-up over {self.warmup_steps:,} updates" if self.warmup_steps else ""
        if not self.budgeted:
            return f"{self.base_rate:g}{warmup}"
        ends = " or ".join(([f"update {self.max_steps:,}"] if self.max_steps else [])
                           + ([f"{self.max_hours:g} training hours"] if self.max_hours else []))
        first = " (whichever comes first)" if self.max_steps and self.max_hours else ""
        held = (f", held until the last {self.decay_fraction * 100:g}% of the budget, then" if self.decay_fraction < 1
                else ",")
        return (f"{self.base_rate:g}{warmup}{held} {self.schedule} decay to {self.final_fraction:g} of it "
                f"at {ends}{first}")

    @property
    def budgeted(self) -> bool:
        return self.schedule in BUDGETED

    def budget_steps(self, step: int, train_seconds: float, seconds_per_step: float | None) -> float | None:
        """The update count at which the budget ends: --max_steps, the updates
        the rest of --max_hours buys at `seconds_per_step`, or the smaller of
        the two; None while an hour budget has no measured rate yet."""
        budgets = []
        if self.max_steps:
            budgets.append(float(self.max_steps))
        if self.max_hours:
            if seconds_per_step is None or seconds_per_step <= 0:
                if not budgets:
                    return None
            else:
                left = max(self.max_hours * 3600.0 - train_seconds, 0.0)
                budgets.append(step + left / seconds_per_step)
        return min(budgets)

    def decay(self, progress: float) -> float:
        """The factor of --learning_rate at `progress` (0 to 1) through the decay."""
        progress = min(max(progress, 0.0), 1.0)
        if self.schedule == "linear":
            shape = 1.0 - progress
        elif self.schedule == "cosine":
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            shape = 1.0 - math.sqrt(progress)
        return self.final_fraction + (1.0 - self.final_fraction) * shape

    def rate(self, step: int, train_seconds: float = 0.0, seconds_per_step: float | None = None) -> float | None:
        if self.warmup_steps and step < self.warmup_steps:
            # Linear warm-up: update k (from 0) uses (k + 1) / warmup of the rate.
            return self.base_rate * (step + 1) / self.warmup_steps
        if not self.budgeted:
            # The last warm-up update has set the full rate; the plateau decay owns it from here.
            return None
        budget = self.budget_steps(step, train_seconds, seconds_per_step)
        if budget is None:
            return self.base_rate
        # The decay covers the last decay_fraction of the updates after the warm-up; before it, the full rate.
        span = (budget - self.warmup_steps) * self.decay_fraction
        start = budget - span
        return self.base_rate * self.decay((step - start) / span if span > 0 else 1.0)
