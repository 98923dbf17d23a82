"""Train or evaluate an SReT image classifier on an ImageFolder dataset.

    DATA/train/<class>/<image>, DATA/val/<class>/<image>

    # SReT-T from scratch (paper: 300 epochs, batch 1024, lr 1e-3, 5 warm-up epochs)
    sret-train-vision --data DATA --model sret_t --output runs/sret_t
    # soft distillation (no one-hot label) from a teacher's logits or a teacher model
    sret-train-vision --data DATA --model sret_t_distill --teacher-logits teacher.pt
    sret-train-vision --data DATA --model sret_t_distill \\
        --teacher sret_s --teacher-checkpoint teacher.pth
    # fine-tune at 384 (paper: lr 5e-6, no weight decay), from our or official weights
    sret-train-vision --data DATA --model sret_t_distill_384 --finetune SReT_T_distill.pth \\
        --lr 5e-6 --weight-decay 0 --epochs 30 --warmup-epochs 0
    # mixed-depth training: add 0.5 x the loss of the model run with one application per block
    sret-train-vision --data DATA --model sret_t --mixed-depth 1:0.5 --output runs/sret_t_md
    # evaluate, or write a teacher-logits file for the train split
    sret-train-vision --data DATA --model sret_t --eval-only --checkpoint SReT_T.pth
    sret-train-vision --data DATA --model sret_s --checkpoint teacher.pth --dump-logits teacher.pt

AdamW with no weight decay on biases/norms/LRC scalars and the position embedding,
per-step cosine schedule with linear warm-up, label smoothing, stochastic depth (the
model's default, --drop-path to change), random-resized-crop + flip augmentation, and
mixed precision on CUDA (bf16 where supported, else fp16 with loss scaling). DeiT's
RandAugment, Mixup/CutMix, random erasing and repeated augmentation are not included.

Pre-computed teacher logits (``--teacher-logits``) are the teacher's output on the
un-augmented (centre-cropped) image, an approximation of the paper's on-line teacher,
which sees the same augmented crop as the student (``--teacher``).

The training loop is the vision trainer's (:mod:`fairseq_sret_cli.vision_trainer`); this
command is its ImageFolder recipe's front end
(:mod:`~fairseq_sret_cli.vision_trainer.folder_recipe`).
"""

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from fairseq_sret.core.depth import DepthControl
from fairseq_sret.core.mixed_depth import check_mixed_depth, parse_mixed_depth
from fairseq_sret.checkpoints import load_checkpoint as load_checkpoint_file
from fairseq_sret.vision import create_model, load_checkpoint
from .image_folder import EvalTransform, ImageFolder, TrainTransform
from .vision_trainer.evaluation import evaluate
from .vision_trainer.folder_recipe import TrainConfig, train
from .vision_trainer.objectives import autocast_settings
from .vision_trainer.run_folders import FOLDER_RUN_FILES, check_run_folder
from . import HelpFormatter, UsageError, UserError, at_least, in_range, seed, user_errors
from .outputs import Outputs, exclusive
from fairseq_sret import json_text


