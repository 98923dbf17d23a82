"""torch.compile(fullgraph=True) traces every model kind without a graph break.

``fullgraph=True`` turns any graph break into an error. The backends are torch's tracing-only
ones ("eager": Dynamo's graph capture; "aot_eager": also AOTAutograd's forward/backward
tracing), so the checks take seconds on a CPU instead of Inductor's code generation; the
outputs are compared with the uncompiled module. fairseq's own ``TransformerEncoder.forward``
has a data-dependent branch (``if has_pads``) and is not compiled here; our layers inside it are.
"""

import importlib.util

import pytest
import torch

from fairseq_sret.core import NonLinearProjection, Recursive, SReTBlock, fast_paths, fold_lrc
from fairseq_sret.vision import create_model

HAVE_FAIRSEQ = importlib.util.find_spec("fairseq") is not None


def compiles_fullgraph(module, *inputs, backend="aot_eager", train=True, **kwargs):
    """Compile ``module`` with fullgraph=True in eval (and train) mode; outputs must match."""
    for mode in ("eval", "train") if train else ("eval",):
        getattr(module, mode)()
        torch._dynamo.reset()
        compiled = torch.compile(module, fullgraph=True, backend=backend)
        if mode == "eval":
            with torch.no_grad():
                torch.testing.assert_close(compiled(*inputs, **kwargs), module(*inputs, **kwargs))
        else:
            out = compiled(*inputs, **kwargs)
            out.float().square().mean().backward()
            assert all(p.grad is not None for p in module.parameters() if p.requires_grad)
            module.zero_grad()
    torch._dynamo.reset()


def _stack():
    torch.manual_seed(0)
    block = SReTBlock(16, 2, 24, groups=(2, 1), partition=("contiguous", "random"), drop_path=0.1, dropout=0.1)
    return Recursive(block, 2, make_nll=lambda i: NonLinearProjection(16, 0.5))


def test_compile_core_recursive_block():
    compiles_fullgraph(_stack(), torch.randn(2, 12, 16))


@pytest.mark.slow
@pytest.mark.parametrize("one_kernel", [None, 0])  # masked single kernel / packed groups with a partition
def test_compile_core_recursive_block_padded(one_kernel):
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, -3:] = True
    with fast_paths(grouped_one_kernel=one_kernel):
        compiles_fullgraph(_stack(), torch.randn(2, 12, 16), key_padding_mask=mask)


@pytest.mark.slow
def test_compile_sret_t():
    torch.manual_seed(0)
    model = create_model("sret_t", img_size=64, num_classes=10)
    x = torch.randn(2, 3, 64, 64)
    compiles_fullgraph(model, x, backend="eager")
    compiles_fullgraph(fold_lrc(model), x, backend="eager", train=False)


@pytest.mark.slow
def test_compile_recursive_mixer():
    torch.manual_seed(0)
    model = create_model(
        "recursive_mixer_b16", img_size=32, embed_dim=32, depth=2, token_mlp_dim=16, channel_mlp_dim=64,
        num_classes=10,
    )
    compiles_fullgraph(model, torch.randn(2, 3, 32, 32))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
def test_compile_nmt_encoder_layer():
    from fairseq_sret_cli.toy import build_model

    torch.manual_seed(0)
    model = build_model(
        "sret_transformer_tiny", encoder_embed_dim=32, decoder_embed_dim=32, encoder_ffn_embed_dim=48,
        decoder_ffn_embed_dim=48, encoder_attention_heads=4, decoder_attention_heads=4, encoder_layers=2,
        decoder_layers=2, dropout=0.1, encoder_groups="2,1",
    )
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, -3:] = True
    compiles_fullgraph(model.encoder.layers[0], torch.randn(10, 2, 32), mask)


