"""Training the vision models: the loop of ``sret-train-vision`` and its helpers.

    from fairseq_sret.vision import create_model
    from fairseq_sret_cli.vision_training import TrainConfig, train
    model = create_model("sret_t", num_classes=10)
    stats = train(model, train_loader, TrainConfig(epochs=30), device=torch.device("cpu"),
                  val_loader=val_loader, output="runs/sret_t")

``train_loader`` yields ``(images, target, index)`` (``ImageFolder(..., return_index=True)``;
the index looks up pre-computed teacher logits). AdamW with no weight decay on biases,
norms, LRC scalars and the position embedding, a per-step cosine schedule with linear
warm-up, label smoothing or soft distillation, optional mixed depth and mixed precision.
With ``output`` every epoch writes ``checkpoint_best.pt`` (when the validation top-1 is the
best so far), then ``checkpoint_last.pt`` (also the optimizer and scaler state: ``resume``
continues from it), then a line of ``log.jsonl``; each file is replaced atomically.
"""

import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq_sret.atomic_files import replacing
from fairseq_sret.core.mixed_depth import DepthTerm, mixed_depth_loss
from fairseq_sret.checkpoints import load_checkpoint as load_checkpoint_file
from fairseq_sret.vision.losses import soft_distillation_loss
from fairseq_sret.vision.weights import save_checkpoint
from fairseq_sret import json_text

from .fingerprints import legacy

#: (autocast enabled, autocast dtype, use a gradient scaler), from :func:`autocast_settings`
Amp = Tuple[bool, Optional[torch.dtype], bool]
NO_AMP: Amp = (False, None, False)


def param_groups(model: nn.Module, weight_decay: float) -> List[Dict]:
    """AdamW groups as in DeiT/timm: no weight decay on biases, norms, LRC scalars
    (every parameter with fewer than 2 dimensions) and ``model.no_weight_decay()``."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def cosine_lr(
    step: int, total_steps: int, base_lr: float, warmup_steps: int = 0, min_lr: float = 0.0,
    warmup_lr: float = 0.0,
) -> float:
    """Linear warm-up from ``warmup_lr`` to ``base_lr``, then cosine decay to ``min_lr``."""
    if step < warmup_steps:
        return warmup_lr + (base_lr - warmup_lr) * step / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def topk_correct(logits: Tensor, target: Tensor, ks: Sequence[int] = (1, 5)) -> List[int]:
    """Number of samples whose target is among the top-k logits, for each k."""
    k_max = min(max(ks), logits.size(1))
    top = logits.topk(k_max, dim=1).indices
    hit = top == target[:, None]
    return [int(hit[:, : min(k, k_max)].any(dim=1).sum()) for k in ks]


def autocast_settings(device: torch.device, mode: str) -> Amp:
    """(enabled, dtype, use_grad_scaler) for torch.autocast on this device; ``mode`` is
    ``auto`` (on for CUDA), ``on`` or ``off``."""
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return NO_AMP
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return True, torch.bfloat16, False
        return True, torch.float16, True
    return True, torch.bfloat16, False  # CPU autocast supports bf16


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, amp: Amp = NO_AMP) -> Dict[str, float]:
    """Cross-entropy and top-1/top-5 accuracy (%) of ``model`` over ``loader``'s (images, target)."""
    enabled, dtype, _ = amp
    model.eval()
    total, loss_sum, top1, top5 = 0, 0.0, 0, 0
    for images, target in loader:
        images, target = images.to(device, non_blocking=True), target.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=enabled):
            logits = model(images)
        loss_sum += F.cross_entropy(logits.float(), target, reduction="sum").item()
        c1, c5 = topk_correct(logits, target, (1, 5))
        top1, top5, total = top1 + c1, top5 + c5, total + target.numel()
    return {"loss": loss_sum / total, "acc1": 100.0 * top1 / total, "acc5": 100.0 * top5 / total, "n": total}


def check_finite(model: nn.Module, stats: Dict[str, float], where: str) -> None:
    """FloatingPointError when ``model`` holds a weight that is NaN or infinite, or a loss in
    ``stats`` is: a diverged model, whose accuracy (of NaN logits) would read as a result."""
    bad = next((name for name, p in model.named_parameters() if not torch.isfinite(p).all()), None)
    if bad is not None:
        raise FloatingPointError(f"the weight {bad} is not finite after {where}")
    losses = {k: v for k, v in stats.items() if "loss" in k and isinstance(v, float) and not math.isfinite(v)}
    if losses:
        raise FloatingPointError(f"{', '.join(f'{k} is {v}' for k, v in losses.items())} after {where}")


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


#: the options that make a run what it is: a resume must give the ones it was started with
#: (``--epochs`` may grow; where and how fast it runs may change)
RUN_SETTINGS = (
    "model", "img_size", "drop_path", "batch_size", "lr", "min_lr", "warmup_lr", "warmup_epochs", "weight_decay",
    "label_smoothing", "clip_grad", "teacher", "distill_temperature", "mixed_depth", "seed", "max_steps_per_epoch",
)
#: input files of a run: given or not must stay as it was (their paths may differ)
RUN_INPUTS = ("teacher_logits", "teacher_checkpoint", "finetune")