def get_parser():
    p = argparse.ArgumentParser(prog="sret-train-vision", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--data", required=True, help="folder with train/ and val/ ImageFolder splits")
    p.add_argument("--model", default="sret_t", help="registered model name")
    p.add_argument("--img-size", type=at_least(1), default=None,
                   help="input resolution (default: the one --checkpoint was trained at, else the model's)")
    p.add_argument("--drop-path", type=in_range(0.0, 1.0), default=None, help="stochastic depth rate (default: the model's)")
    p.add_argument("--epochs", type=at_least(1), default=300)
    p.add_argument("--batch-size", type=at_least(1), default=128)
    p.add_argument("--lr", type=at_least(0.0, float), default=1e-3)
    p.add_argument("--min-lr", type=at_least(0.0, float), default=1e-5)
    p.add_argument("--warmup-lr", type=at_least(0.0, float), default=1e-6)
    p.add_argument("--warmup-epochs", type=at_least(0.0, float), default=5)
    p.add_argument("--weight-decay", type=at_least(0.0, float), default=0.05)
    p.add_argument("--label-smoothing", type=in_range(0.0, 1.0), default=0.1)
    p.add_argument("--clip-grad", type=at_least(0.0, float), default=None, help="max gradient norm (default: none)")
    p.add_argument("--teacher-logits", default=None,
                   help="file from --dump-logits: soft distillation from these logits")
    p.add_argument("--teacher", default=None, help="teacher model name: on-line soft distillation")
    p.add_argument("--teacher-checkpoint", default=None, help="weights of --teacher")
    p.add_argument("--distill-temperature", type=at_least(1e-6, float), default=1.0)
    p.add_argument("--mixed-depth", default="",
                   help="mixed-depth training (the paper's explicit deep supervision): shallower depths"
                        " trained with the full depth, comma-separated DEPTH[:WEIGHT] (weight 1 if"
                        " omitted); '1:0.5' adds 0.5 x the loss of the model run with one application"
                        " per shared block (same weights, same head). Each depth's loss is logged"
                        " (train_loss_depth<d>) and evaluated (val_acc1_depth<d>)")
    p.add_argument("--checkpoint", default=None, help="weights to evaluate / dump logits with")
    p.add_argument("--finetune", default=None,
                   help="initial weights (official or ours); the position embedding is interpolated"
                        " and a classifier of another size is re-initialised")
    p.add_argument("--resume", default=None, help="checkpoint_last.pt of an interrupted run")
    p.add_argument("--eval-only", action="store_true")
    p.add_argument("--dump-logits", default=None, help="write the model's logits on train/ to this file")
    p.add_argument("--output", default=None,
                   help="folder for checkpoints and log.jsonl (required to train); a folder holding a run is"
                        " continued only with --resume OUTPUT/checkpoint_last.pt")
    p.add_argument("--no-save", action="store_true", help="train without --output: a trial run that keeps nothing")
    p.add_argument("--force", action="store_true",
                   help="start over in an --output that holds a run (its checkpoints and log.jsonl are replaced),"
                        " or replace a --dump-logits file this command did not make")
    p.add_argument("--device", default="auto")
    p.add_argument("--amp", choices=("auto", "on", "off"), default="auto",
                   help="mixed precision; auto = on for CUDA")
    p.add_argument("--workers", type=at_least(0), default=min(8, os.cpu_count() or 1))
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--max-steps-per-epoch", type=at_least(1), default=None, help="for smoke tests")
    p.add_argument("--log-interval", type=at_least(0), default=50)
    p.add_argument("--compile", action="store_true",
                   help="run the model through torch.compile (training and evaluation; every model"
                        " compiles without graph breaks); checkpoints keep the plain parameter names")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode, e.g. max-autotune (default: torch's default)")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend (inductor; eager / aot_eager only trace, for checks)")
    return p


def build_loader(dataset, batch_size, shuffle, workers, device):
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=shuffle, num_workers=workers,
        pin_memory=device.type == "cuda", persistent_workers=workers > 0,
    )


def load_teacher_logits(path, dataset):
    """Teacher logits aligned with ``dataset`` order, looked up by relative image path."""
    data = load_checkpoint_file(path)
    if not isinstance(data, dict) or not {"samples", "logits"} <= set(data):
        raise UserError(f"{path} is not a teacher-logits file (make one with --dump-logits)")
    classes = list(data.get("classes") or [])
    if (classes and classes != list(dataset.classes)) or data["logits"].size(-1) != len(dataset.classes):
        raise UserError(f"{path} holds the logits of {data['logits'].size(-1)} classes {classes or ''}, the data has"
                        f" {list(dataset.classes)}: dump them with a teacher of these classes")
    index = {s: i for i, s in enumerate(data["samples"])}
    missing = [dataset.relative_path(i) for i in range(len(dataset)) if dataset.relative_path(i) not in index]
    if missing:
        raise KeyError(f"{len(missing)} training images have no teacher logits in {path}, e.g. {missing[0]!r}")
    order = torch.tensor([index[dataset.relative_path(i)] for i in range(len(dataset))])
    return data["logits"].float()[order]


@torch.no_grad()
def dump_logits(model, dataset, path, batch_size, workers, device, amp, outputs: Outputs):
    enabled, dtype, _ = amp
    model.eval()
    chunks = []
    for images, _ in build_loader(dataset, batch_size, False, workers, device):
        with torch.autocast(device.type, dtype=dtype, enabled=enabled):
            chunks.append(model(images.to(device)).float().cpu())
    samples = [dataset.relative_path(i) for i in range(len(dataset))]
    outputs.save({"samples": samples, "logits": torch.cat(chunks), "classes": dataset.classes}, path)


#: what a training run writes in --output
RUN_FILES = FOLDER_RUN_FILES


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name}: not a device; give cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available to this torch ({torch.__version__}); use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: there are {torch.cuda.device_count()} CUDA devices")
    return device


