"""sret_transformer as a fairseq model: equivalence, decoding, configuration."""

import itertools

import pytest
import torch

pytest.importorskip("fairseq")


from fairseq import search
from fairseq.sequence_generator import SequenceGenerator
from fairseq_sret.conversion.convert import fairseq_transformer_to_sret
from nmt_helpers import SMALL, DummyTask, build, sliced_model

PLAIN = dict(encoder_recursions=1, decoder_recursions=1, nll_ratio=0.0, no_lrc=True,
             encoder_groups="1", decoder_groups="1")


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def sample_batch(task, batch=3, src_len=9, tgt_len=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    low, high = d.nspecial, len(d)
    src = torch.randint(low, high, (batch, src_len), generator=g)
    src[1, :3] = d.pad()  # left-padded source, as fairseq batches it
    src[:, -1] = d.eos()
    lengths = src.ne(d.pad()).sum(1)
    prev = torch.randint(low, high, (batch, tgt_len), generator=g)
    prev[:, 0] = d.eos()
    prev[2, 5:] = d.pad()  # right-padded target
    return src, lengths, prev


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("share", ["none", "decoder", "all"])
def test_plain_sret_equals_fairseq_transformer(normalize_before, share):
    kw = dict(SMALL, encoder_normalize_before=normalize_before, decoder_normalize_before=normalize_before,
              share_decoder_input_output_embed=share == "decoder", share_all_embeddings=share == "all")
    torch.manual_seed(0)
    ref, task = build("transformer", **kw)
    ours, _ = build("sret_transformer", task, post_ln=not normalize_before, **kw, **PLAIN)
    assert n_params(ours) == n_params(ref)
    ours.load_state_dict(fairseq_transformer_to_sret(ref.state_dict()))
    ref.eval(), ours.eval()
    src, lengths, prev = sample_batch(task)
    expected, _ = ref(src, lengths, prev)
    got, _ = ours(src, lengths, prev)
    assert (got - expected).abs().max() <= 1e-5


def test_post_ln_alone_is_fairseqs_post_ln_transformer():
    """``--post-ln`` without ``--*-normalize-before`` has no final layer norms, as fairseq's
    post-LN transformer (what sret-uptrain's fine-tuning options rely on)."""
    torch.manual_seed(0)
    ref, task = build("transformer", **SMALL)
    ours, _ = build("sret_transformer", task, post_ln=True, **SMALL, **PLAIN)
    ours.load_state_dict(fairseq_transformer_to_sret(ref.state_dict()))  # strict: no extra norms
    ref.eval(), ours.eval()
    src, lengths, prev = sample_batch(task)
    assert (ours(src, lengths, prev)[0] - ref(src, lengths, prev)[0]).abs().max() <= 1e-5


def test_sret_additions_add_exactly_their_parameters():
    plain, _ = build("sret_transformer", **SMALL, **PLAIN)
    with_lrc, _ = build("sret_transformer", **SMALL, **dict(PLAIN, no_lrc=False))
    # LRC: 2 scalars per residual; encoder layer 2 residuals, decoder layer 3
    assert n_params(with_lrc) - n_params(plain) == 2 * (2 * 2 + 2 * 3)
    rec, _ = build("sret_transformer", **SMALL, **dict(PLAIN, encoder_recursions=3, decoder_recursions=2))
    assert n_params(rec) == n_params(plain)  # recursion shares the layer's weights
    nll, _ = build("sret_transformer", **SMALL, **dict(PLAIN, encoder_recursions=3, decoder_recursions=2, nll_ratio=0.5))
    dim, hidden = 32, 16
    per_nll = 2 * dim + dim * hidden + hidden + hidden * dim + dim
    assert n_params(nll) - n_params(plain) == per_nll * (2 * 3 + 2 * 2)


CONFIGS = list(itertools.product([1, 2, 3], [1, 2, 4], [True, False], [0.0, 1.0]))


@pytest.mark.parametrize("recursions,groups,lrc,nll", CONFIGS)
def test_incremental_decoding_equals_teacher_forcing(recursions, groups, lrc, nll):
    torch.manual_seed(recursions * 100 + groups * 10 + int(lrc))
    model, task = build(
        "sret_transformer", **SMALL, encoder_recursions=recursions, decoder_recursions=recursions,
        encoder_groups=str(groups), decoder_groups=",".join([str(groups)] + ["1"] * (recursions - 1)),
        decoder_partition="random", nll_ratio=nll, no_lrc=not lrc,
    )
    model.eval()
    with torch.no_grad():
        # perturb LRC coefficients away from 1 so a wrong application shows
        for name, p in model.named_parameters():
            if name.endswith(("skip_scale", "branch_scale")):
                p.uniform_(0.5, 1.5)
    src, lengths, prev = sample_batch(task, tgt_len=8)
    prev = prev.clone()
    prev[prev.eq(task.target_dictionary.pad())] = task.target_dictionary.nspecial  # no target padding
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        full = model.get_normalized_probs(model.decoder(prev, encoder_out=encoder_out), log_probs=True)
        state = {}
        steps = []
        for t in range(prev.size(1)):
            out = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
            steps.append(model.get_normalized_probs(out, log_probs=True))
    assert (torch.cat(steps, dim=1) - full).abs().max() <= 1e-4


def generate(model, task, src, lengths, beam=4):
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=12)
    hyps = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    return [(h[0]["tokens"].tolist(), round(float(h[0]["score"]), 4)) for h in hyps]


