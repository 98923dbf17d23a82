"""Train an image classifier on a small image set held in memory (CIFAR-10/100), with timm's recipe.

    sret-train-cifar --data-dir data/cifar10 --model sret_cifar --output runs/sret_cifar
    sret-train-cifar --data-dir data/cifar10 --model sret_cifar_wo_slice --model-kwargs nll=False lrc=False ...
    sret-train-cifar ... --output runs/sret_cifar --resume        # continue an interrupted run

``--data-dir``: an ImageFolder (``train/`` and ``test/`` or ``val/``, CLASS/IMAGE below) or the
folder ``torchvision.datasets.CIFAR10(root, download=True)`` fills. The images are decoded once
and held as uint8 tensors; the augmentation runs on them per batch.

The recipe is timm's, from timm's library: random crop (4-pixel zero padding) and flip, then
RandAugment (``--aa``; or, before the crop, AutoAugment's CIFAR-10 policy: ``--aa cifar10``, the
CCT recipe's), normalisation, random erasing (``--reprob``), Mixup/CutMix
(``--mixup``/``--cutmix``, soft-target cross-entropy) or label smoothing, its optimizer and
scheduler factories (``--opt``, ``--sched``, per-update warm-up and decay) and model EMA
(``--model-ema``). Options keep timm's ``train.py`` names. fp32 on the CPU.

Model selection never sees the test split: ``--val-split N`` images are held out of train (the
same ones for every seed) and evaluated after every epoch; the test split is evaluated once,
at the end, with the last weights (and the EMA), at every depth of a recursive model.

``--output`` holds one run: ``checkpoint_last.pt`` (every epoch; with the settings and the
fingerprints of the data it was trained on), ``log.jsonl`` (one line per epoch: losses,
validation top-1, CPU seconds) and ``result.json`` (the test accuracies). A folder holding a
run is continued only with ``--resume`` and the same settings, or started over with ``--force``.
"""

import argparse
import ast
import contextlib
import io
import json
import math
import random
import re
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from fairseq_sret.core.depth import DepthControl
from fairseq_sret.core.mixed_depth import check_mixed_depth, mixed_depth_loss, parse_mixed_depth
from fairseq_sret.checkpoints import load_checkpoint as load_checkpoint_file
from fairseq_sret.vision import create_model
from fairseq_sret.vision.registry import get_pretrained_cfg
from fairseq_sret.vision.complexity import count_macs, count_params
from . import HelpFormatter, UsageError, UserError, at_least, in_range, log as _log, seed, user_errors
from .hardware import cpu_model
from .image_tensors import ImageTensors, load_split
from .outputs import OutputInTheWay, Outputs, exclusive
from .vision_training import check_finite
from fairseq_sret import json_text

RUN_FILES = ("checkpoint_last.pt", "log.jsonl", "result.json")
#: options that do not change what is trained: a run resumes under other values of these
NOT_SETTINGS = ("data_dir", "output", "resume", "force", "log_interval", "eval_batch_size", "threads")


def log(message: str) -> None:
    _log(message, stage="train")