def check_options(args, parser) -> bool:
    """Refuse option combinations that would do nothing, or nothing useful; returns whether
    the command trains."""
    training = not (args.eval_only or args.dump_logits)
    if args.eval_only and args.dump_logits:
        parser.error("give --eval-only or --dump-logits, not both")
    if not training:
        for name in ("output", "resume", "no_save", "teacher", "teacher_logits", "mixed_depth"):
            if getattr(args, name):
                parser.error(f"--{name.replace('_', '-')} does nothing with --eval-only or --dump-logits"
                             " (nothing is trained)")
        if not args.checkpoint and not args.finetune:
            parser.error("--eval-only and --dump-logits need the weights to use: give --checkpoint")
    elif not args.output and not args.no_save:
        parser.error("--output DIR is required to train (checkpoints and log.jsonl go there); --no-save trains"
                     " a trial run that keeps nothing")
    elif args.output and args.no_save:
        parser.error("--output and --no-save contradict each other")
    if not args.compile and (args.compile_mode is not None or args.compile_backend != "inductor"):
        parser.error("--compile-mode and --compile-backend set how --compile compiles: give --compile too")
    if args.teacher_checkpoint and not args.teacher:
        parser.error("--teacher-checkpoint holds the weights of --teacher: give --teacher too")
    return training


def load_weights(model, path, model_name: str, strict: bool = True, classes=None, state=None) -> None:
    """Load ``path`` (its loaded ``state``, if given) into ``model`` (read through the checkpoint
    allow-list); a checkpoint saved by this command for another model, or (``strict``) for other
    class names than ``classes``, is refused naming them."""
    state = load_checkpoint_file(path) if state is None else state
    saved = state.get("model_name") if isinstance(state, dict) else None
    if strict and isinstance(saved, str) and saved != model_name:
        raise UsageError(f"{path} holds a {saved} model ({state.get('model_kwargs')}), not {model_name}:"
                         f" pass --model {saved}")
    saved_classes = state.get("classes") if isinstance(state, dict) else None
    if strict and classes is not None and saved_classes is not None and list(saved_classes) != list(classes):
        raise UserError(f"{path} was trained on the classes {list(saved_classes)}, the data has {list(classes)}:"
                        " its class indices would be compared with other classes' labels")
    try:
        load_checkpoint(model, state, strict=strict)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path}: {exc}") from None


def run(argv=None) -> dict:
    """Parse ``argv`` and train, evaluate or dump logits; returns the last statistics. One
    training at a time holds its ``--output`` (a lock, from the start of training until it
    ends): a second one into the same folder is refused instead of interleaving the two runs'
    files."""
    parser = get_parser()
    args = parser.parse_args(argv)
    training = check_options(args, parser)
    return _run(args, parser, training)


