"""The ImageFolder recipe of the vision trainer (``sret-train-vision``): images read from disk
by a loader, AdamW without weight decay on vectors, DeiT's warm-up-then-cosine schedule per
update, label smoothing or soft distillation, mixed depth and mixed precision.

    from fairseq_sret.vision import create_model
    from fairseq_sret_cli.vision_trainer.folder_recipe import TrainConfig, train
    model = create_model("sret_t", num_classes=10)
    stats = train(model, train_loader, TrainConfig(epochs=30), device=torch.device("cpu"),
                  val_loader=val_loader, output="runs/sret_t")

``train_loader`` yields ``(images, target, index)`` (``ImageFolder(..., return_index=True)``;
the index looks up pre-computed teacher logits). With ``output`` every epoch writes
``checkpoint_best.pt`` (when the validation top-1 is the best so far), then a line of
``log.jsonl``, then ``checkpoint_last.pt`` (also the optimizer and scaler state: ``resume``
continues from it, dropping the log lines of the epochs it trains again); each file is
replaced atomically.
"""

import os
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from fairseq_sret import json_text
from fairseq_sret.checkpoints import load_checkpoint as load_checkpoint_file
from fairseq_sret.core.mixed_depth import DepthTerm
from fairseq_sret.vision.weights import save_checkpoint
from ..fingerprints import legacy
from .evaluation import evaluate
from .loop import EpochTotals, Trainer, fit
from .objectives import NO_AMP, Amp, Objective
from .record import append_log_line, check_resumable, check_resumed_settings, drop_log_lines_from
from .schedules import WarmupCosine, param_groups


@dataclass
class TrainConfig:
    """The settings of :func:`train` (``sret-train-vision``'s options of the same names)."""

    epochs: int = 300
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_lr: float = 1e-6
    warmup_epochs: float = 5
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    clip_grad: Optional[float] = None
    distill_temperature: float = 1.0
    max_steps_per_epoch: Optional[int] = None
    log_interval: int = 50


def train(
    model: nn.Module,
    train_loader,
    config: TrainConfig,
    *,
    device: torch.device,
    amp: Amp = NO_AMP,
    val_loader=None,
    net: Optional[Callable] = None,
    teacher: Optional[nn.Module] = None,
    teacher_logits: Optional[Tensor] = None,
    depth_terms: Sequence[DepthTerm] = (),
    output: Optional[str] = None,
    resume: Optional[str] = None,
    checkpoint_extra: Optional[dict] = None,
    options: Optional[dict] = None,
    on_start: Optional[Callable[[], None]] = None,
    on_saved: Optional[Callable[[], None]] = None,
) -> dict:
    """Train ``model`` for ``config.epochs`` epochs; returns the last epoch's statistics.

    ``net``: the module that runs (e.g. ``torch.compile(model)``; default ``model``), while
    ``model`` keeps the parameters and their names. ``teacher`` / ``teacher_logits`` (rows
    in dataset order): soft distillation without the one-hot label. ``depth_terms``: mixed
    depth (:func:`fairseq_sret.core.mixed_depth.mixed_depth_loss`). ``resume``: a
    ``checkpoint_last.pt``, read through the checkpoint allow-list
    (:func:`fairseq_sret.checkpoints.load_checkpoint`). ``checkpoint_extra`` is saved in
    both checkpoints (e.g. the model's name and arguments), ``options`` in
    ``checkpoint_last.pt`` as ``args``. ``on_start`` runs once ``resume`` has loaded, before
    the first epoch; ``on_saved`` after each epoch's files are written (e.g. an old run they
    replace may go).
    """
    run = FolderRun(model, train_loader, config, device=device, amp=amp, net=net, teacher=teacher,
                    teacher_logits=teacher_logits, depth_terms=depth_terms, val_loader=val_loader, output=output,
                    checkpoint_extra=checkpoint_extra, options=options, on_saved=on_saved)
    start_epoch = run.resume(resume) if resume else 0
    if on_start is not None:
        on_start()
    if output:
        os.makedirs(output, exist_ok=True)
    return fit(run.trainer, run, start_epoch, config.epochs) or {}


