"""Count parameters and MACs (the paper's "FLOPs") of the models.

  sret-count vision sret_t sret_s --img-size 224 384
  sret-count vision --all                       # every registered image model at 224
  sret-count vision sret_tl --groups 16,1 14,1 1,1
  sret-count nmt                                # translation architectures vs fairseq's

vision: MACs count convolutions, linear layers and the two attention matrix products on
one image (fairseq_sret/vision/complexity.py); the official numbers use the same rules.
nmt: parameters of the sret_transformer architectures next to fairseq's baselines, with
the recipes' vocabularies (IWSLT'14 joined 10K subwords, decoder input/output embeddings
shared as in the paper; WMT'14 joined 32K, all embeddings shared). Needs fairseq.
"""

import argparse
import os
import sys

from . import HelpFormatter, UsageError, at_least, user_errors

#: (ours, baseline, vocabulary, embedding sharing, baseline overrides)
NMT_PAIRS = [
    ("sret_transformer_tiny", "transformer", 8000, "all", dict(
        encoder_layers=3, decoder_layers=3, encoder_embed_dim=256, decoder_embed_dim=256,
        encoder_ffn_embed_dim=1024, decoder_ffn_embed_dim=1024, encoder_attention_heads=4,
        decoder_attention_heads=4)),
    ("sret_transformer_iwslt_de_en", "transformer_iwslt_de_en", 10000, "decoder", {}),
    ("sret_transformer_wmt_en_de", "transformer_wmt_en_de", 32768, "all", {}),
    ("sret_transformer_wmt_en_de_big", "transformer_vaswani_wmt_en_de_big", 32768, "all", {}),
]


def parse_groups(values):
    """["8,2", "4,1", "1,1"] -> ((8, 2), (4, 1), (1, 1))"""
    try:
        return tuple(tuple(int(g) for g in v.split(",")) for v in values)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"groups must look like 8,2 4,1 1,1: {err}") from err


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sret-count", description=__doc__, formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True, metavar="{vision,nmt}")
    v = sub.add_parser("vision", help="image models: parameters and MACs", formatter_class=HelpFormatter,
                       description="Parameters and MACs of image models.\n\n  sret-count vision sret_t --img-size 224 384")
    v.add_argument("models", nargs="*", help="registered model names (see --list)")
    v.add_argument("--all", action="store_true", help="every registered model")
    v.add_argument("--list", action="store_true", help="list the registered models and exit")
    v.add_argument("--img-size", type=at_least(1), nargs="+", default=None, help="input resolutions (default: the model's own)")
    v.add_argument("--groups", nargs="+", default=None, help="override SReT attention groups: one 'g0,g1' per stage")
    v.add_argument("--num-classes", type=at_least(0), default=None,
                   help="classifier size (default: the model's own, 1000 for ImageNet models, 10 for CIFAR ones)")
    n = sub.add_parser("nmt", help="translation architectures: parameters", formatter_class=HelpFormatter,
                       description="Parameters of the sret_transformer architectures and fairseq's baselines"
                                   " (markdown table).\n\n  sret-count nmt")
    n.set_defaults(models=None)
    return p


def build(create_model, name: str, kwargs: dict):
    """``create_model(name, **kwargs)``; UsageError naming the option a model does not take
    (``--groups`` of a model without attention groups)."""
    try:
        return create_model(name, **kwargs)
    except TypeError as exc:
        option = next((f"--{key.replace('_', '-')}" for key in kwargs if repr(key) in str(exc)), None)
        if option is None:
            raise
        raise UsageError(f"{option}: {name} has no such setting ({exc}); count it without {option}") from None


def count_vision(args, parser) -> list:
    import torch

    from fairseq_sret.vision import count_macs, count_params, create_model, list_models

    if args.list:
        print("\n".join(list_models()))
        return []
    names = list_models() if args.all else args.models
    if not names:
        parser.error("name at least one model, or pass --all / --list")
    overrides = {} if args.num_classes is None else {"num_classes": args.num_classes}
    if args.groups:
        try:
            overrides["groups"] = parse_groups(args.groups)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"--groups: {exc}")
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    rows = []
    print(f"{'model':34s} {'resolution':>10s} {'params':>14s} {'MACs (G)':>10s}")
    for name in names:
        for size in args.img_size or [None]:
            kwargs = dict(overrides)
            if size is not None:
                kwargs["img_size"] = size
            model = build(create_model, name, kwargs)
            params, macs = count_params(model), count_macs(model)
            resolution = "x".join(str(s) for s in model.cfg.img_size)
            print(f"{name:34s} {resolution:>10s} {params:>14,d} {macs / 1e9:>10.3f}")
            rows.append({"model": name, "img_size": resolution, "params": params, "macs": macs})
    return rows


def count_nmt_model(arch: str, vocab: int, share: str, **overrides):
    """(total parameters, parameters without embeddings, (encoder, decoder) layer applications)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from .toy import ToyTask, architecture_args

    args = architecture_args(
        arch, share_all_embeddings=share == "all", share_decoder_input_output_embed=share in ("all", "decoder"),
        **overrides,
    )
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, ToyTask.of_dictionary_size(vocab))
    total = sum(p.numel() for p in model.parameters())
    embed = model.encoder.embed_tokens.weight.numel()
    if model.decoder.embed_tokens is not model.encoder.embed_tokens:
        embed += model.decoder.embed_tokens.weight.numel()
    applications = (
        args.encoder_layers * getattr(args, "encoder_recursions", 1),
        args.decoder_layers * getattr(args, "decoder_recursions", 1),
    )
    return total, total - embed, applications


def count_nmt() -> list:
    rows = []
    print("| arch | layer applications enc+dec | params (M) | without embeddings (M) "
          "| fairseq baseline | applications | params (M) | without embeddings (M) |")
    print("|---|---|---|---|---|---|---|---|")
    for ours, base, vocab, share, base_overrides in NMT_PAIRS:
        ot, ob, oa = count_nmt_model(ours, vocab, share)
        bt, bb, ba = count_nmt_model(base, vocab, share, **base_overrides)
        base_name = base if base != "transformer" else "transformer (3+3, 256/1024, 4 heads)"
        print(f"| {ours} | {oa[0]}+{oa[1]} | {ot / 1e6:.2f} | {ob / 1e6:.2f} | {base_name} "
              f"| {ba[0]}+{ba[1]} | {bt / 1e6:.2f} | {bb / 1e6:.2f} |")
        rows.append({"arch": ours, "params": ot, "baseline": base, "baseline_params": bt})
    return rows


@user_errors("sret-count")
def main(argv=None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    if args.kind == "vision":
        count_vision(args, parser)
    else:
        count_nmt()
    return 0


if __name__ == "__main__":
    sys.exit(main())