def splits(args, training: bool):
    """(train folder, val folder, whether each is there); UserError when one the work needs is not."""
    train_dir, val_dir = os.path.join(args.data, "train"), os.path.join(args.data, "val")
    has_train, has_val = os.path.isdir(train_dir), os.path.isdir(val_dir)
    if (training or args.dump_logits) and not has_train:
        raise UserError(f"no training split {train_dir}")
    if not has_train and not has_val:
        raise UserError(f"{args.data} holds neither train/ nor val/ (an ImageFolder: SPLIT/CLASS/IMAGE)")
    return train_dir, val_dir, has_train, has_val


def trained_img_size(state, model_name: str):
    """The resolution a checkpoint of this command was trained at (None: not recorded, or
    another model's), the default of ``--img-size`` when evaluating it."""
    if not isinstance(state, dict) or state.get("model_name") != model_name:
        return None
    return (state.get("model_kwargs") or {}).get("img_size")


def compiled(model, args):
    """``torch.compile(model)`` with ``--compile-mode`` and ``--compile-backend``; UsageError
    naming either when torch does not know it."""
    try:
        return torch.compile(model, mode=args.compile_mode, backend=args.compile_backend)
    except RuntimeError as exc:  # torch._dynamo's InvalidBackend, inductor's unknown mode
        raise UsageError(f"--compile-mode {args.compile_mode} --compile-backend {args.compile_backend}:"
                         f" {str(exc).splitlines()[0]}") from None


def build_model(args, parser, classes):
    """(the model of ``--model`` for ``classes``, its arguments, the ``--mixed-depth`` terms),
    with the weights of ``--checkpoint`` or ``--finetune``."""
    model_kwargs = {"num_classes": len(classes)}
    weights = load_checkpoint_file(args.checkpoint) if args.checkpoint else None
    img_size = args.img_size if args.img_size is not None else trained_img_size(weights, args.model)
    if img_size is not None:
        model_kwargs["img_size"] = img_size
    if args.drop_path is not None:
        model_kwargs["drop_path_rate"] = args.drop_path
    try:
        model = create_model(args.model, **model_kwargs)
    except (TypeError, ValueError) as exc:  # an unknown model, a size it cannot take
        settings = ", ".join(f"{k}={v}" for k, v in model_kwargs.items())
        raise UsageError(f"--model {args.model} ({settings}): {exc}") from None
    try:
        depth_terms = parse_mixed_depth(args.mixed_depth)
        if depth_terms:
            if not isinstance(model, DepthControl):
                raise ValueError(f"--mixed-depth: {args.model} has no recursive blocks")
            check_mixed_depth(depth_terms, (model.recursions,), sides=(args.model,))
    except ValueError as exc:
        parser.error(str(exc))
    if args.checkpoint:
        load_weights(model, args.checkpoint, args.model, classes=classes, state=weights)
    if args.finetune:
        load_weights(model, args.finetune, args.model, strict=False)
    return model, model_kwargs, depth_terms


