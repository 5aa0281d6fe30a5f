"""The training loop: whole-crop dense steps with masked errors (or classical patch minibatches), DDP-ready.

Every random choice of a sample (its crop, flips, turns and mask) is drawn from a generator keyed by
``(seed, epoch, global position in the epoch)`` (:func:`~densecnn.train.crops.sample_generator`), and the data order
comes from ``DistributedSampler(seed, epoch)``. So N processes draw exactly the samples of one process with the same
global batch, and a run resumed from a checkpoint (even mid-epoch) redraws exactly what it would have drawn.
The loss of a step is the mean over the selected pixels of the whole global batch (sums are all-reduced before
dividing), whatever their split over processes.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from .. import masks, zoo
from ..convert import convert
from ..losses import masked_cross_entropy_terms, pixel_cross_entropy
from ..modelfile import CONFIG_FILE, default_palette, load, save
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import TrainConfig
from .crops import CropSampler, sample_generator
from .dataset import IGNORE_INDEX, infer_channels, read_class_info, read_dataset
from .dataset import normalization_stats as compute_normalization
from .distributed import Distributed, setup, teardown
from .metrics import MetricsLog, confusion_matrix, segmentation_scores
from .modelcard import write_model_card
from .plots import plot_metrics


def train(config: TrainConfig) -> Path:
    """Run (or resume) a training run; returns the final model directory ``OUT/model``.

    >>> from densecnn.train import TrainConfig, train
    >>> train(TrainConfig(model="tiny", classes=3, data="data/toy/train", val="data/toy/val", out="runs/toy"))
    PosixPath('runs/toy/model')
    """
    config.check()
    distributed = setup(config.device)
    try:
        return Trainer(config, distributed).run()
    finally:
        teardown(distributed)


class _Scorer(nn.Module):
    """The patch model and its dense net behind one forward, so DDP sees (and syncs) every parameter once."""

    def __init__(self, model: nn.Module, dense: nn.Module):
        super().__init__()
        self.model, self.dense = model, dense

    def forward(self, x: torch.Tensor, method: str) -> torch.Tensor:
        # dense: (B, C, c+R-1, c+R-1) context crops -> (B, K, c, c); patches: (M, C, Ph, Pw) -> (M, K, 1, 1)
        # run_padded: the dense layers on an already padded input, with the solvers the find step chose
        return self.dense.run_padded(x) if method == "dense" else self.model(x).reshape(len(x), -1, 1, 1)


class Trainer:
    def __init__(self, config: TrainConfig, distributed: Distributed):
        self.dist, self.device = distributed, distributed.device
        self.run_dir = Path(config.out)
        state = self._resume_state(config)
        if state is not None:
            config = TrainConfig.from_dict({**state["config"], "resume": True, "out": config.out})
        self.config = config
        self.strategy = masks.parse(config.mask)
        self._build_model(state)
        self._read_data()
        self._build_optimizer(state)
        self.step = state["step"] if state else 0
        self.epoch = state["epoch"] if state else 0
        self.next_batch = state["next_batch"] if state else 0
        self.train_seconds = state["train_seconds"] if state else 0.0
        if state is not None:
            torch.set_rng_state(state["rng"]["torch"])
        self.log = None
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.log = MetricsLog(
                self.run_dir / "metrics.jsonl", keep_until_step=self.step if state else None
            )

    # --- setup -------------------------------------------------------------------------------------------------

    def _resume_state(self, config: TrainConfig) -> dict | None:
        latest = latest_checkpoint(config.out)
        if not config.resume:
            if latest is not None:
                raise ValueError(
                    f"{config.out} already holds a run (checkpoint {latest.name}); "
                    "continue it with --resume, or choose a new --out"
                )
            return None
        if latest is None:
            raise ValueError(f"--resume: {config.out} has no checkpoint to resume from")
        return load_checkpoint(latest)

    def _build_model(self, state: dict | None) -> None:
        config = self.config
        if (Path(config.model) / CONFIG_FILE).is_file():
            loaded = load(config.model)
            if config.classes is not None and config.classes != loaded.num_classes:
                raise ValueError(
                    f"--classes {config.classes}: {config.model} predicts {loaded.num_classes} classes; "
                    "fine-tuning keeps the model's classes"
                )
            self.model, self.patch_size = loaded.model, loaded.patch_size
            self.num_classes, self.in_channels = loaded.num_classes, loaded.in_channels
            self.class_names, self.palette = loaded.class_names, loaded.palette
            self.normalization, self.padding_mode = loaded.normalization, loaded.padding_mode
        else:
            info = read_class_info(config.data)
            classes = config.classes or (len(info.names) if info.names else None)
            if classes is None:
                raise ValueError(
                    f"--model {config.model} is a zoo name: give the number of classes with --classes "
                    f"(or put a classes.json with names in {config.data})"
                )
            self.in_channels = config.channels or infer_channels(config.data)
            torch.manual_seed(config.seed)  # the same initial weights on every process
            try:
                self.model, patch = zoo.create(
                    config.model, in_channels=self.in_channels, num_classes=classes
                )
            except ValueError as exc:
                raise ValueError(f"--model {config.model}: not a model directory, and {exc}") from None
            self.patch_size = (patch, patch) if isinstance(patch, int) else tuple(patch)
            self.num_classes = classes
            names_fit = info.names is not None and len(info.names) == classes
            self.class_names = list(info.names) if names_fit else [f"class_{k}" for k in range(classes)]
            palette_fits = names_fit and info.palette is not None and len(info.palette) == classes
            self.palette = info.palette if palette_fits else default_palette(classes)
            self.normalization, self.padding_mode = None, config.padding_mode  # stats come with the data
        if state is not None:
            self.model.load_state_dict(state["model"])
            self.normalization = state["normalization"]
        # eval mode for good: BatchNorm uses its running statistics and dropout is off, which is what makes the
        # dense gradient equal to the patch-minibatch gradient (DESIGN.md, "Backward")
        self.model.to(self.device).eval()
        self.dense = convert(self.model, self.patch_size, padding_mode=self.padding_mode)
        self.scorer = _Scorer(self.model, self.dense)
        self.net = self.scorer
        if self.dist.enabled:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = DistributedDataParallel(self.scorer, device_ids=device_ids)

    def _read_data(self) -> None:
        config = self.config
        train = read_dataset(config.data, channels=self.in_channels, num_classes=self.num_classes)
        val = (
            read_dataset(config.val, channels=self.in_channels, num_classes=self.num_classes)
            if config.val
            else []
        )
        if self.normalization is None:
            self.normalization = compute_normalization(train)
        smallest = min(min(s.labels.shape) for s in train)
        self.crop = min(config.crop, smallest)
        if self.crop < config.crop and self.dist.is_main:
            print(
                f"densecnn train: --crop {config.crop} is larger than the smallest image; using {self.crop}"
            )
        self.train_samples, self.val_samples = train, val
        sampler_images = [self._normalized(s.image) for s in train]
        self.crops = CropSampler(
            sampler_images,
            [torch.from_numpy(s.labels) for s in train],
            patch_size=self.patch_size,
            padding_mode=self.padding_mode,
            crop=self.crop,
            flip=config.flip,
            rot90=config.rot90,
        )
        self.sampler = DistributedSampler(
            range(len(train) * config.crops_per_image),
            num_replicas=self.dist.world_size,
            rank=self.dist.rank,
            shuffle=True,
            seed=config.seed,
        )
        if config.batch % self.dist.world_size:
            raise ValueError(
                f"--batch {config.batch} (images per step, all processes together) must be divisible by the "
                f"{self.dist.world_size} processes"
            )
        self.local_batch = config.batch // self.dist.world_size
        self.steps_per_epoch = len(self.sampler) // self.local_batch
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"an epoch has {len(train)} images x {config.crops_per_image} crops, fewer than --batch "
                f"{config.batch}; raise --crops-per-image or lower --batch"
            )
        self.total_steps = config.epochs * self.steps_per_epoch

    def _normalized(self, image: np.ndarray) -> torch.Tensor:
        mean = torch.tensor(self.normalization["mean"], dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(self.normalization["std"], dtype=torch.float32).view(-1, 1, 1)
        return (torch.from_numpy(image) - mean) / std  # (C, H, W)

    def _build_optimizer(self, state: dict | None) -> None:
        config = self.config
        parameters = list(self.model.parameters())
        if config.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(
                parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
            )
        else:
            self.optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=config.weight_decay)
        if config.schedule == "cosine":
            self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
                self.optimizer, T_max=self.total_steps
            )
        else:
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        self.class_weights = None
        if config.class_weights is not None:
            if len(config.class_weights) != self.num_classes:
                raise ValueError(
                    f"--class-weights has {len(config.class_weights)} values for {self.num_classes} classes"
                )
            self.class_weights = torch.tensor(config.class_weights, dtype=torch.float32, device=self.device)
        if state is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])

    # --- the loop ----------------------------------------------------------------------------------------------

    def run(self) -> Path:
        config = self.config
        bar = self._progress_bar()
        val_scores = None
        while self.step < self.total_steps:
            self.sampler.set_epoch(self.epoch)
            order = list(self.sampler)
            for batch_index in range(self.next_batch, self.steps_per_epoch):
                started = time.perf_counter()
                record = self._train_step(order, batch_index)
                elapsed = time.perf_counter() - started
                self.train_seconds += elapsed
                self.step += 1
                self.next_batch = batch_index + 1
                record.update(
                    kind="train",
                    epoch=self.epoch,
                    step=self.step,
                    lr=self.scheduler.get_last_lr()[0],
                    images_per_s=config.batch / elapsed,
                    train_seconds=self.train_seconds,
                )
                self._write(record)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{record['loss']:.4f}", refresh=False)
                epoch_done = self.next_batch == self.steps_per_epoch
                last = self.step == self.total_steps
                if self.val_samples and (_due(self.step, config.val_every, epoch_done) or last):
                    val_scores = self.validate()
                    if bar is not None and val_scores["mean_iou"] is not None:
                        bar.set_postfix(
                            loss=f"{record['loss']:.4f}", val_miou=f"{val_scores['mean_iou']:.3f}"
                        )
                if epoch_done:
                    self.epoch, self.next_batch = self.epoch + 1, 0
                if _due(self.step, config.checkpoint_every, epoch_done) or last:
                    self._checkpoint()
            self.next_batch = 0
        if bar is not None:
            bar.close()
        return self._finish(val_scores)

    def _progress_bar(self):
        if not self.dist.is_main:
            return None
        from tqdm.auto import tqdm

        return tqdm(
            total=self.total_steps, initial=self.step, desc="densecnn train", unit="step", dynamic_ncols=True
        )

    def _train_step(self, order: list[int], batch_index: int) -> dict:
        """One optimiser step on this process's share of the global batch; returns the global train metrics."""
        world, rank, b = self.dist.world_size, self.dist.rank, self.local_batch
        generators, images, labels = [], [], []
        for j, sample_index in enumerate(order[batch_index * b : (batch_index + 1) * b]):
            generator = sample_generator(self.config.seed, self.epoch, (batch_index * b + j) * world + rank)
            crop = self.crops.sample(sample_index % len(self.train_samples), generator)
            generators.append(generator)
            images.append(crop.image)
            labels.append(crop.labels)
        images = torch.stack(images).to(self.device)  # (B, C, c+Ph-1, c+Pw-1)
        labels = torch.stack(labels).to(self.device)  # (B, c, c)
        bf16 = self.config.bf16
        if self.config.method == "dense":
            (rh, rw), c = self.dense.receptive_field, self.crop
            context = images[:, :, : c + rh - 1, : c + rw - 1]  # (B, C, c+Rh-1, c+Rw-1)
            # the dense solvers compute in the input's dtype, casting the float32 weights on the fly (what autocast
            # does for torch's ops; densecnn's own kernels are not autocast-aware), gradients land in float32
            scores = self.net(context.bfloat16() if bf16 else context, "dense")  # (B, K, c, c)
            pixel_loss = pixel_cross_entropy(scores, labels) if self.strategy.needs_loss else None
            mask = self._select(labels, generators, pixel_loss)  # (B, c, c)
            targets = labels
        else:
            mask = self._select(labels, generators, None)
            image, row, col = (mask & (labels != IGNORE_INDEX)).nonzero(as_tuple=True)
            (ph, pw) = self.patch_size
            windows = images.unfold(2, ph, 1).unfold(3, pw, 1)  # (B, C, c, c, Ph, Pw)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
                scores = self.net(windows[image, :, row, col], "patches")  # (M, K, 1, 1)
            targets = labels[image, row, col].view(-1, 1, 1)  # (M, 1, 1)
            mask = None
        loss_sum, weight_sum = masked_cross_entropy_terms(
            scores, targets, mask, class_weights=self.class_weights
        )
        counted = targets != IGNORE_INDEX if mask is None else mask & (targets != IGNORE_INDEX)
        correct = ((scores.detach().argmax(1) == targets) & counted).sum()
        totals = self.dist.sum(
            torch.stack([loss_sum.detach(), weight_sum, correct.float(), counted.sum().float()])
        )
        # DDP averages gradients over processes: scale so the result is the global-batch mean
        loss = loss_sum * world / totals[1].clamp(min=torch.finfo(totals.dtype).tiny)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return {
            "loss": (totals[0] / totals[1].clamp(min=1e-12)).item(),
            "pixel_accuracy": (totals[2] / totals[3].clamp(min=1)).item(),
            "selected_pixels": int(totals[3].item()),
        }

    def _select(self, labels, generators, pixel_loss) -> torch.Tensor:
        return torch.cat(
            [
                self.strategy(
                    labels[i : i + 1],
                    pixel_loss=None if pixel_loss is None else pixel_loss[i : i + 1],
                    generator=generator,
                )
                for i, generator in enumerate(generators)
            ]
        )

    @torch.no_grad()
    def validate(self) -> dict:
        """Whole-image dense prediction on the validation set (split over processes); logs and returns scores."""
        k = self.num_classes
        confusion = torch.zeros(k, k, dtype=torch.float64, device=self.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        count = torch.zeros((), dtype=torch.float64, device=self.device)
        for index in range(self.dist.rank, len(self.val_samples), self.dist.world_size):
            sample = self.val_samples[index]
            image = self._normalized(sample.image)[None].to(self.device)  # (1, C, H, W)
            labels = torch.from_numpy(sample.labels)[None].to(self.device)  # (1, H, W)
            scores = self.dense(image)  # (1, K, H, W)
            confusion += confusion_matrix(scores.argmax(1), labels, k).to(confusion)
            part_sum, part_count = masked_cross_entropy_terms(scores, labels)
            loss_sum += part_sum.double()
            count += part_count.double()
        confusion, loss_sum, count = (self.dist.sum(t) for t in (confusion, loss_sum, count))
        scores = segmentation_scores(confusion)
        record = {
            "kind": "val",
            "epoch": self.epoch,
            "step": self.step,
            "loss": (loss_sum / count).item(),
            **scores,
        }
        record["train_seconds"] = self.train_seconds
        self._write(record)
        if self.dist.is_main:
            plot_metrics(self.run_dir / "metrics.jsonl", self.run_dir, self.class_names)
        return scores

    def _write(self, record: dict) -> None:
        if self.log is not None:
            self.log.write(record)

    def _checkpoint(self) -> None:
        if self.dist.is_main:
            state = {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "epoch": self.epoch,
                "next_batch": self.next_batch,
                "step": self.step,
                "train_seconds": self.train_seconds,
                "rng": {"torch": torch.get_rng_state()},
                "normalization": self.normalization,
                "config": self.config.to_dict(),
            }
            save_checkpoint(self.run_dir, state, step=self.step, keep=self.config.keep_checkpoints)
        self.dist.barrier()

    def _finish(self, val_scores: dict | None) -> Path:
        model_dir = self.run_dir / "model"
        if self.dist.is_main:
            self._save_model(model_dir, val_scores)
        self.dist.barrier()
        return model_dir

    def _save_model(self, model_dir: Path, val_scores: dict | None) -> None:
        config = self.config
        training = {
            "method": config.method,
            "mask": str(self.strategy),
            "steps": self.step,
            "epochs": config.epochs,
            "train_seconds": round(self.train_seconds, 1),
            "processes": self.dist.world_size,
            "val": val_scores,
            "config": config.to_dict(),
        }
        save(
            self.model.cpu(),
            model_dir,
            patch_size=self.patch_size,
            class_names=self.class_names,
            palette=self.palette,
            normalization=self.normalization,
            padding_mode=self.padding_mode,
            extra={"training": training},
        )
        self.model.to(self.device)
        pixels = np.bincount(
            np.concatenate([s.labels[s.labels != IGNORE_INDEX].ravel() for s in self.train_samples]),
            minlength=self.num_classes,
        )
        model_summary = {
            "patch size": f"{self.patch_size[0]}x{self.patch_size[1]}",
            "receptive field": f"{self.dense.receptive_field[0]}x{self.dense.receptive_field[1]}",
            "input channels": self.in_channels,
            "classes": ", ".join(f"{k} {name}" for k, name in enumerate(self.class_names)),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "padding mode": self.padding_mode,
            "normalisation": f"mean {_round(self.normalization['mean'])}, std {_round(self.normalization['std'])}",
            "started from": f"`{config.model}`",
        }
        data_summary = {
            "training set": f"`{config.data}`: {_count(self.train_samples, 'image')}: "
            + ", ".join(f"{s.name} {s.labels.shape[0]}x{s.labels.shape[1]}" for s in self.train_samples[:5])
            + (" ..." if len(self.train_samples) > 5 else ""),
            "labelled training pixels per class": ", ".join(
                f"{name} {int(n)}" for name, n in zip(self.class_names, pixels, strict=True)
            ),
            "validation set": f"`{config.val}`: {_count(self.val_samples, 'image')}"
            if config.val
            else "none",
        }
        training_summary = {
            "method": f"{config.method} ({'whole crops through the dense net' if config.method == 'dense' else 'patch minibatches'})",
            "pixel selection": f"`{self.strategy}`",
            "steps": f"{self.step} ({config.epochs} epochs x {self.steps_per_epoch} steps; {config.batch} crops of "
            f"{self.crop}x{self.crop} per step)",
            "optimiser": f"{config.optimizer}, lr {config.lr:g} ({config.schedule}), weight decay {config.weight_decay:g}",
            "augmentation": f"flips {'on' if config.flip else 'off'}, quarter turns {'on' if config.rot90 else 'off'}",
            "precision": "bfloat16 compute, float32 weights and loss" if config.bf16 else "float32",
            "processes": self.dist.world_size,
            "training time": f"{self.train_seconds:.0f} s of training steps (validation not included)",
            "seed": config.seed,
        }
        write_model_card(
            model_dir / "README.md",
            title=f"densecnn model: {', '.join(self.class_names)}",
            config=config.to_dict(),
            model_summary=model_summary,
            data_summary=data_summary,
            training_summary=training_summary,
            val_scores=val_scores,
            class_names=self.class_names,
        )


def _due(step: int, every: int, epoch_done: bool) -> bool:
    return step % every == 0 if every else epoch_done


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _round(values: list[float]) -> list[float]:
    return [float(f"{v:.4g}") for v in values]
