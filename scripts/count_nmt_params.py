#!/usr/bin/env python
"""Parameter counts of the sret_transformer architectures next to fairseq's baselines.

Usage: python scripts/count_nmt_params.py [--markdown]
Vocabularies as the recipes build them: IWSLT'14 joined 10K subwords (decoder input/output
embeddings shared, as in the paper), WMT'14 joined 32K (all embeddings shared).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairseq_sret.models.toy import ToyTask, architecture_args, build_model  # noqa: E402

PAIRS = [
    # (ours, baseline, vocabulary, embedding sharing)
    ("sret_transformer_tiny", "transformer", 8000, "all", dict(encoder_layers=3, decoder_layers=3, encoder_embed_dim=256, decoder_embed_dim=256, encoder_ffn_embed_dim=1024, decoder_ffn_embed_dim=1024, encoder_attention_heads=4, decoder_attention_heads=4)),
    ("sret_transformer_iwslt_de_en", "transformer_iwslt_de_en", 10000, "decoder", {}),
    ("sret_transformer_wmt_en_de", "transformer_wmt_en_de", 32768, "all", {}),
    ("sret_transformer_wmt_en_de_big", "transformer_vaswani_wmt_en_de_big", 32768, "all", {}),
]


def count(arch, vocab, share, **overrides):
    options = dict(
        share_all_embeddings=share == "all",
        share_decoder_input_output_embed=share in ("all", "decoder"),
        **overrides,
    )
    args = architecture_args(arch, **options)
    model = build_model(arch, task=ToyTask.of_dictionary_size(vocab), **options)
    total = sum(p.numel() for p in model.parameters())
    embed = model.encoder.embed_tokens.weight.numel()
    if model.decoder.embed_tokens is not model.encoder.embed_tokens:
        embed += model.decoder.embed_tokens.weight.numel()
    applications = (
        getattr(args, "encoder_layers") * getattr(args, "encoder_recursions", 1),
        getattr(args, "decoder_layers") * getattr(args, "decoder_recursions", 1),
    )
    return total, total - embed, applications


def main():
    rows = []
    for ours, base, vocab, share, base_overrides in PAIRS:
        o_total, o_body, o_apps = count(ours, vocab, share)
        b_total, b_body, b_apps = count(base, vocab, share, **base_overrides)
        rows.append((ours, base, vocab, o_total, o_body, o_apps, b_total, b_body, b_apps))
    print("| arch | layer applications enc+dec | params (M) | without embeddings (M) "
          "| fairseq baseline | applications | params (M) | without embeddings (M) |")
    print("|---|---|---|---|---|---|---|---|")
    for ours, base, vocab, ot, ob, oa, bt, bb, ba in rows:
        base_name = base if base != "transformer" else "transformer (3+3, 256/1024, 4 heads)"
        print(f"| {ours} | {oa[0]}+{oa[1]} | {ot / 1e6:.2f} | {ob / 1e6:.2f} | {base_name} "
              f"| {ba[0]}+{ba[1]} | {bt / 1e6:.2f} | {bb / 1e6:.2f} |")


if __name__ == "__main__":
    main()