def check_resumed_settings(resume: str, saved: dict, now: dict) -> None:
    """ValueError naming every :data:`RUN_SETTINGS` option whose value differs from the one
    the run in ``resume`` was started with (a checkpoint that records no options: unchecked)."""
    if not saved or not now:
        return
    changed = [f"--{key.replace('_', '-')} {saved.get(key)!r} -> {now.get(key)!r}"
               for key in RUN_SETTINGS if key in saved and saved.get(key) != now.get(key)]
    changed += [f"--{key.replace('_', '-')} {'given' if saved.get(key) else 'not given'} -> "
                f"{'given' if now.get(key) else 'not given'}"
                for key in RUN_INPUTS if key in saved and bool(saved.get(key)) != bool(now.get(key))]
    if changed:
        raise ValueError(f"{resume} belongs to a run started with other settings ({'; '.join(changed)}): resume it"
                         " with its own settings, or start a new run in another --output")


#: what a checkpoint_last.pt holds that --resume needs
RESUME_KEYS = ("model", "optimizer", "scaler", "epoch")


def check_resumable(resume: str, state) -> None:
    """ValueError naming what ``resume`` is when it is not a ``checkpoint_last.pt`` of this
    training (a ``checkpoint_best.pt``, bare weights, another command's checkpoint)."""
    if not isinstance(state, dict):
        why = "not a dict of training state"
    elif state.get("command", "sret-train-vision") != "sret-train-vision":
        why = f"written by {state['command']}"
    elif not isinstance(state.get("model"), dict):
        why = "model weights alone, no training state"
    else:
        missing = [key for key in RESUME_KEYS if key not in state]
        why = f"no {', '.join(missing)}: a checkpoint_best.pt or a model's weights" if missing else ""
    if why:
        raise ValueError(f"{resume} is not the checkpoint_last.pt of a sret-train-vision run ({why}): resume from"
                         " OUTPUT/checkpoint_last.pt, or start from its weights with --finetune")


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
    run = _Training(model, train_loader, config, device, amp, net, teacher, teacher_logits, depth_terms)
    start_epoch, best = run.resume(resume, checkpoint_extra, options) if resume else (0, -1.0)
    if on_start is not None:
        on_start()
    if output:
        os.makedirs(output, exist_ok=True)
    stats: dict = {}
    for epoch in range(start_epoch, config.epochs):
        stats = run.train_epoch(epoch)
        if val_loader is not None:
            stats.update(run.validate(val_loader))
        check_finite(model, stats, f"epoch {epoch}")
        print(json_text.dumps(stats), flush=True)
        if output:
            best = run.save(output, epoch, stats, best, checkpoint_extra, options)
            if on_saved is not None:
                on_saved()
    return stats


