"""Where an epoch of ``sret-train-cifar`` goes: decoding, the input pipeline, the model.

    python -m benchmarks.bench_cifar_input --data DATA           # a CIFAR-10 ImageFolder or download

Process CPU time on one thread: decoding both splits once, the input pipeline of one batch
(crop, flip, RandAugment, normalisation, random erasing, Mixup/CutMix; the recipe of
examples/cifar10/ladder.yaml), and a training update (forward, backward, AdamW step) of
each model at batch 128. ``--smoke`` generates a tiny ImageFolder and times a few steps.
"""

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import benchmark_parser, finish_benchmark, median, positive_int, print_table, start_benchmark

MODELS = ("sret_cifar_baseline", "sret_cifar_baseline_deep", "sret_cifar_wo_slice", "sret_cifar")


def tiny_image_folder(root: Path) -> Path:
    from PIL import Image

    g = np.random.default_rng(0)
    for split, n in (("train", 40), ("test", 10)):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(g.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / split / label / f"{i}.png")
    return root


def cpu_seconds(fn, repeats: int) -> float:
    """Median process CPU seconds of ``fn()`` over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return median(times)


def build_parser():
    p = benchmark_parser(__doc__, smoke="a generated 80-image folder, 2 repeats, batch 8",
                         device=False)
    p.set_defaults(threads=1)
    p.add_argument("--data", default=None, help="ImageFolder (train/, test/) or torchvision CIFAR download")
    p.add_argument("--batch-size", type=positive_int, default=128)
    p.add_argument("--repeats", type=positive_int, default=10, help="timed batches per measurement (median)")
    return p


def main(argv=None) -> None:
    p = build_parser()
    args = p.parse_args(argv)
    if not args.smoke and args.data is None:
        p.error("--data is required (or --smoke)")
    start_benchmark(args, torch.device("cpu"))
    import timm.data
    import timm.data.random_erasing
    import timm.loss

    from fairseq_sret.vision import create_model
    from fairseq_sret.vision.registry import get_pretrained_cfg
    from fairseq_sret_cli import UserError
    from fairseq_sret_cli.image_tensors import load_split
    from fairseq_sret_cli.train_cifar import AugmentedImages, normalise

    with tempfile.TemporaryDirectory() as tmp:
        data = str(tiny_image_folder(Path(tmp))) if args.smoke else args.data
        batch, repeats = (8, 2) if args.smoke else (args.batch_size, args.repeats)
        start = time.process_time()
        try:
            train, test = load_split(data, "train", "--data"), load_split(data, "test", "--data")
        except UserError as exc:  # a missing, damaged or unusable image set: one line, as argparse's errors
            p.error(str(exc))
        decode = time.process_time() - start

    cfg = get_pretrained_cfg("sret_cifar")
    hparams = dict(translate_const=int(32 * 0.45), img_mean=tuple(round(255 * m) for m in cfg["mean"]),
                   magnitude_max=9.99)
    augmented = AugmentedImages(train, rand_augment=timm.data.rand_augment_transform("rand-m9-mstd0.5-inc1", hparams))
    erasing = timm.data.random_erasing.RandomErasing(0.25, mode="pixel", device="cpu")
    mixup = timm.data.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=len(train.classes))
    g = torch.Generator().manual_seed(0)

    def input_batch():
        index = torch.randint(len(augmented), (batch,), generator=g).tolist()
        images, target = zip(*(augmented[i] for i in index))
        return mixup(erasing(normalise(torch.stack(images), cfg["mean"], cfg["std"])), torch.stack(target))

    pipeline = cpu_seconds(input_batch, repeats)
    x, target = input_batch()
    loss_fn = timm.loss.SoftTargetCrossEntropy()
    updates = len(train) // batch
    rows = [["decoding train + test once", f"{len(train) + len(test):,} images", f"{decode:.1f}", "", ""],
            ["input pipeline", f"batch {batch}", f"{pipeline * 1e3:.1f} ms", f"{batch / pipeline:.0f}",
             f"{pipeline * updates:.0f}"]]
    for name in MODELS:
        model = create_model(name, num_classes=len(train.classes)).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def update():
            loss = loss_fn(model(x), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        step = cpu_seconds(update, repeats)
        rows.append([f"training update, `{name}`", f"batch {batch}", f"{step * 1e3:.1f} ms", f"{batch / step:.0f}",
                     f"{step * updates:.0f}"])
    print_table(f"CPU time of an epoch's parts ({len(train):,} training images, {updates} updates of {batch})",
                ["part", "unit", "CPU time", "images / CPU s", "CPU s per epoch"], rows)
    finish_benchmark(args)


if __name__ == "__main__":
    main()