class ParseKwargs(argparse.Action):
    """``key=value ...`` -> dict, values read as Python literals (timm's ``--model-kwargs``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        kwargs = {}
        for item in values:
            key, sep, value = item.partition("=")
            if not sep or not key:
                parser.error(f"{option_string}: {item!r} is not KEY=VALUE")
            try:
                kwargs[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                kwargs[key] = value
        setattr(namespace, self.dest, kwargs)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sret-train-cifar", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--data-dir", required=True, help="ImageFolder with train/ and test/ (or val/), or a torchvision"
                                                     " CIFAR download folder")
    p.add_argument("--model", default="sret_cifar", help="registered model name (default: %(default)s)")
    p.add_argument("--model-kwargs", nargs="*", default={}, action=ParseKwargs, metavar="KEY=VALUE",
                   help="constructor arguments, e.g. nll=False lrc=False stem=patch")
    p.add_argument("--output", default=None, help="the run's folder (required unless --no-save)")
    p.add_argument("--no-save", action="store_true", help="a trial run that keeps nothing")
    p.add_argument("--resume", action="store_true", help="continue the run in --output (same settings)")
    p.add_argument("--force", action="store_true", help="start over in an --output that holds a run")
    p.add_argument("--epochs", type=at_least(1), default=40)
    p.add_argument("--batch-size", type=at_least(2), default=128)
    p.add_argument("--eval-batch-size", type=at_least(1), default=500)
    p.add_argument("--val-split", type=at_least(0), default=5000,
                   help="images held out of train for validation (0: none; default %(default)s)")
    p.add_argument("--opt", default="adamw", help="timm optimizer name (default: %(default)s)")
    p.add_argument("--lr", type=at_least(0.0, float), default=1e-3)
    p.add_argument("--weight-decay", type=at_least(0.0, float), default=0.05)
    p.add_argument("--clip-grad", type=at_least(0.0, float), default=None)
    p.add_argument("--sched", default="cosine", help="timm scheduler name (default: %(default)s)")
    p.add_argument("--warmup-epochs", type=at_least(0), default=5)
    p.add_argument("--warmup-lr", type=at_least(0.0, float), default=1e-6)
    p.add_argument("--min-lr", type=at_least(0.0, float), default=1e-5)
    p.add_argument("--aa", default="rand-m9-mstd0.5-inc1",
                   help="timm RandAugment config, or cifar10: AutoAugment's CIFAR-10 policy (torchvision's), applied"
                        " before the crop ('' or none: off; default: DeiT's %(default)s)")
    p.add_argument("--reprob", type=in_range(0.0, 1.0), default=0.25, help="random erasing probability")
    p.add_argument("--mixup", type=at_least(0.0, float), default=0.8, help="Mixup alpha (0: off)")
    p.add_argument("--cutmix", type=at_least(0.0, float), default=1.0, help="CutMix alpha (0: off)")
    p.add_argument("--smoothing", type=in_range(0.0, 1.0), default=0.1, help="label smoothing")
    p.add_argument("--drop-path", type=in_range(0.0, 1.0), default=None, help="stochastic depth (default: the model's)")
    p.add_argument("--model-ema", action="store_true", help="keep an exponential moving average of the weights")
    p.add_argument("--model-ema-decay", type=in_range(0.0, 1.0), default=0.999)
    p.add_argument("--mixed-depth", default="",
                   help="also train shallower depths with the same weights, DEPTH[:WEIGHT],... (e.g. 1:0.5)")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--split-seed", type=seed, default=0, help="which images --val-split holds out")
    p.add_argument("--threads", type=at_least(0), default=0, help="torch threads (0: torch's default)")
    p.add_argument("--max-steps-per-epoch", type=at_least(1), default=None, help="for smoke tests")
    p.add_argument("--log-interval", type=at_least(0), default=50, help="updates between progress lines (0: none)")
    return p


def _timm():
    try:
        import timm.data
        import timm.data.random_erasing
        import timm.loss
        import timm.optim
        import timm.scheduler
        import timm.utils
    except ImportError as err:
        raise UserError("sret-train-cifar trains with timm's library: pip install 'fairseq-sret[timm]'"
                        f" ({err})") from None
    return timm


# ----------------------------------------------------------------------------- data
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


def normalise(images: Tensor, mean, std) -> Tensor:
    """uint8 (B, 3, H, W) -> float, (x / 255 - mean) / std."""
    mean_t = torch.tensor(mean).view(1, 3, 1, 1) * 255
    std_t = torch.tensor(std).view(1, 3, 1, 1) * 255
    return (images.float() - mean_t) / std_t


@torch.no_grad()
def evaluate(model: nn.Module, data: ImageTensors, mean, std, batch_size: int) -> Dict[str, float]:
    """Top-1 accuracy (%) and cross-entropy of ``model`` on ``data``."""
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(data), batch_size):
        images = normalise(data.images[start:start + batch_size].permute(0, 3, 1, 2), mean, std)
        target = data.targets[start:start + batch_size]
        logits = model(images)
        loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
        correct += int((logits.argmax(1) == target).sum())
    return {"acc1": 100.0 * correct / len(data), "loss": loss_sum / len(data)}


def evaluate_depths(model: nn.Module, data: ImageTensors, mean, std, batch_size: int) -> Dict[str, dict]:
    """:func:`evaluate` at every depth of a recursive model (``{"depth2": ..., "depth1": ...}``),
    or ``{"": ...}``."""
    if not isinstance(model, DepthControl):
        return {"": evaluate(model, data, mean, std, batch_size)}
    results = {}
    for depth in range(model.recursions, 0, -1):
        with model.at_depth(depth):
            results[f"depth{depth}"] = evaluate(model, data, mean, std, batch_size)
    return results


# ----------------------------------------------------------------------------- state
def rng_state() -> dict:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss]}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def training_processors(history: List[dict]) -> dict:
    """``cpu``: the processor the run trained on, and ``cpu_seconds_by_cpu``: its training CPU
    seconds by processor. A run resumed on another machine names every processor it ran on
    (joined by " + "), so that its seconds are never filed under one of them; epochs logged
    without one (before processors were recorded) count under "not recorded"."""
    by_cpu: Dict[str, float] = {}
    before = 0.0
    for stats in history:
        name = stats.get("cpu", "not recorded")
        by_cpu[name] = by_cpu.get(name, 0.0) + stats["cpu_seconds"] - before
        before = stats["cpu_seconds"]
    return {"cpu": " + ".join(by_cpu) if by_cpu else cpu_model(), "cpu_seconds_by_cpu": by_cpu}


def tested(output: Path) -> bool:
    """Whether the run in ``output`` has its test result (a ``result.json`` that reads: a
    damaged one, of a kill while it was written, is no result)."""
    try:
        result = json.loads((output / "result.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(result, dict) and "test" in result


def training_threads(history: List[dict]):
    """The torch thread count the run trained with (an int), or, for a run resumed with another
    ``--threads`` (the final weights depend on it), every count in the order used, joined by
    " + " (epochs logged before thread counts were recorded count as "not recorded")."""
    counts: List[object] = []
    for stats in history:
        count = stats.get("threads", "not recorded")
        if not counts or counts[-1] != count:
            counts.append(count)
    if len(counts) == 1 and isinstance(counts[0], int):
        return counts[0]
    return " + ".join(str(c) for c in counts) if counts else torch.get_num_threads()


def settings_of(args) -> dict:
    return {k: v for k, v in sorted(vars(args).items()) if k not in NOT_SETTINGS}


def settings_for(argv) -> dict:
    """The settings a run with these arguments records in its ``result.json`` (as JSON reads them)."""
    return json.loads(json_text.dumps(settings_of(get_parser().parse_args(argv))))


def describe_difference(old: dict, new: dict) -> str:
    keys = sorted(set(old) | set(new))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k))


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


# ----------------------------------------------------------------------------- the run
def refuse_other_runs(args, outputs: Outputs) -> None:
    """Refuse, before anything is written, a folder that holds a run (unless ``--resume`` or
    ``--force``) or files this command may not replace, and ``--resume`` without a run."""
    from .outputs import restore_replaced

    out = Path(args.output)
    restore_replaced(out)  # a start-over killed before its first save: the old run is put back first
    if args.resume:
        if not (out / "checkpoint_last.pt").is_file():
            raise UsageError(f"--resume: {out} holds no checkpoint_last.pt to continue from; drop --resume to start")
        return
    present = [name for name in RUN_FILES if (out / name).exists()]
    if present and not args.force:
        raise OutputInTheWay(f"{out} holds a run ({', '.join(present)}): continue it with --resume, give another"
                             " --output, or pass --force to start over (replaced once the new run has started)")
    outputs.check([out / name for name in RUN_FILES], folders=[out])


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


#: ``--aa`` values naming one of torchvision's AutoAugment policies (``AutoAugmentPolicy``'s values)
AUTO_AUGMENT_POLICIES = ("cifar10",)
#: the fill of the pixels AutoAugment's shears, translations and rotations uncover: the grey of
#: the AutoAugment implementation the CCT recipe trained with
AUTO_AUGMENT_FILL = (128, 128, 128)


def auto_augment_transform(policy: str):
    """torchvision's AutoAugment with ``policy`` (one of :data:`AUTO_AUGMENT_POLICIES`), on
    (3, H, W) uint8 tensors; its random choices draw from torch's generator."""
    from torchvision.transforms import AutoAugment, AutoAugmentPolicy

    return AutoAugment(AutoAugmentPolicy(policy), fill=list(AUTO_AUGMENT_FILL))