def test_a_depth_the_compiled_model_ran_before_compiles_nothing_new():
    """``set_depth`` keeps the layers' schedule objects shared as they were built, so
    torch.compile's guards on them hold again when the model returns to a depth."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = create_model("sret_t", img_size=32, num_classes=10).eval()
    x = torch.randn(1, 3, 32, 32)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    graphs = []
    with torch.no_grad():
        for depth in ("as built", 1, None, 1):
            if depth != "as built":
                model.set_depth(depth)
            counters.clear()
            torch.testing.assert_close(compiled(x), model(x))
            graphs.append(counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    assert graphs == [1, 1, 0, 0]


def test_compile_shared_layers_reuses_its_graphs_at_every_depth():
    """Regional compilation: each shared layer's applications compile once, outputs equal
    eager mode, and a depth switch compiles nothing new."""
    from torch._dynamo.utils import counters

    from fairseq_sret.core import compile_shared_layers

    torch.manual_seed(0)
    model = create_model("sret_t", img_size=32, num_classes=10).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = {depth: model.set_depth(depth) or model(x) for depth in (1, None)}
    torch._dynamo.reset()
    compile_shared_layers(model, backend="eager")
    graphs = []
    with torch.no_grad():
        for depth in (None, 1, None):
            model.set_depth(depth)
            counters.clear()
            torch.testing.assert_close(model(x), expected[depth])
            graphs.append(counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    applications = sum(len(stage.schedule) for stage in model.modules() if isinstance(stage, Recursive))
    assert 0 < graphs[0] <= applications and graphs[1:] == [0, 0]
    with pytest.raises(ValueError, match="no recursive layers"):
        compile_shared_layers(torch.nn.Linear(2, 2))


def test_compiled_eval_graphs_do_not_depend_on_the_drop_path_rates():
    """Stochastic depth gives every block its own rate; in eval mode the blocks of a shared
    layer's applications must still share graphs (Dynamo guards on no rate)."""
    from torch._dynamo.utils import counters

    from fairseq_sret.core import compile_shared_layers

    x = torch.randn(1, 3, 32, 32)
    graphs = {}
    for rate in (0.0, 0.1):
        torch.manual_seed(0)
        model = create_model("sret_t", img_size=32, num_classes=10, drop_path_rate=rate).eval()
        with torch.no_grad():
            expected = model(x)
        torch._dynamo.reset()
        compile_shared_layers(model, backend="eager")
        counters.clear()
        with torch.no_grad():
            torch.testing.assert_close(model(x), expected)
        graphs[rate] = counters["stats"]["unique_graphs"]
        torch._dynamo.reset()
    assert graphs[0.1] == graphs[0.0] > 0


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
def test_compiled_shared_decoder_layers_beam_search_as_eager():
    """Incremental decoding through compiled shared layers: fairseq's beam search finds the
    eager model's hypotheses, and another batch size compiles no new graph (dynamic shapes)."""
    from fairseq.sequence_generator import SequenceGenerator
    from torch._dynamo.utils import counters

    from fairseq_sret.core import compile_shared_layers
    from fairseq_sret_cli.toy import ToyTask, build_model

    torch.manual_seed(0)
    task = ToyTask.of_dictionary_size(40)
    model = build_model(
        "sret_transformer_tiny", task=task, encoder_embed_dim=32, decoder_embed_dim=32, encoder_ffn_embed_dim=48,
        decoder_ffn_embed_dim=48, encoder_attention_heads=4, decoder_attention_heads=4,
    ).eval()
    d = task.source_dictionary
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=6)

    def translate(sentences):
        src = torch.randint(d.nspecial, len(d), (sentences, 7), generator=torch.Generator().manual_seed(sentences))
        src[:, -1] = d.eos()
        sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((sentences,), 7)}}
        with torch.no_grad():
            return [[h["tokens"].tolist() for h in hyps] for hyps in generator.forward(sample)]

    expected = {n: translate(n) for n in (2, 3)}
    torch._dynamo.reset()
    compile_shared_layers(model.decoder, backend="eager", dynamic=True)
    counters.clear()
    assert translate(2) == expected[2]
    assert counters["stats"]["unique_graphs"] > 0
    counters.clear()
    assert translate(3) == expected[3]
    torch._dynamo.reset()
    assert counters["stats"]["unique_graphs"] == 0