class FolderRun:
    """The state of :func:`train`: the model, its optimizer, gradient scaler and schedule, and
    the hooks :func:`~.loop.fit` calls each epoch."""

    def __init__(self, model, train_loader, config: TrainConfig, *, device, amp: Amp, net, teacher, teacher_logits,
                 depth_terms, val_loader, output, checkpoint_extra, options, on_saved):
        self.model, self.train_loader, self.config, self.device = model, train_loader, config, device
        self.net = model if net is None else net
        self.depth_terms, self.val_loader, self.amp, self.output = depth_terms, val_loader, amp, output
        self.extra, self.options, self.on_saved = dict(checkpoint_extra or {}), dict(options or {}), on_saved
        self.optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr)
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp[2])
        self.steps_per_epoch = len(train_loader)
        if config.max_steps_per_epoch:
            self.steps_per_epoch = min(self.steps_per_epoch, config.max_steps_per_epoch)
        self.scheduler = WarmupCosine(self.optimizer, epochs=config.epochs, steps_per_epoch=self.steps_per_epoch,
                                      lr=config.lr, min_lr=config.min_lr, warmup_lr=config.warmup_lr,
                                      warmup_epochs=config.warmup_epochs)
        objective = Objective(model, self.net, smoothing=config.label_smoothing, teacher=teacher,
                              teacher_logits=teacher_logits, temperature=config.distill_temperature,
                              depth_terms=depth_terms, device=device, amp=amp)
        self.trainer = Trainer(model, self.optimizer, self.scheduler, objective, self.steps_per_epoch,
                               prepare=self.prepare, scaler=self.scaler, clip_grad=config.clip_grad,
                               progress=self._progress, log_interval=config.log_interval)
        self.best = -1.0

    def resume(self, resume: str) -> int:
        """Load ``resume`` (a ``checkpoint_last.pt`` of the same run); the first epoch to train."""
        state = load_checkpoint_file(resume)
        check_resumable(resume, state)
        self._check_same_run(resume, state)
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"{resume} does not fit this run's model ({str(exc).splitlines()[0]}): resume a run"
                             " with its own --model and data") from None
        start_epoch, self.best = state["epoch"] + 1, state.get("best_acc1", -1.0)
        if start_epoch >= self.config.epochs:
            raise ValueError(f"{resume} has trained {start_epoch} epochs, all of the {self.config.epochs} asked for:"
                             " nothing to train (raise --epochs to train longer)")
        if self.output:  # a kill between an epoch's log line and its checkpoint_last.pt
            drop_log_lines_from(os.path.join(self.output, "log.jsonl"), start_epoch)
        best_file = os.path.join(os.path.dirname(resume), "checkpoint_best.pt")
        if os.path.isfile(best_file):  # saved after this checkpoint_last.pt when a kill came between
            self.best = max(self.best, load_checkpoint_file(best_file).get("best_acc1", -1.0))
        self.scheduler.step_update(start_epoch * self.steps_per_epoch)
        return start_epoch

    def _check_same_run(self, resume: str, state: dict) -> None:
        """ValueError when the data, the model or the settings differ from those ``resume`` was
        trained with."""
        for key in ("model_name", "classes", "data"):  # what the data and the command line must still be
            saved, now = state.get(key), self.extra.get(key)
            if key == "data" and legacy(saved):  # recorded before fingerprints read the images' bytes
                now = self.extra.get("data_legacy", now)
            if saved is not None and now is not None and saved != now and key == "data":
                raise ValueError(f"{resume} was trained on other images (fingerprint {saved}; --data gives {now}):"
                                 " resume it on the images it was trained on")
            if saved is not None and now is not None and saved != now:
                raise ValueError(f"{resume} was trained with {key} {saved!r}, this run has {now!r}")
        check_resumed_settings(resume, state.get("args") or {}, self.options)

    # ------------------------------------------------------------ the hooks of fit
    def batches(self, epoch: int):
        return self.train_loader

    def prepare(self, batch) -> Tuple[Tensor, Tensor, Tensor]:
        images, target, index = batch
        return images.to(self.device, non_blocking=True), target.to(self.device, non_blocking=True), index

    def _progress(self, epoch: int, step: int, loss: float, lr: float) -> None:
        print(f"epoch {epoch} step {step}/{self.steps_per_epoch} loss {loss:.4f} lr {lr:.3e}", flush=True)

    def epoch_stats(self, epoch: int, totals: EpochTotals) -> dict:
        """The mean loss, the last update's learning rate, the epoch's seconds, and each depth's
        loss with mixed depth."""
        seen = max(totals.seen, 1)
        stats = {"epoch": epoch, "train_loss": totals.sums.get("loss", 0.0) / seen, "lr": totals.lr_last,
                 "time": totals.wall_seconds}
        stats.update({f"train_{k}": v / seen for k, v in totals.sums.items() if k != "loss"})
        return stats

    def epoch_name(self, epoch: int) -> str:
        return f"epoch {epoch}"

    def validate(self) -> dict:
        if self.val_loader is None:
            return {}
        stats = {f"val_{k}": v for k, v in evaluate(self.net, self.val_loader, self.device, self.amp).items()}
        for term in self.depth_terms:
            with self.model.at_depth(term.depths[0]):
                shallow = evaluate(self.net, self.val_loader, self.device, self.amp)
            stats.update({f"val_{k}_depth{term.label}": shallow[k] for k in ("loss", "acc1", "acc5")})
        return stats

    def epoch_done(self, epoch: int, stats: dict, cpu_seconds: float, wall_start: float) -> None:
        print(json_text.dumps(stats), flush=True)
        if self.output:
            self.save(epoch, stats)
            if self.on_saved is not None:
                self.on_saved()

    def save(self, epoch: int, stats: dict) -> None:
        """The epoch's checkpoints and log line: best, the log line, then last. A run killed at
        any moment resumes from a whole checkpoint_last.pt whose best_acc1 is that of
        checkpoint_best.pt, and its log holds every epoch that checkpoint has trained (the
        resume drops the lines of later epochs: each epoch is logged once)."""
        acc, output = stats.get("val_acc1", -1.0), self.output
        if acc >= self.best:
            save_checkpoint(self.model, os.path.join(output, "checkpoint_best.pt"),
                            {**self.extra, "epoch": epoch, "best_acc1": acc})
        self.best = max(self.best, acc)
        append_log_line(os.path.join(output, "log.jsonl"), stats)
        save_checkpoint(self.model, os.path.join(output, "checkpoint_last.pt"), {
            "optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(), "epoch": epoch,
            "best_acc1": self.best, **self.extra, "args": self.options,
        })
