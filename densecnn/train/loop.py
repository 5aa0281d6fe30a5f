"""The training loop: steps, logging, validation and checkpoints on schedule, resume, the final model. DDP-ready.

The data order comes from ``DistributedSampler(seed, epoch)`` and each sample's randomness from its global position
(:mod:`densecnn.train.step`), so a run resumed from a checkpoint (even mid-epoch) redraws exactly what it would
have drawn.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection
from pathlib import Path

import torch

from .. import zoo
from ..convert import convert
from ..errors import TrainingError
from ..modelfile import CONFIG_FILE, LoadedModel
from .checkpoint import (
    Progress,
    check_data_unchanged,
    data_record,
    resume_state,
    resumed_config,
    save_checkpoint,
)
from .config import TrainConfig
from .data import TrainingData
from .distributed import Distributed, setup, teardown
from .diverged import Diverged
from .interrupts import TrainingInterrupted, interrupts_deferred
from .metrics import MetricsLog
from .model import start_model
from .optim import build_optimizer
from .plots import plot_metrics
from .record import save_trained_model
from .step import Step
from .validation import validate


def train(config: TrainConfig, given: Collection[str] | None = None) -> Path:
    """Run (or resume) a training run; returns the final model directory ``OUT/model``.

    ``given``: the options the command line gave (:func:`~densecnn.train.checkpoint.resumed_config`: a resumed
    run refuses those that would change it).

    >>> from densecnn.train import TrainConfig, train
    >>> train(TrainConfig(model="tiny", classes=3, data="data/toy/train", val="data/toy/val", out="runs/toy"))
    PosixPath('runs/toy/model')
    """
    config.check()
    distributed = setup(config.device)
    try:
        model_dir = Trainer(config, distributed, given).run()
        distributed.barrier()  # every process done before the group goes: gloo aborts one whose peer left first
        return model_dir
    finally:
        teardown(distributed)


class Trainer:
    """A run set up from its config (or its latest checkpoint, with ``resume``): model, data, optimiser, step."""

    def __init__(self, config: TrainConfig, dist: Distributed, given: Collection[str] | None = None):
        self.dist, self.run_dir = dist, Path(config.out)
        state = resume_state(config.out, config.resume)
        if state is not None:  # the run's options, and those of this session the command gives
            config = resumed_config(state["config"], config, given)
            check_data_unchanged(state.get("data"), config)  # before a file is read
        # the data as stored, kept in every checkpoint: a resume on changed data is refused
        self.data_record = data_record(config.data, config.val)
        self.progress = Progress.from_state(state)
        if config.classes is None:  # with --classes, the zoo says it (start_model)
            check_model_option(config.model)
        self.model = start_model(config, given)
        self.config = config = _as_trained(config, self.model)
        if state is not None:
            self.model.model.load_state_dict(state["model"])
            self.model.normalization = state["normalization"]
        # eval mode for good: BatchNorm uses its running statistics and dropout is off, which is what makes the
        # dense gradient equal to the patch-minibatch gradient
        self.model.model.to(dist.device).eval()
        self.dense = convert(self.model.model, self.model.patch_size, padding_mode=self.model.padding_mode)
        self.data = TrainingData(config, self.model, dist)
        self.optimizer, self.scheduler = build_optimizer(
            self.model.model.parameters(), config, self.data.total_steps
        )
        self.take_step = Step(
            config, self.model.model, self.dense, self.data, self.optimizer, self.scheduler, dist,
            self.model.num_classes,
        )  # fmt: skip
        if state is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["rng"]["torch"])
        self.log = None
        self.written: Path | None = None  # the model directory, once written
        if dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            keep_until = self.progress.step if state is not None else None
            self.log = MetricsLog(self.run_dir / "metrics.jsonl", keep_until_step=keep_until)

    def run(self) -> Path:
        """Train to the end of the schedule or of ``--max-seconds``, then write ``OUT/model``. Interrupted (Ctrl-C,
        or SIGTERM under :func:`~densecnn.train.interrupts.sigterm_stops_runs`) or failing mid-run, it writes
        ``OUT/model`` from the weights of the last completed step before the error goes on, so every run that took a
        step leaves a model directory that loads. A run whose loss or weights become NaN/±Inf stops with a
        :class:`~densecnn.errors.TrainingError` naming the step, and writes ``OUT/model`` from the last weights whose
        loss was finite (:mod:`densecnn.train.diverged`)."""
        bar = self._progress_bar()
        try:
            try:
                val_scores = self._steps(bar)
            except Diverged as exc:
                raise self._diverged(exc) from None
            except BaseException:
                if self.dist.is_main and self.progress.step > 0:
                    self._save(self.last_val_scores)
                raise
            finally:
                if bar is not None:
                    bar.close()
            return self._finish(val_scores)
        except KeyboardInterrupt as exc:
            raise TrainingInterrupted.by(exc, self.progress.step, self.written) from None

    def _diverged(self, exc: Diverged) -> TrainingError:
        """Write ``OUT/model`` from the weights the diverged step put back (the last whose loss was finite, if the run
        had any); the error that says so."""
        step = self.progress.step + 1
        self.progress.step -= exc.rewound
        kept = self.progress.step if exc.kept_finite else 0
        if kept > 0 and self.dist.is_main:  # validated weights that were undone have no scores in the model
            self._save(self.last_val_scores if not exc.rewound else None)
        if kept > 0:
            where = (
                f"{self.run_dir / 'model'} holds the weights of step {kept}, the last whose loss was finite"
            )
        elif exc.kept_finite:
            where = "no model written (the run's first update already diverged)"
        else:
            where = "no model written (the weights the run started from give a non-finite loss)"
        return TrainingError(
            f"training diverged at step {step}: {exc.what}; {where}. Train again with a lower --lr (this run's: "
            f"{self.config.lr:g}), or check the images and labels for extreme values"
        )

    def _steps(self, bar) -> dict | None:
        config, progress, data = self.config, self.progress, self.data
        started = time.monotonic()
        val_scores = self.last_val_scores = None
        while progress.step < data.total_steps:
            order = data.order(progress.epoch)
            for batch_index in range(progress.next_batch, data.steps_per_epoch):
                step_started = time.perf_counter()
                record = self.take_step(progress.epoch, order, batch_index)
                elapsed = time.perf_counter() - step_started
                progress.train_seconds += elapsed
                progress.step += 1
                progress.next_batch = batch_index + 1
                record.update(
                    kind="train",
                    epoch=progress.epoch,
                    step=progress.step,
                    lr=self.scheduler.get_last_lr()[0],
                    images_per_s=config.batch / elapsed,
                    train_seconds=progress.train_seconds,
                )
                self._write(record)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{record['loss']:.4f}", refresh=False)
                epoch_done = progress.next_batch == data.steps_per_epoch
                last = progress.step == data.total_steps
                out_of_time = self._out_of_time(started)
                last = last or out_of_time
                if data.val and (_due(progress.step, config.val_every, epoch_done) or last):
                    val_scores = self.last_val_scores = self.validate()
                    if bar is not None and val_scores["mean_iou"] is not None:
                        bar.set_postfix(
                            loss=f"{record['loss']:.4f}", val_miou=f"{val_scores['mean_iou']:.3f}"
                        )
                if epoch_done:
                    progress.epoch, progress.next_batch = progress.epoch + 1, 0
                if _due(progress.step, config.checkpoint_every, epoch_done) or last:
                    self._checkpoint()
                if out_of_time:
                    return val_scores
            progress.next_batch = 0
        return val_scores

    def _out_of_time(self, started: float) -> bool:
        """Whether ``--max-seconds`` have passed, as every process agrees (they stop after the same step)."""
        if self.config.max_seconds is None:
            return False
        late = float(time.monotonic() - started >= self.config.max_seconds)
        return bool(self.dist.sum(torch.tensor(late, device=self.dist.device)) > 0)

    def validate(self) -> dict:
        """Score the validation set, log the record and redraw the plots; returns the scores."""
        loss, scores = validate(self.model, self.dense, self.data.val, self.dist)
        progress = self.progress
        self._write(
            {"kind": "val", "epoch": progress.epoch, "step": progress.step, "loss": loss, **scores,
             "train_seconds": progress.train_seconds}
        )  # fmt: skip
        if self.dist.is_main:
            plot_metrics(self.run_dir / "metrics.jsonl", self.run_dir, self.model.class_names)
        return scores

    def _progress_bar(self):
        if not self.dist.is_main:
            return None
        from tqdm.auto import tqdm

        return tqdm(
            total=self.data.total_steps,
            initial=self.progress.step,
            desc="densecnn train",
            unit="step",
            dynamic_ncols=True,
        )

    def _write(self, record: dict) -> None:
        if self.log is not None:
            self.log.write(record)

    def _checkpoint(self) -> None:
        if self.dist.is_main:
            state = {
                "model": self.model.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                **self.progress.to_dict(),
                "rng": {"torch": torch.get_rng_state()},
                "normalization": self.model.normalization,
                "config": self.config.to_dict(),
                "data": self.data_record,
            }
            save_checkpoint(self.run_dir, state, step=self.progress.step, keep=self.config.keep_checkpoints)
        self.dist.barrier()

    def _finish(self, val_scores: dict | None) -> Path:
        model_dir = self.run_dir / "model"
        if self.dist.is_main:
            self._save(val_scores)
        self.dist.barrier()
        return model_dir

    def _save(self, val_scores: dict | None) -> Path:
        with interrupts_deferred():  # a Ctrl-C meanwhile waits until the directory is whole
            save_trained_model(
                self.run_dir / "model",
                config=self.config,
                model=self.model,
                dense=self.dense,
                data=self.data,
                progress=self.progress,
                processes=self.dist.world_size,
                val_scores=val_scores,
            )
            self.written = self.run_dir / "model"
            return self.written


def _as_trained(config: TrainConfig, model: LoadedModel) -> TrainConfig:
    """``config`` with the padding mode of the ``model`` it trains (a fine-tuned model keeps its own), and its
    command written so: what the run's checkpoints, model.json and card record."""
    if config.padding_mode == model.padding_mode:
        return config
    trained = dataclasses.replace(config, padding_mode=model.padding_mode)
    if config.command:
        trained.command = trained.command_line(config.launcher())
    return trained


def check_model_option(model: str) -> None:
    """Refuse a ``--model`` that is neither a model directory nor a zoo name, saying which it is not."""
    if (Path(model) / CONFIG_FILE).is_file() or model in zoo.list_models():
        return
    what = f"a folder without {CONFIG_FILE}" if Path(model).is_dir() else "no such directory"
    try:
        zoo.spatial_dims(model)
    except ValueError as exc:  # the zoo's own words: "Unknown model ...; the zoo has ..."
        raise TrainingError(
            f"--model {model}: not a model directory ({what}), and {exc}; give a model directory (written by "
            f"densecnn train or densecnn.save: {CONFIG_FILE} + weights) or a zoo name"
        ) from None


def _due(step: int, every: int, epoch_done: bool) -> bool:
    return step % every == 0 if every else epoch_done
