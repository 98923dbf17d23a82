"""The CIFAR recipe of the vision trainer: a small image set held in memory as uint8 tensors,
augmented per batch with timm's recipe, trained with timm's optimizer, scheduler, Mixup and
EMA (``sret-train-cifar``).

:class:`CifarRun` builds the data, the model and timm's parts in a fixed order (the seeds
make a run reproducible), trains the epochs with :class:`~.loop.Trainer` (each saved to
``--output``: ``checkpoint_last.pt`` and ``log.jsonl``, so that ``--resume`` continues after
the last), then tests the last weights and the EMA at every depth (``result.json``).
"""

import random
import time
from pathlib import Path
from typing import List

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from fairseq_sret import json_text
from fairseq_sret.checkpoints import load_checkpoint as load_checkpoint_file
from fairseq_sret.core.depth import DepthControl
from fairseq_sret.core.mixed_depth import check_mixed_depth, parse_mixed_depth
from fairseq_sret.vision import create_model
from fairseq_sret.vision.complexity import count_macs, count_params
from fairseq_sret.vision.registry import get_pretrained_cfg
from .. import UsageError, UserError, log as _log
from ..hardware import cpu_model
from ..image_tensors import ImageTensors, load_split
from ..outputs import OutputInTheWay, Outputs
from .evaluation import evaluate_depths, evaluate_images, normalise
from .loop import Diverged, EpochTotals, Trainer, check_finite, fit
from .objectives import Objective
from .record import (describe_difference, log_text, rng_state, set_rng_state, tested, training_processors,
                     training_threads)

#: what a run writes in --output
RUN_FILES = ("checkpoint_last.pt", "log.jsonl", "result.json")
#: options that do not change what is trained: a run resumes under other values of these
NOT_SETTINGS = ("data_dir", "output", "resume", "force", "log_interval", "eval_batch_size", "threads")
#: ``--aa`` values naming one of torchvision's AutoAugment policies (``AutoAugmentPolicy``'s values)
AUTO_AUGMENT_POLICIES = ("cifar10",)
#: the fill of the pixels AutoAugment's shears, translations and rotations uncover: the grey of
#: the AutoAugment implementation the CCT recipe trained with
AUTO_AUGMENT_FILL = (128, 128, 128)


def log(message: str) -> None:
    _log(message, stage="train")


def auto_augment_transform(policy: str):
    """torchvision's AutoAugment with ``policy`` (one of :data:`AUTO_AUGMENT_POLICIES`), on
    (3, H, W) uint8 tensors; its random choices draw from torch's generator."""
    from torchvision.transforms import AutoAugment, AutoAugmentPolicy

    return AutoAugment(AutoAugmentPolicy(policy), fill=list(AUTO_AUGMENT_FILL))


class AugmentedImages(Dataset):
    """uint8 images (N, H, W, 3) -> (``auto_augment`` on (3, H, W) uint8, random crop with
    ``padding`` zero pixels, horizontal flip, then ``rand_augment`` on a PIL view) as (3, H, W)
    uint8, and the target."""

    def __init__(self, data: ImageTensors, padding: int = 4, rand_augment=None, auto_augment=None):
        self.data, self.padding, self.rand_augment, self.auto_augment = data, padding, rand_augment, auto_augment

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        img = self.data.images[index]
        if self.auto_augment is not None:
            img = self.auto_augment(img.permute(2, 0, 1)).permute(1, 2, 0)
        h, w = img.shape[:2]
        if self.padding:
            padded = F.pad(img.permute(2, 0, 1), (self.padding,) * 4)
            top, left = random.randint(0, 2 * self.padding), random.randint(0, 2 * self.padding)
            img = padded[:, top:top + h, left:left + w].permute(1, 2, 0)
        if random.random() < 0.5:
            img = img.flip(1)
        if self.rand_augment is not None:
            from PIL import Image

            img = torch.from_numpy(np.array(self.rand_augment(Image.fromarray(img.contiguous().numpy()))))
        return img.permute(2, 0, 1).contiguous(), self.data.targets[index]


