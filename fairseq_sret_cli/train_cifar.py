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

The training loop is the vision trainer's (:mod:`fairseq_sret_cli.vision_trainer`); this
command is its CIFAR recipe's front end (:mod:`~fairseq_sret_cli.vision_trainer.cifar_recipe`).
"""

import argparse
import ast
import contextlib
import io
import json
import re
import sys

import torch
from torch import nn

from fairseq_sret import json_text
from . import HelpFormatter, UsageError, UserError, at_least, in_range, seed, user_errors
from .outputs import Outputs, exclusive
from .vision_trainer.cifar_recipe import (  # noqa: F401  (the recipe's names, imported from here by the lab)
    AUTO_AUGMENT_FILL, AUTO_AUGMENT_POLICIES, NOT_SETTINGS, RUN_FILES, AugmentedImages, CifarRun,
    auto_augment_transform, build_model, data_facts, data_fingerprints, load_splits, resume_state, settings_of,
)
from .vision_trainer.evaluation import evaluate_depths, evaluate_images as evaluate, normalise  # noqa: F401
from .vision_trainer.record import describe_difference, training_processors, training_threads  # noqa: F401
from .vision_trainer.run_folders import refuse_other_runs


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


def settings_for(argv) -> dict:
    """The settings a run with these arguments records in its ``result.json`` (as JSON reads them)."""
    return json.loads(json_text.dumps(settings_of(get_parser().parse_args(argv))))


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


@user_errors("sret-train-cifar", interrupted="interrupted; continue with the same command and --resume (from the last"
                                             " finished epoch)")
def main(argv=None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