#: the sections of timm's RandAugment config after "rand" (timm skips others without a word)
RAND_AUGMENT_SECTION = re.compile(r"(mstd|mmax|inc|m|n|p)\d.*|t(weights|3aw|3a)")


def check_rand_augment(config: str) -> None:
    """UsageError for an ``--aa`` that timm would misread: another kind than ``rand``, or a
    section timm does not know (which it would skip, training with its defaults instead)."""
    kind, *sections = config.split("-")
    if kind != "rand":
        raise UsageError(f"--aa {config}: a RandAugment config starts with 'rand' (e.g. rand-m9-mstd0.5-inc1),"
                         f" an AutoAugment policy is one of {', '.join(AUTO_AUGMENT_POLICIES)}; '' or none turns"
                         " it off")
    unknown = [section for section in sections if not RAND_AUGMENT_SECTION.fullmatch(section)]
    if unknown:
        raise UsageError(f"--aa {config}: unknown section {unknown[0]!r}; the sections are mN, nN, pX, mstdX,"
                         " mmaxN, incN and tweights, t3a or t3aw")


#: constructor arguments the data or an option decides: never in --model-kwargs
DECIDED_KWARGS = {"num_classes": "the data's class folders", "drop_path_rate": "--drop-path"}


def check_options(args) -> None:
    """UsageError for options the run would misread, before anything is loaded or written."""
    check_recipe(args)
    decided = [f"{key} (set by {by})" for key, by in DECIDED_KWARGS.items()
               if key in args.model_kwargs and (key != "drop_path_rate" or args.drop_path is not None)]
    if decided:
        raise UsageError(f"--model-kwargs: {', '.join(decided)} cannot be given here")
    if args.aa and args.aa != "none" and args.aa not in AUTO_AUGMENT_POLICIES:
        check_rand_augment(args.aa)