@pytest.mark.parametrize("groups", ["1", "2,1", "4,2"])
def test_beam_search_is_independent_of_batch_order(groups):
    model, task = sliced_model(groups, seed=1)
    d = task.source_dictionary
    g = torch.Generator().manual_seed(3)
    sents = [torch.randint(d.nspecial, len(d), (n,), generator=g).tolist() + [d.eos()] for n in (6, 3, 8, 5)]

    def batch(order):
        width = max(len(sents[i]) for i in order)
        src = torch.full((len(order), width), d.pad())
        for row, i in enumerate(order):
            src[row, width - len(sents[i]):] = torch.tensor(sents[i])  # left padding
        return src, src.ne(d.pad()).sum(1)

    with torch.no_grad():
        straight = generate(model, task, *batch([0, 1, 2, 3]))
        shuffled = generate(model, task, *batch([2, 0, 3, 1]))
        alone = [generate(model, task, *batch([i]))[0] for i in range(4)]
    assert shuffled == [straight[2], straight[0], straight[3], straight[1]]
    assert alone == straight


def test_named_architectures_match_fairseq_widths():
    widths = {
        "sret_transformer_iwslt_de_en": ("transformer_iwslt_de_en", 512, 1024, 4),
        "sret_transformer_wmt_en_de": ("transformer_wmt_en_de", 512, 2048, 8),
        "sret_transformer_wmt_en_de_big": ("transformer_vaswani_wmt_en_de_big", 1024, 4096, 16),
    }
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    for ours, (theirs, dim, ffn, heads) in widths.items():
        a, b = argparse.Namespace(), argparse.Namespace()
        ARCH_CONFIG_REGISTRY[ours](a)
        ARCH_CONFIG_REGISTRY[theirs](b)
        for side in ("encoder", "decoder"):
            assert getattr(a, f"{side}_embed_dim") == getattr(b, f"{side}_embed_dim") == dim
            assert getattr(a, f"{side}_ffn_embed_dim") == getattr(b, f"{side}_ffn_embed_dim") == ffn
            assert getattr(a, f"{side}_attention_heads") == getattr(b, f"{side}_attention_heads") == heads
        assert a.dropout == b.dropout


def test_lrc_coefficients_listed():
    model, _ = build("sret_transformer", **SMALL)
    coeffs = model.lrc_coefficients()
    assert coeffs and all(v == 1.0 for v in coeffs.values())
    assert any("nlls" in k for k in coeffs)


def test_encoder_and_decoder_build_from_their_configuration_alone():
    """fairseq's ``build_encoder``/``build_decoder`` read their side's spec from the configuration
    they are given (no state of a model being built): called on their own, as fairseq's hooks
    may be, they build the same layers as the model."""
    from fairseq_sret.models.sret_transformer import SReTTransformerModel

    model, task = build("sret_transformer", **SMALL, encoder_groups="2,1", decoder_recursions=3)
    encoder = SReTTransformerModel.build_encoder(model.args, task.source_dictionary, model.encoder.embed_tokens)
    decoder = SReTTransformerModel.build_decoder(model.args, task.target_dictionary, model.decoder.embed_tokens)
    for built, original in ((encoder, model.encoder), (decoder, model.decoder)):
        assert len(built.layers) == len(original.layers) == 2
        assert [layer.recursive.schedule for layer in built.layers] == [
            layer.recursive.schedule for layer in original.layers]
        assert ({name: p.shape for name, p in built.named_parameters()}
                == {name: p.shape for name, p in original.named_parameters()})
