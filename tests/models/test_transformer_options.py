"""Every option fairseq's ``transformer`` accepts is honoured by ``sret_transformer`` as
fairseq honours it, or refused with an error that names it.

For each option, two models are built from the same seed with the option at two values:
fairseq's ``transformer`` and ``sret_transformer`` must both differ (parameters, their
sharing, or the training-mode output on a fixed batch, under a fixed seed) or both not;
or building ``sret_transformer`` with the second value fails naming the option.
"""

import argparse

import pytest
import torch

pytest.importorskip("fairseq")


from fairseq.models.transformer import TransformerModel
from nmt_helpers import build
from fairseq_sret_cli.toy import ToyTask

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = dict(
    encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32,
    encoder_attention_heads=2, decoder_attention_heads=2, encoder_layers=1, decoder_layers=1,
)

SIDES = ("encoder", "decoder")

#: option (argparse name) -> (first value, second value); None leaves the option unset
INHERITED = {
    "activation_fn": ("relu", "gelu"),
    "dropout": (0.0, 0.3),
    "attention_dropout": (0.0, 0.3),
    "activation_dropout": (0.0, 0.3),
    "relu_dropout": (0.0, 0.3),
    "adaptive_input": (False, True),
    **{f"{side}_{name}": values for side in SIDES for name, values in (
        ("embed_path", (None, "EMBEDDINGS")), ("ffn_embed_dim", (32, 24)), ("layers", (1, 2)),
        ("attention_heads", (2, 4)), ("normalize_before", (False, True)), ("learned_pos", (False, True)),
    )},
    "max_source_positions": (64, 32),
    "max_target_positions": (64, 32),
    "decoder_output_dim": (16, 8),
    "share_decoder_input_output_embed": (False, True),
    "share_all_embeddings": (False, True),
    "merge_src_tgt_embed": (False, True),
    "no_token_positional_embeddings": (False, True),
    "adaptive_softmax_cutoff": (None, "10,20"),
    "adaptive_softmax_dropout": (0.0, 0.3),
    "adaptive_softmax_factor": (4.0, 2.0),
    "layernorm_embedding": (False, True),
    "tie_adaptive_weights": (False, True),
    "tie_adaptive_proj": (False, True),
    "no_scale_embedding": (False, True),
    "no_cross_attention": (False, True),
    "quant_noise_pq_block_size": (8, 4),
    "min_params_to_wrap": (100_000_000, 1),
    "char_inputs": (False, True),
    "export": (False, True),
    "no_decoder_final_norm": (False, True),
    # these two act only with --base-layers, which is refused
    "base_sublayers": (1, 2),
    "base_shuffle": (1, 0),
}
#: options set for both values of an option, so that the option acts in both models
CONTEXT = {"no_decoder_final_norm": dict(decoder_normalize_before=True)}
REFUSED = {
    **{f"{side}_{name}": values for side in SIDES for name, values in (
        ("layerdrop", (0.0, 0.2)), ("layers_to_keep", (None, "0")),
        ("xformers_att_config", (None, '{"name": "scaled_dot_product"}')),
        # one side's width alone: the cross-attention reads the encoder output at the decoder width
        ("embed_dim", (16, 8)),
    )},
    "checkpoint_activations": (False, True),
    "offload_activations": (False, True),
    "cross_self_attention": (False, True),
    "quant_noise_pq": (0.0, 0.1),
    "quant_noise_scalar": (0.0, 0.1),
    "base_layers": (0, 1),
}


def transformer_options():
    parser = argparse.ArgumentParser()
    TransformerModel.add_args(parser)
    return {action.dest for action in parser._actions if action.option_strings and action.dest != "help"}


def test_the_table_covers_every_transformer_option():
    assert set(INHERITED) | set(REFUSED) == transformer_options()
    assert not set(INHERITED) & set(REFUSED)


@pytest.fixture(scope="module")
def embeddings(tmp_path_factory):
    """A pre-trained embedding file (fairseq's text format) for the task's words."""
    path = tmp_path_factory.mktemp("embed") / "embed.txt"
    generator = torch.Generator().manual_seed(0)
    lines = [f"w{i} " + " ".join(f"{v:.4f}" for v in torch.randn(8, generator=generator).tolist())
             for i in range(30)]
    path.write_text("30 8\n" + "\n".join(lines) + "\n")
    return str(path)


def signature(arch, option, value, embeddings):
    """What a model built with ``option=value`` is: its parameter shapes, which of them are
    shared, and its training-mode output on a fixed batch under a fixed seed."""
    overrides = dict(TINY, **CONTEXT.get(option, {}))
    if value is not None:
        overrides[option] = embeddings if value == "EMBEDDINGS" else value
    if option in ("encoder_embed_path", "decoder_embed_path"):
        overrides.update(encoder_embed_dim=8, decoder_embed_dim=8, encoder_attention_heads=1,
                         decoder_attention_heads=1, decoder_output_dim=8)
    torch.manual_seed(0)
    model, task = build(arch, task=ToyTask(), **overrides)
    shapes = tuple((name, tuple(p.shape)) for name, p in model.state_dict(keep_vars=True).items())
    owners = {}
    shared = tuple(owners.setdefault(id(p), name) for name, p in model.state_dict(keep_vars=True).items())
    words = len(task.source_dictionary)
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, words, (2, 5), generator=generator)
    prev = torch.randint(4, words, (2, 4), generator=generator)
    model.train()
    torch.manual_seed(2)
    out = model(src, torch.tensor([5, 5]), prev)[0]
    return shapes, shared, out.detach()


def differs(first, second):
    return first[:2] != second[:2] or first[2].shape != second[2].shape or not torch.equal(first[2], second[2])


@pytest.mark.parametrize("option", sorted(INHERITED))
def test_an_inherited_option_changes_sret_as_it_changes_fairseq(option, embeddings):
    first, second = INHERITED[option]
    fairseq_differs = differs(*(signature("transformer", option, v, embeddings) for v in (first, second)))
    sret_differs = differs(*(signature("sret_transformer", option, v, embeddings) for v in (first, second)))
    assert sret_differs == fairseq_differs


@pytest.mark.parametrize("option", sorted(REFUSED))
def test_an_unsupported_option_is_refused_by_name(option, embeddings):
    signature("sret_transformer", option, REFUSED[option][0], embeddings)  # the default builds
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ValueError, match=flag):
        signature("sret_transformer", option, REFUSED[option][1], embeddings)