def check_recipe(args) -> None:
    """UsageError for a recipe timm's parts would fail on mid-training: an odd batch for
    Mixup/CutMix (each image is mixed with its mirror in the batch), and a ``--sched`` that
    builds no per-update scheduler (``none``, ``plateau``, a name timm does not know)."""
    if (args.mixup or args.cutmix) and args.batch_size % 2:
        raise UsageError(f"--batch-size {args.batch_size}: Mixup/CutMix (--mixup {args.mixup:g}, --cutmix"
                         f" {args.cutmix:g}) mix each image with another of its batch, which needs an even batch;"
                         f" give --batch-size {args.batch_size + 1}, or --mixup 0 --cutmix 0")
    try:
        import timm.scheduler
    except ImportError:  # named when the run starts (_timm)
        return
    weight = nn.Parameter(torch.zeros(1))
    try:
        scheduler, _ = timm.scheduler.create_scheduler_v2(
            torch.optim.SGD([weight], lr=args.lr), sched=args.sched, num_epochs=args.epochs,
            warmup_epochs=args.warmup_epochs, warmup_lr=args.warmup_lr, min_lr=args.min_lr, step_on_epochs=False,
            updates_per_epoch=1)
    except (ValueError, AssertionError) as exc:
        raise UsageError(f"--sched {args.sched}: {exc or 'timm cannot schedule it per update'}") from None
    if scheduler is None:
        raise UsageError(f"--sched {args.sched}: timm builds no scheduler for it; for a constant learning rate"
                         " give --sched constant (and --warmup-epochs 0 for no warm-up)")