def load_teacher(args, classes, img_size: int, device) -> torch.nn.Module:
    """The frozen ``--teacher`` (with ``--teacher-checkpoint``'s weights, of the same classes)."""
    teacher = create_model(args.teacher, num_classes=len(classes), img_size=img_size).eval()
    if args.teacher_checkpoint:
        load_weights(teacher, args.teacher_checkpoint, args.teacher, classes=classes)
    teacher.to(device)
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def _run(args, parser, training: bool) -> dict:
    logging.getLogger("PIL").setLevel(logging.WARNING)  # fairseq's import sets the root logger to DEBUG
    device = resolve_device(args.device)
    # a logits file and a run's files are different outputs: neither may replace the other
    outputs = Outputs("sret-train-vision", force=args.force,
                      settings={"output": "logits" if args.dump_logits else "run"},
                      inputs=[args.checkpoint, args.finetune, args.resume, args.teacher_logits,
                              args.teacher_checkpoint])
    if args.dump_logits:
        outputs.check([args.dump_logits])
    start_over = training and args.output and check_run_folder(args, outputs)
    torch.manual_seed(args.seed)
    amp = autocast_settings(device, args.amp)
    train_dir, val_dir, has_train, has_val = splits(args, training)
    if args.teacher_logits and args.teacher:
        raise UsageError("give --teacher-logits or --teacher, not both")

    first = ImageFolder(train_dir if has_train else val_dir)
    classes = first.classes
    model, model_kwargs, depth_terms = build_model(args, parser, classes)
    img_size = model.cfg.img_size[0]
    model.to(device)
    # the module that runs (compiled or not); ``model`` keeps the parameters and their names
    net = compiled(model, args) if args.compile else model

    eval_tf = EvalTransform(img_size)
    val_set = ImageFolder(val_dir, eval_tf) if has_val else None
    if val_set is not None and val_set.classes != classes:
        raise UserError(f"val/ classes {val_set.classes} differ from train/ classes {classes}")
    val_loader = build_loader(val_set, args.batch_size, False, args.workers, device) if val_set else None
    # the images are inputs too: --dump-logits onto one is refused, even with --force
    outputs.add_inputs(*(path for data in (first, val_set) if data is not None for path, _ in data.samples))

    if args.dump_logits:
        outputs.check([args.dump_logits])
        dump_logits(net, ImageFolder(train_dir, eval_tf), args.dump_logits, args.batch_size, args.workers, device, amp,
                    outputs)
        print(json_text.dumps({"dumped_logits": args.dump_logits}))
        return {"dumped_logits": args.dump_logits}
    if args.eval_only:
        if val_loader is None:
            raise UserError(f"no validation split {val_dir}")
        stats = evaluate(net, val_loader, device, amp)
        print(json_text.dumps({"eval": stats}))
        return stats

    train_set = ImageFolder(train_dir, TrainTransform(img_size), return_index=True)
    train_loader = build_loader(train_set, args.batch_size, True, args.workers, device)
    teacher_logits = load_teacher_logits(args.teacher_logits, train_set) if args.teacher_logits else None
    teacher = load_teacher(args, classes, img_size, device) if args.teacher else None

    config = TrainConfig(
        epochs=args.epochs, lr=args.lr, min_lr=args.min_lr, warmup_lr=args.warmup_lr,
        warmup_epochs=args.warmup_epochs, weight_decay=args.weight_decay, label_smoothing=args.label_smoothing,
        clip_grad=args.clip_grad, distill_temperature=args.distill_temperature,
        max_steps_per_epoch=args.max_steps_per_epoch, log_interval=args.log_interval,
    )
    try:
        with exclusive(args.output, "sret-train-vision", remove=True) if args.output else contextlib.nullcontext(), \
                (outputs.starting_over(args.output, RUN_FILES) if start_over else contextlib.nullcontext()) as made:
            # --force: the old run's files are replaced by the new run's first epoch; a failure before it keeps them
            stats = train(
                model, train_loader, config, device=device, amp=amp, val_loader=val_loader, net=net, teacher=teacher,
                teacher_logits=teacher_logits, depth_terms=depth_terms, output=args.output, resume=args.resume,
                checkpoint_extra={"model_name": args.model, "model_kwargs": model_kwargs, "classes": classes,
                                  "data": train_set.fingerprint(), "data_legacy": train_set.legacy_fingerprint()},
                options=vars(args), on_saved=made,
            )
    except FloatingPointError as exc:
        last = Path(args.output or "") / "checkpoint_last.pt"
        again = f"; resume from {last} (the last finished epoch)" if args.output and last.is_file() else ""
        if start_over:  # --force: its files are the earlier run's, put back as they were
            again = f"; the earlier run in {args.output} is kept as it was"
        raise UserError(f"{exc}: training diverged; lower --lr or set --clip-grad{again}") from None
    if args.output:
        outputs.record(*(Path(args.output) / name for name in RUN_FILES if (Path(args.output) / name).exists()))
    return stats


@user_errors("sret-train-vision",
             interrupted="interrupted; continue with the same command and --resume OUTPUT/checkpoint_last.pt (the last"
                         " finished epoch)")
def main(argv=None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