class _Training:
    """The state of :func:`train`: the model, its optimizer and gradient scaler, the schedule."""

    def __init__(self, model, train_loader, config: TrainConfig, device, amp: Amp, net, teacher, teacher_logits,
                 depth_terms):
        self.model, self.train_loader, self.config, self.device, self.amp = model, train_loader, config, device, amp
        self.net = model if net is None else net
        self.teacher, self.teacher_logits, self.depth_terms = teacher, teacher_logits, depth_terms
        self.distill = teacher_logits is not None or teacher is not None
        self.optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr)
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp[2])
        self.steps_per_epoch = len(train_loader)
        if config.max_steps_per_epoch:
            self.steps_per_epoch = min(self.steps_per_epoch, config.max_steps_per_epoch)
        self.total_steps = config.epochs * self.steps_per_epoch
        self.warmup_steps = int(round(config.warmup_epochs * self.steps_per_epoch))

    def resume(self, resume: str, checkpoint_extra: Optional[dict], options: Optional[dict]) -> Tuple[int, float]:
        """Load ``resume`` (a ``checkpoint_last.pt`` of the same run); (first epoch, best accuracy)."""
        state = load_checkpoint_file(resume)
        check_resumable(resume, state)
        for key in ("model_name", "classes", "data"):  # what the data and the command line must still be
            saved, now = state.get(key), (checkpoint_extra or {}).get(key)
            if key == "data" and legacy(saved):  # recorded before fingerprints read the images' bytes
                now = (checkpoint_extra or {}).get("data_legacy", now)
            if saved is not None and now is not None and saved != now and key == "data":
                raise ValueError(f"{resume} was trained on other images (fingerprint {saved}; --data gives {now}):"
                                 " resume it on the images it was trained on")
            if saved is not None and now is not None and saved != now:
                raise ValueError(f"{resume} was trained with {key} {saved!r}, this run has {now!r}")
        check_resumed_settings(resume, state.get("args") or {}, options or {})
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"{resume} does not fit this run's model ({str(exc).splitlines()[0]}): resume a run"
                             " with its own --model and data") from None
        start_epoch, best = state["epoch"] + 1, state.get("best_acc1", -1.0)
        if start_epoch >= self.config.epochs:
            raise ValueError(f"{resume} has trained {start_epoch} epochs, all of the {self.config.epochs} asked for:"
                             " nothing to train (raise --epochs to train longer)")
        best_file = os.path.join(os.path.dirname(resume), "checkpoint_best.pt")
        if os.path.isfile(best_file):  # saved after this checkpoint_last.pt when a kill came between
            best = max(best, load_checkpoint_file(best_file).get("best_acc1", -1.0))
        return start_epoch, best

    def objective(self, logits, target, soft):
        if self.distill:  # the paper's soft distillation: no one-hot label
            return soft_distillation_loss(logits, soft, self.config.distill_temperature)
        return F.cross_entropy(logits.float(), target, label_smoothing=self.config.label_smoothing)

    def _loss(self, images, target, index, depth_sums: dict):
        """The step's loss (mixed depth included), adding each depth's loss to ``depth_sums``."""
        device, (enabled, dtype, _) = self.device, self.amp
        soft = None
        with torch.autocast(device.type, dtype=dtype, enabled=enabled):
            logits = self.net(images)
            if self.teacher is not None:
                with torch.no_grad():
                    soft = self.teacher(images)
            elif self.teacher_logits is not None:
                soft = self.teacher_logits[index].to(device)
        loss = self.objective(logits, target, soft)
        if self.depth_terms:  # mixed depth: the same weights and head, fewer applications
            def shallow_loss():
                with torch.autocast(device.type, dtype=dtype, enabled=enabled):
                    return self.objective(self.net(images), target, soft)

            loss, depth_losses = mixed_depth_loss(self.model, self.depth_terms, loss, shallow_loss)
            for label, value in depth_losses.items():
                depth_sums[label] = depth_sums.get(label, 0.0) + value.item() * target.numel()
        return loss

    def train_epoch(self, epoch: int) -> dict:
        config, optimizer, scaler = self.config, self.optimizer, self.scaler
        self.model.train()
        started, loss_sum, seen, depth_sums = time.time(), 0.0, 0, {}
        for step, (images, target, index) in enumerate(self.train_loader):
            if step >= self.steps_per_epoch:
                break
            global_step = epoch * self.steps_per_epoch + step
            lr = cosine_lr(global_step, self.total_steps, config.lr, self.warmup_steps, config.min_lr, config.warmup_lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            images = images.to(self.device, non_blocking=True)
            target = target.to(self.device, non_blocking=True)
            loss = self._loss(images, target, index, depth_sums)
            if not math.isfinite(loss.item()):
                raise FloatingPointError(f"loss is {loss.item()} at epoch {epoch} step {step}")
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if config.clip_grad:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_grad)
            scaler.step(optimizer)
            scaler.update()
            loss_sum += loss.item() * target.numel()
            seen += target.numel()
            if config.log_interval and step % config.log_interval == 0:
                print(f"epoch {epoch} step {step}/{self.steps_per_epoch} loss {loss.item():.4f} lr {lr:.3e}", flush=True)
        stats = {"epoch": epoch, "train_loss": loss_sum / max(seen, 1), "lr": lr, "time": time.time() - started}
        stats.update({f"train_loss_depth{d}": v / max(seen, 1) for d, v in depth_sums.items()})
        return stats

    def validate(self, val_loader) -> dict:
        stats = {f"val_{k}": v for k, v in evaluate(self.net, val_loader, self.device, self.amp).items()}
        for term in self.depth_terms:
            with self.model.at_depth(term.depths[0]):
                shallow = evaluate(self.net, val_loader, self.device, self.amp)
            stats.update({f"val_{k}_depth{term.label}": shallow[k] for k in ("loss", "acc1", "acc5")})
        return stats

    def save(self, output: str, epoch: int, stats: dict, best: float, checkpoint_extra, options) -> float:
        """The epoch's checkpoints and log line; returns the best accuracy so far. Best before
        last and the log after both: a run killed at any moment resumes from a whole
        checkpoint_last.pt whose best_acc1 is that of checkpoint_best.pt, and logs each epoch once."""
        acc = stats.get("val_acc1", -1.0)
        extra = dict(checkpoint_extra or {})
        if acc >= best:
            save_checkpoint(self.model, os.path.join(output, "checkpoint_best.pt"),
                            {**extra, "epoch": epoch, "best_acc1": acc})
        best = max(best, acc)
        save_checkpoint(self.model, os.path.join(output, "checkpoint_last.pt"), {
            "optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(), "epoch": epoch,
            "best_acc1": best, **extra, "args": dict(options or {}),
        })
        log = os.path.join(output, "log.jsonl")  # appended by a rewrite: a full disk never leaves part of a line
        try:
            with open(log, encoding="utf-8") as f:
                logged = f.read()
        except FileNotFoundError:
            logged = ""
        if logged and not logged.endswith("\n"):
            logged += "\n"
        with replacing(log) as tmp:
            tmp.write_text(logged + json_text.dumps(stats) + "\n", encoding="utf-8")
        return best