# ----------------------------------------------------------------------------- the data
def load_splits(data_dir: str, val_split: int, split_seed: int, option: str = "--data-dir"):
    """(all of train, train less the held-out images, the held-out images or None, test);
    ``option`` gave ``data_dir`` (for the error naming a missing folder)."""
    train_all = load_split(data_dir, "train", option)
    test = load_split(data_dir, "test", option)
    if test.classes != train_all.classes:
        raise UserError(f"the test split's classes {test.classes} differ from train's {train_all.classes}")
    if test.images.shape[1:3] != train_all.images.shape[1:3]:
        raise UserError(f"{data_dir}: the test images are {test.images.size(2)}x{test.images.size(1)}, the training"
                        f" images {train_all.images.size(2)}x{train_all.images.size(1)}: a model is tested at the size it"
                        " trained at; resize one split to the other")
    if val_split:
        train, val = train_all.split_off(val_split, seed=split_seed)
    else:
        train, val = train_all, None
    untaught = [name for c, name in enumerate(train.classes)
                if bool((train_all.targets == c).any()) and not bool((train.targets == c).any())]
    if untaught:
        raise UserError(f"{data_dir}: class {untaught[0]!r}{f' and {len(untaught) - 1} more' if len(untaught) > 1 else ''}"
                        f" has no training images once --val-split {val_split} holds images out: the model could"
                        " never learn it; lower --val-split or add images")
    return train_all, train, val, test


def data_facts(train_all: ImageTensors, train: ImageTensors, val, test: ImageTensors) -> dict:
    """What a result records of its data: the fingerprints tie it to the pixels it was computed on."""
    return {"source": train_all.source, "classes": train_all.classes,
            "fingerprints": {"train": train.fingerprint(), "val": val.fingerprint() if val else None,
                             "test": test.fingerprint()},
            "train_images": len(train), "val_images": len(val) if val else 0, "test_images": len(test)}


def data_fingerprints(data_dir: str, settings: dict, option: str = "--data") -> dict:
    """The fingerprints a run of these settings (``result.json``'s) records of ``data_dir``."""
    return data_facts(*load_splits(data_dir, settings["val_split"], settings["split_seed"], option))["fingerprints"]


# ----------------------------------------------------------------------------- the run's state
def settings_of(args) -> dict:
    return {k: v for k, v in sorted(vars(args).items()) if k not in NOT_SETTINGS}


def resume_state(args) -> dict:
    """The state of the run in ``--output`` to continue; refused when it was not made by this
    command or has other settings."""
    last = Path(args.output) / "checkpoint_last.pt"
    state = load_checkpoint_file(last)
    if not isinstance(state, dict) or state.get("command") != "sret-train-cifar":
        raise OutputInTheWay(f"{last} was not written by sret-train-cifar: give another --output")
    if state["settings"] != settings_of(args):
        changed = describe_difference(state["settings"], settings_of(args))
        raise UsageError(f"--resume: {last.parent} holds a run with other settings ({changed}); resume it with its"
                         " own settings, or start over with --force and without --resume")
    return state


def build_model(args, num_classes: int):
    kwargs = dict(args.model_kwargs)
    kwargs["num_classes"] = num_classes
    if args.drop_path is not None:
        kwargs["drop_path_rate"] = args.drop_path
    try:
        model = create_model(args.model, **kwargs)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--model {args.model} --model-kwargs {args.model_kwargs}: {exc}") from None
    return model, kwargs


def diverged(exc: FloatingPointError) -> UserError:
    """The UserError of a run whose loss or weights are no longer finite."""
    return UserError(f"{exc}: training diverged; lower --lr or set --clip-grad")