def check_command(argv) -> None:
    """UsageError, with argparse's message, for arguments this command would refuse before
    training (what a runner checks before it starts any run)."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = get_parser().parse_args(argv)
    except SystemExit:
        lines = errors.getvalue().strip().splitlines()
        raise UsageError(lines[-1].split("error: ", 1)[-1] if lines else "invalid arguments") from None
    check_options(args)


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


def run(argv=None) -> dict:
    parser = get_parser()
    args = parser.parse_args(argv)
    if not args.output and not args.no_save:
        parser.error("--output DIR is required (the run's checkpoint and log go there); --no-save trains a trial run")
    if args.output and args.no_save:
        parser.error("--output and --no-save contradict each other")
    if args.resume and args.force:
        parser.error("--resume continues the run in --output, --force starts it over: give one")
    for option in ("resume", "force"):
        if args.no_save and getattr(args, option):
            parser.error(f"--{option} acts on the run in --output, and --no-save keeps no run: give --output"
                         f" DIR --{option}, or drop --{option}")
    check_options(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    timm = _timm()
    # as the manifest (JSON) stores them: tuples in --model-kwargs come back as lists
    outputs = Outputs("sret-train-cifar", force=args.force, settings=settings_for(argv))
    if args.output:
        refuse_other_runs(args, outputs)  # a refusal leaves nothing behind, not even the lock file
    # --force: the old run's files are replaced by the new run's first epoch; a failure before it keeps them
    with exclusive(args.output, "sret-train-cifar") if args.output else contextlib.nullcontext(), \
            (outputs.starting_over(args.output, RUN_FILES) if args.output and args.force
             else contextlib.nullcontext()) as made:
        return _train(args, timm, outputs, on_saved=made)


def _train(args, timm, outputs: Outputs, on_saved=None) -> dict:
    return CifarRun(args, timm, outputs, on_saved=on_saved).train()


class CifarRun:
    """One training run of ``sret-train-cifar``: the data, the model and timm's training parts
    built in a fixed order (the seeds make a run reproducible), then the epochs, each saved to
    ``--output`` so that ``--resume`` continues after the last one, then the test."""

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
        self.soft_target_loss = timm.loss.SoftTargetCrossEntropy()

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
        if resume is not None:
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
    def loss_of(self, logits: Tensor, target: Tensor) -> Tensor:
        if self.mixup is not None:  # Mixup's targets are class distributions
            return self.soft_target_loss(logits, target)
        return F.cross_entropy(logits, target, label_smoothing=self.args.smoothing)

    def train(self) -> dict:
        args = self.args
        log(f"{args.model} {self.model_kwargs}: {self.facts['params']:,} parameters, {self.facts['macs'] / 1e6:.1f}M"
            f" MACs; {len(self.train_split):,} training images ({self.train_all.source}), {self.steps_per_epoch}"
            f" updates per epoch, epochs {self.start_epoch + 1}-{args.epochs}")
        run_started = time.time()
        for epoch in range(self.start_epoch, args.epochs):
            cpu_start, wall_start = time.process_time(), time.time()
            stats = self._train_epoch(epoch)
            train_cpu = time.process_time() - cpu_start
            stats["train_images_per_cpu_s"] = stats.pop("seen") / max(train_cpu, 1e-9)
            stats.update(self._validate())
            self._check_finite(self.model, stats, f"epoch {epoch + 1}")
            self.cpu_seconds += time.process_time() - cpu_start
            stats.update(cpu_seconds=self.cpu_seconds, wall_seconds=time.time() - wall_start, cpu=self.processor,
                         threads=torch.get_num_threads())
            self.history.append(stats)
            shown = ", ".join(f"{k} {v:.4g}" for k, v in stats.items() if k not in ("epoch", "cpu"))
            log(f"epoch {epoch + 1}/{args.epochs} done: {shown}")
            if args.output:
                self._save(epoch)
        return self._test(run_started)

    def _train_epoch(self, epoch: int) -> dict:
        """One epoch's updates; the mean losses, the learning rate and ``seen`` (images)."""
        args, model, optimizer = self.args, self.model, self.optimizer
        model.train()
        order = torch.Generator().manual_seed(args.seed * 100003 + epoch)
        loader = DataLoader(self.train_set, batch_size=args.batch_size, shuffle=True, drop_last=True,
                            generator=order, num_workers=0)
        sums: Dict[str, float] = {}
        seen = 0
        for step, (images, target) in enumerate(loader):
            if step >= self.steps_per_epoch:
                break
            x = normalise(images, self.mean, self.std)
            if self.erasing is not None:
                x = self.erasing(x)
            if self.mixup is not None:
                x, target = self.mixup(x, target)
            loss, losses = self._losses(x, target, epoch, step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if args.clip_grad:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
            optimizer.step()
            self.scheduler.step_update(epoch * self.steps_per_epoch + step + 1)
            if self.ema is not None:
                self.ema.update(model, step=epoch * self.steps_per_epoch + step)
            for k, v in losses.items():
                sums[k] = sums.get(k, 0.0) + v.item() * x.size(0)
            seen += x.size(0)
            if args.log_interval and step % args.log_interval == 0:
                log(f"epoch {epoch + 1}/{args.epochs} update {step}/{self.steps_per_epoch} loss {loss.item():.4f}"
                    f" lr {optimizer.param_groups[0]['lr']:.2e}")
        return {"epoch": epoch, **{f"train_{k}": v / seen for k, v in sums.items()},
                "lr": optimizer.param_groups[0]["lr"], "seen": seen}

    def _losses(self, x: Tensor, target: Tensor, epoch: int, step: int):
        """(the loss to minimise, the losses to log); a loss that is not finite stops the run."""
        loss = self.loss_of(self.model(x), target)
        losses = {"loss": loss}
        if self.depth_terms:
            loss, depth_losses = mixed_depth_loss(self.model, self.depth_terms, loss,
                                                  lambda: self.loss_of(self.model(x), target))
            losses = {f"loss_depth{k}": v for k, v in depth_losses.items()}
        if not math.isfinite(loss.item()):
            raise UserError(f"the loss is {loss.item()} at epoch {epoch} update {step}: training diverged;"
                            " lower --lr or set --clip-grad")
        return loss, losses

    @staticmethod
    def _check_finite(model: nn.Module, stats: dict, where: str) -> None:
        """UserError for a diverged model (a weight or a loss that is not finite): its accuracy is no result."""
        try:
            check_finite(model, stats, where)
        except FloatingPointError as exc:
            raise UserError(f"{exc}: training diverged; lower --lr or set --clip-grad") from None

    def _validate(self) -> dict:
        if self.val is None:
            return {}
        batch = self.args.eval_batch_size
        stats = {f"val_{k}": v for k, v in evaluate(self.model, self.val, self.mean, self.std, batch).items()}
        if self.ema is not None:
            stats.update({f"val_ema_{k}": v for k, v in
                          evaluate(self.ema.module, self.val, self.mean, self.std, batch).items()})
        return stats

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
        self.outputs.write_text(Path(args.output) / "log.jsonl",
                                "".join(json_text.dumps(h) + "\n" for h in self.history))
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
                self._check_finite(self.model, {f"{name} loss {depth}".strip(): scores["loss"]}, "the last epoch")
        log(f"test top-1: {json_text.dumps(result['test'])}"
            + (f", EMA {json_text.dumps(result['test_ema'])}" if ema else "")
            + f" ({time.time() - run_started:.0f} s)")
        if args.output:
            self.outputs.write_text(Path(args.output) / "result.json", json_text.dumps(result, indent=1) + "\n")
        return result


@user_errors("sret-train-cifar", interrupted="interrupted; continue with the same command and --resume (from the last"
                                             " finished epoch)")
def main(argv=None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
