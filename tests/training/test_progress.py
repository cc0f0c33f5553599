"""Training progress in logs that are not a terminal (dflash.progress) and the
Lightning log plumbing of the apps (dflash.cli.train.quiet_third_party_logs)."""

import io
import logging
from types import SimpleNamespace

import pytest
from lightning.pytorch.trainer.states import TrainerFn

from dflash.cli.train import quiet_third_party_logs
from dflash.fit_progress import LineProgress, training_progress
from dflash.progress import PROGRESS_INTERVAL_S, bar_interval, format_duration


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_trainer(max_steps=100, step=0):
    return SimpleNamespace(
        global_step=step,
        max_steps=max_steps,
        is_global_zero=True,
        callback_metrics={},
        sanity_checking=False,
        state=SimpleNamespace(fn=TrainerFn.FITTING),
    )


def progress_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "dflash.progress"]


def test_a_line_every_interval_with_mean_loss_rate_and_eta(caplog):
    caplog.set_level(logging.INFO, logger="dflash.progress")
    clock = FakeClock()
    callback, trainer = LineProgress("train", interval_s=30, clock=clock), fake_trainer(max_steps=100, step=10)
    callback.on_train_start(trainer, None)  # a resumed run: steps 1-10 were another process's
    for step, loss in zip(range(11, 21), [4.0, 2.0] * 5):
        clock.now += 2.0  # 0.5 steps/s
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, {"loss": loss}, None, step)
    assert progress_lines(caplog) == []  # 20 s < 30 s
    for step in range(21, 26):
        clock.now += 2.0
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, {"loss": 1.0}, None, step)
    # First line at 30 s (step 25): mean loss of the 15 steps, rate over this run's own steps.
    assert progress_lines(caplog) == ["train: step 25/100 (25%), loss 2.333, 0.50 steps/s, elapsed 0:00:30, ETA 0:02:30"]
    for step in range(26, 41):
        clock.now += 2.0
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, {"loss": 5.0}, None, step)
        assert len(progress_lines(caplog)) == (1 if step < 40 else 2)  # the interval starts again at each line
    assert progress_lines(caplog)[1].startswith("train: step 40/100 (40%), loss 5.000, 0.50 steps/s, elapsed 0:01:00")


def test_the_last_step_and_validation_always_get_a_line(caplog):
    caplog.set_level(logging.INFO, logger="dflash.progress")
    clock = FakeClock()
    callback, trainer = LineProgress("train", interval_s=30, clock=clock), fake_trainer(max_steps=3)
    callback.on_train_start(trainer, None)
    for step in (1, 2, 3):
        clock.now += 1.0
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, {"loss": 1.5}, None, step)
    assert progress_lines(caplog) == ["train: step 3/3 (100%), loss 1.500, 1.00 steps/s, elapsed 0:00:03, ETA 0:00:00"]
    trainer.callback_metrics = {"val/loss": 1.25, "val/tau_sim": 2.5}
    callback.on_validation_end(trainer, None)
    assert progress_lines(caplog)[-1] == "train: validation at step 3: loss 1.250, tau_sim 2.500"
    trainer.state.fn = TrainerFn.VALIDATING  # trainer.validate() after training: not training progress
    callback.on_validation_end(trainer, None)
    assert len(progress_lines(caplog)) == 2


def test_bar_on_a_terminal_lines_elsewhere(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdout", Terminal())
    assert training_progress(True) == (True, [])
    monkeypatch.setattr("sys.stdout", io.StringIO())
    show_bar, callbacks = training_progress(True)
    assert not show_bar and [type(c) for c in callbacks] == [LineProgress]
    assert training_progress(False) == (False, [])


def test_bars_redraw_rarely_in_a_log_and_tqdm_mininterval_wins(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    monkeypatch.setattr("sys.stdout", Terminal())
    assert bar_interval(terminal_s=2.0) == 2.0
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert bar_interval(terminal_s=2.0) == PROGRESS_INTERVAL_S
    monkeypatch.setenv("TQDM_MININTERVAL", "7")
    assert bar_interval() == 7.0
    monkeypatch.setenv("TQDM_MININTERVAL", "often")
    assert bar_interval() == PROGRESS_INTERVAL_S


@pytest.mark.parametrize("seconds, text", [(0, "0:00:00"), (59.6, "0:01:00"), (3725, "1:02:05"), (-4, "0:00:00")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_lightning_lines_reach_the_root_handlers_once_and_tips_are_dropped(monkeypatch):
    import lightning  # noqa: F401 - attaches Lightning's own console handler

    # As inside a Hydra app, which configures logging before Lightning is imported.
    monkeypatch.setattr(logging.getLogger("lightning.pytorch"), "propagate", True)

    root, lightning_logger = logging.getLogger(), logging.getLogger("lightning")
    stream = io.StringIO()
    root_handler = logging.StreamHandler(stream)
    lightning_stream = io.StringIO()
    lightning_handler = logging.StreamHandler(lightning_stream)  # stands in for the one Lightning attaches
    root.addHandler(root_handler)
    lightning_logger.addHandler(lightning_handler)
    try:
        quiet_third_party_logs()
        rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
        rank_zero.info("GPU available: False, used: False")
        rank_zero.info("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]")
    finally:
        root.removeHandler(root_handler)
        lightning_logger.removeHandler(lightning_handler)
    assert lightning_handler not in lightning_logger.handlers
    assert lightning_stream.getvalue() == ""
    assert stream.getvalue() == "GPU available: False, used: False\n"


def test_a_time_budget_shows_its_eta_and_the_end_gets_a_line(caplog):
    import datetime

    from lightning.pytorch.callbacks import Timer

    caplog.set_level(logging.INFO, logger="dflash.progress")
    clock = FakeClock()
    timer = Timer(duration=datetime.timedelta(seconds=90))  # not started: 90 s remain
    trainer = fake_trainer(max_steps=-1)
    trainer.estimated_stepping_batches, trainer.callbacks = float("inf"), [timer]
    callback = LineProgress("train", interval_s=30, clock=clock)
    callback.on_train_start(trainer, None)
    for step in range(1, 17):
        clock.now += 2.0
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, {"loss": 1.0}, None, step)
    # no step count to reach: the line gives the step and the budget's remaining time
    assert progress_lines(caplog) == ["train: step 15, loss 1.000, 0.50 steps/s, elapsed 0:00:30, ETA 0:01:30"]
    callback.on_train_end(trainer, None)  # the budget ended training after step 16
    assert progress_lines(caplog)[-1].startswith("train: step 16, loss 1.000")
    callback.on_train_end(trainer, None)  # nothing new since: no second line
    assert len(progress_lines(caplog)) == 2
