#!/usr/bin/env python
"""Print parameters and MACs (the paper's "FLOPs") of fairseq-sret vision models.

    python scripts/count_vision.py sret_t sret_s --img-size 224 384
    python scripts/count_vision.py --all            # every registered model at 224
    python scripts/count_vision.py sret_tl --groups 16,1 14,1 1,1

MACs count convolutions, linear layers and the two attention matrix products on one
image (see fairseq_sret/vision/complexity.py); the official numbers use the same rules.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fairseq_sret.vision import count_macs, count_params, create_model, list_models  # noqa: E402


def parse_groups(values):
    """["8,2", "4,1", "1,1"] -> ((8, 2), (4, 1), (1, 1))"""
    try:
        return tuple(tuple(int(g) for g in v.split(",")) for v in values)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"groups must look like 8,2 4,1 1,1: {err}") from err


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="registered model names (see --list)")
    parser.add_argument("--all", action="store_true", help="every registered model")
    parser.add_argument("--list", action="store_true", help="list the registered models and exit")
    parser.add_argument("--img-size", type=int, nargs="+", default=None,
                        help="input resolutions (default: the model's own)")
    parser.add_argument("--groups", nargs="+", default=None,
                        help="override SReT attention groups: one 'g0,g1' per stage")
    parser.add_argument("--num-classes", type=int, default=1000)
    args = parser.parse_args(argv)

    if args.list:
        print("\n".join(list_models()))
        return []
    names = list_models() if args.all else args.models
    if not names:
        parser.error("name at least one model, or pass --all / --list")
    overrides = {"num_classes": args.num_classes}
    if args.groups:
        overrides["groups"] = parse_groups(args.groups)

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    rows = []
    print(f"{'model':34s} {'resolution':>10s} {'params':>14s} {'MACs (G)':>10s}")
    for name in names:
        for size in args.img_size or [None]:
            kwargs = dict(overrides)
            if size is not None:
                kwargs["img_size"] = size
            model = create_model(name, **kwargs)
            params, macs = count_params(model), count_macs(model)
            resolution = "x".join(str(s) for s in model.cfg.img_size)
            print(f"{name:34s} {resolution:>10s} {params:>14,d} {macs / 1e9:>10.3f}")
            rows.append({"model": name, "img_size": resolution, "params": params, "macs": macs})
    return rows


if __name__ == "__main__":
    main()