# ----------------------------------------------------------------------------- the run
class CifarRun:
    """One run of ``sret-train-cifar`` (see the module's docstring); ``timm`` is timm's
    library, ``on_saved`` runs once an epoch's files are written (an old run they replace may
    go)."""

    def __init__(self, args, timm, outputs: Outputs, on_saved=None):
        self.args, self.timm, self.outputs, self.on_saved = args, timm, outputs, on_saved
        self.resume = resume_state(args) if args.resume else None
        self._load_data()
        torch.manual_seed(args.seed)
        random.seed(args.seed)
        np.random.seed(args.seed % 2**32)
        self.model, self.model_kwargs = build_model(args, len(self.train_split.classes))
        cfg = get_pretrained_cfg(args.model)
        self.mean, self.std = cfg["mean"], cfg["std"]
        img_size = tuple(self.train_split.images.shape[1:3])
        self.depth_terms = self._depth_terms()
        self.facts = {"params": count_params(self.model), "macs": count_macs(self.model, img_size)}
        self._augmentations(img_size)
        self._optimisation()
        self.start_epoch, self.cpu_seconds, self.history = 0, 0.0, []
        self.processor = cpu_model()
        self._restore()
        objective = Objective(self.model, smoothing=args.smoothing, depth_terms=self.depth_terms,
                              soft_target_loss=timm.loss.SoftTargetCrossEntropy() if self.mixup is not None else None)
        self.trainer = Trainer(self.model, self.optimizer, self.scheduler, objective, self.steps_per_epoch,
                               prepare=self.prepare, ema=self.ema, clip_grad=args.clip_grad, progress=self._progress,
                               log_interval=args.log_interval)

    # ------------------------------------------------------------ building
    def _load_data(self) -> None:
        args = self.args
        self.train_all, self.train_split, self.val, self.test = load_splits(args.data_dir, args.val_split,
                                                                            args.split_seed)
        if len(self.train_split) < args.batch_size:
            raise UserError(f"--batch-size {args.batch_size} is more than the {len(self.train_split)} training images")
        self.data_facts = data_facts(self.train_all, self.train_split, self.val, self.test)
        fingerprints = self.data_facts["fingerprints"]
        if self.resume is not None and self.resume["data"]["fingerprints"] != fingerprints:
            raise UsageError(f"--resume: {args.output} was trained on other data ({self.resume['data']['source']},"
                             f" {self.resume['data']['fingerprints']}); this --data-dir gives {fingerprints}")

    def _depth_terms(self):
        try:
            depth_terms = parse_mixed_depth(self.args.mixed_depth)
            if depth_terms:
                if not isinstance(self.model, DepthControl):
                    raise ValueError(f"--mixed-depth: {self.args.model} has no recursive blocks")
                check_mixed_depth(depth_terms, (self.model.recursions,), sides=(self.args.model,))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return depth_terms

    def _augmentations(self, img_size) -> None:
        args, timm = self.args, self.timm
        rand_augment = auto_augment = None
        if args.aa in AUTO_AUGMENT_POLICIES:
            auto_augment = auto_augment_transform(args.aa)
        elif args.aa and args.aa != "none":
            # magnitudes capped just below 10 (unless the config sets mmax): there timm's increasing
            # posterize keeps 0 bits, which Pillow >= 12 refuses
            hparams = dict(translate_const=int(img_size[0] * 0.45), img_mean=tuple(round(255 * m) for m in self.mean))
            if "-mmax" not in args.aa:
                hparams["magnitude_max"] = 9.99
            try:
                rand_augment = timm.data.rand_augment_transform(args.aa, hparams)
            except (ValueError, AssertionError, KeyError) as exc:
                raise UsageError(f"--aa {args.aa}: {exc}") from None
        self.train_set = AugmentedImages(self.train_split, rand_augment=rand_augment, auto_augment=auto_augment)
        self.erasing = (timm.data.random_erasing.RandomErasing(args.reprob, mode="pixel", device="cpu")
                        if args.reprob else None)
        self.mixup = None
        if args.mixup or args.cutmix:
            self.mixup = timm.data.Mixup(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix,
                                         label_smoothing=args.smoothing, num_classes=len(self.train_split.classes))

    def _optimisation(self) -> None:
        args, timm = self.args, self.timm
        try:
            self.optimizer = timm.optim.create_optimizer_v2(self.model, opt=args.opt, lr=args.lr,
                                                            weight_decay=args.weight_decay)
        except (ValueError, AssertionError) as exc:
            raise UsageError(f"--opt {args.opt}: {exc}") from None
        self.steps_per_epoch = len(self.train_split) // args.batch_size
        if args.max_steps_per_epoch:
            self.steps_per_epoch = min(self.steps_per_epoch, args.max_steps_per_epoch)
        try:
            self.scheduler, _ = timm.scheduler.create_scheduler_v2(
                self.optimizer, sched=args.sched, num_epochs=args.epochs, warmup_epochs=args.warmup_epochs,
                warmup_lr=args.warmup_lr, min_lr=args.min_lr, step_on_epochs=False,
                updates_per_epoch=self.steps_per_epoch,
            )
        except (ValueError, AssertionError) as exc:
            raise UsageError(f"--sched {args.sched}: {exc}") from None
        self.ema = timm.utils.ModelEmaV3(self.model, decay=args.model_ema_decay) if args.model_ema else None

    def _restore(self) -> None:
        """The state of ``--resume`` (a new run over an old one, ``--force``, replaces its files
        when it saves its first epoch: :meth:`Outputs.starting_over`)."""
        args, resume = self.args, self.resume
        if resume is None:
            return
        self.model.load_state_dict(resume["model"])
        self.optimizer.load_state_dict(resume["optimizer"])
        self.scheduler.load_state_dict(resume["scheduler"])
        if self.ema is not None:
            self.ema.module.load_state_dict(resume["ema"])
        set_rng_state(resume["rng"])
        self.start_epoch, self.cpu_seconds = resume["epoch"] + 1, resume["cpu_seconds"]
        self.history = [h for h in resume["history"] if h["epoch"] < self.start_epoch]
        before = self.history[-1].get("threads") if self.history else None
        if before is not None and before != torch.get_num_threads() and self.start_epoch < args.epochs:
            log(f"resumed with {torch.get_num_threads()} threads, its last epoch trained with {before}: the"
                " weights differ from a run of one thread count; result.json records every count used")
        log(f"resuming {args.output} after epoch {resume['epoch']} ({self.cpu_seconds:.0f} CPU s so far)")
        if self.start_epoch >= args.epochs and tested(Path(args.output)):
            raise UsageError(f"{args.output} has trained all {args.epochs} epochs and been tested (result.json):"
                             " nothing to resume")
        if self.start_epoch >= args.epochs:  # interrupted between its last epoch and its test
            log(f"{args.output} has trained all {args.epochs} epochs but was not tested: testing it")

    # ------------------------------------------------------------ training
    def train(self) -> dict:
        args = self.args
        log(f"{args.model} {self.model_kwargs}: {self.facts['params']:,} parameters, {self.facts['macs'] / 1e6:.1f}M"
            f" MACs; {len(self.train_split):,} training images ({self.train_all.source}), {self.steps_per_epoch}"
            f" updates per epoch, epochs {self.start_epoch + 1}-{args.epochs}")
        run_started = time.time()
        try:
            fit(self.trainer, self, self.start_epoch, args.epochs)
        except Diverged as exc:
            raise diverged(exc) from None
        return self._test(run_started)

    def batches(self, epoch: int):
        """The epoch's batches: its own order (of ``--seed`` and the epoch), the same on resume."""
        order = torch.Generator().manual_seed(self.args.seed * 100003 + epoch)
        return DataLoader(self.train_set, batch_size=self.args.batch_size, shuffle=True, drop_last=True,
                          generator=order, num_workers=0)

    def prepare(self, batch):
        """uint8 images -> normalised, randomly erased, mixed (Mixup/CutMix: soft targets)."""
        images, target = batch
        x = normalise(images, self.mean, self.std)
        if self.erasing is not None:
            x = self.erasing(x)
        if self.mixup is not None:
            x, target = self.mixup(x, target)
        return x, target, None

    def _progress(self, epoch: int, step: int, loss: float, lr: float) -> None:
        log(f"epoch {epoch + 1}/{self.args.epochs} update {step}/{self.steps_per_epoch} loss {loss:.4f}"
            f" lr {self.optimizer.param_groups[0]['lr']:.2e}")  # the next update's, as timm sets it

    def epoch_stats(self, epoch: int, totals: EpochTotals) -> dict:
        """The mean losses (each depth's with mixed depth), the next update's learning rate and
        the training throughput."""
        sums = dict(totals.sums)
        if self.depth_terms:  # logged by depth, the full one included
            sums.pop("loss")
        return {"epoch": epoch, **{f"train_{k}": v / totals.seen for k, v in sums.items()}, "lr": totals.lr_next,
                "train_images_per_cpu_s": totals.seen / max(totals.cpu_seconds, 1e-9)}

    def epoch_name(self, epoch: int) -> str:
        return f"epoch {epoch + 1}"

    def validate(self) -> dict:
        if self.val is None:
            return {}
        batch = self.args.eval_batch_size
        stats = {f"val_{k}": v for k, v in evaluate_images(self.model, self.val, self.mean, self.std, batch).items()}
        if self.ema is not None:
            stats.update({f"val_ema_{k}": v for k, v in
                          evaluate_images(self.ema.module, self.val, self.mean, self.std, batch).items()})
        return stats

    def epoch_done(self, epoch: int, stats: dict, cpu_seconds: float, wall_start: float) -> None:
        self.cpu_seconds += cpu_seconds
        stats.update(cpu_seconds=self.cpu_seconds, wall_seconds=time.time() - wall_start, cpu=self.processor,
                     threads=torch.get_num_threads())
        self.history.append(stats)
        shown = ", ".join(f"{k} {v:.4g}" for k, v in stats.items() if k not in ("epoch", "cpu"))
        log(f"epoch {epoch + 1}/{self.args.epochs} done: {shown}")
        if self.args.output:
            self._save(epoch)

    def _save(self, epoch: int) -> None:
        args, ema = self.args, self.ema
        state = {
            "command": "sret-train-cifar", "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "ema": ema.module.state_dict() if ema is not None else None,
            "rng": rng_state(), "epoch": epoch, "cpu_seconds": self.cpu_seconds, "history": self.history,
            "settings": settings_of(args), "data": self.data_facts, "model_name": args.model,
            "model_kwargs": self.model_kwargs, "classes": self.train_split.classes,
        }
        self.outputs.save(state, Path(args.output) / "checkpoint_last.pt")
        self.outputs.write_text(Path(args.output) / "log.jsonl", log_text(self.history))
        if self.on_saved is not None:  # the new run's files are in place: an old run they replace goes
            self.on_saved()

    def _test(self, run_started: float) -> dict:
        args, ema, batch = self.args, self.ema, self.args.eval_batch_size
        result = {
            "model": args.model, "model_kwargs": self.model_kwargs, **self.facts, "epochs": args.epochs,
            "cpu_seconds": self.cpu_seconds,
            "test": evaluate_depths(self.model, self.test, self.mean, self.std, batch),
            "test_ema": evaluate_depths(ema.module, self.test, self.mean, self.std, batch) if ema is not None else None,
            "val": self.history[-1].get("val_acc1") if self.history else None, "data": self.data_facts,
            "settings": settings_of(args), **training_processors(self.history), "threads": training_threads(self.history),
            "torch": torch.__version__, "timm": self.timm.__version__,
        }
        for name in ("test", "test_ema"):
            for depth, scores in (result[name] or {}).items():
                try:
                    check_finite(self.model, {f"{name} loss {depth}".strip(): scores["loss"]}, "the last epoch")
                except Diverged as exc:
                    raise diverged(exc) from None
        log(f"test top-1: {json_text.dumps(result['test'])}"
            + (f", EMA {json_text.dumps(result['test_ema'])}" if ema else "")
            + f" ({time.time() - run_started:.0f} s)")
        if args.output:
            self.outputs.write_text(Path(args.output) / "result.json", json_text.dumps(result, indent=1) + "\n")
        return result
