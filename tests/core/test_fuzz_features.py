"""Property fuzzing of the features built on the core: depth on demand, mixed-depth training,
uptraining, LRC folding and the fused residual + LRC + LayerNorm path.

Each property is checked against its definition on random configurations:

- depth: a translation model trained with N recursions, run at every depth d <= N, gives
  the same output as a model built with d recursions carrying its weights, and beam-search
  style incremental decoding at depth d equals the teacher-forced forward at depth d;
- mixed depth: the criterion's gradient is the weighted sum of the per-depth losses' gradients;
- uptraining with one recursion reproduces the transformer (pre/post-LN, every embedding
  sharing, any layer count); recursions that do not divide the layers fail naming the option;
- ``fold_lrc``: folded and unfolded models agree (translation and vision);
- ``lrc_add_norm`` (residual + LRC + LayerNorm in one call) equals its PyTorch definition,
  forward and backward, for random shapes, strides, dtypes and scalars.
"""

import pytest
import torch

pytest.importorskip("fairseq")

from hypothesis import given
from hypothesis import strategies as st

from fairseq_sret.core import fold_lrc
from nmt_helpers import SMALL, DummyTask, build
from test_depth import truncated
from test_fold import randomize_lrc, rel_err
from test_fuzz_core import fuzz

pytestmark = pytest.mark.fuzz

TASK = DummyTask(vocab_size=20)
NARROW = dict(SMALL, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=24, decoder_ffn_embed_dim=24,
              encoder_attention_heads=2, decoder_attention_heads=2)


def groups_for(draw, recursions):
    return ",".join(str(draw(st.sampled_from([1, 2, 4]))) for _ in range(recursions))


@st.composite
def schedules(draw):
    """A translation model's SReT options (trained recursions 1-3 per side)."""
    enc, dec = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    return dict(
        encoder_recursions=enc, decoder_recursions=dec,
        encoder_groups=groups_for(draw, enc), decoder_groups=groups_for(draw, dec),
        encoder_partition=",".join(draw(st.sampled_from(["contiguous", "strided", "random"])) for _ in range(enc)),
        decoder_partition=",".join(draw(st.sampled_from(["strided", "random"])) for _ in range(dec)),
        nll_ratio=draw(st.sampled_from([0.0, 0.5])), no_lrc=draw(st.booleans()), post_ln=draw(st.booleans()),
        encoder_layers=draw(st.integers(1, 2)), decoder_layers=draw(st.integers(1, 2)),
    )


def batch(seed, batch_size=2, src_len=7, tgt_len=5):
    d = TASK.source_dictionary
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(d.nspecial, len(d), (batch_size, src_len), generator=g)
    src[0, : src_len // 3] = d.pad()  # left padding
    src[:, -1] = d.eos()
    prev = torch.randint(d.nspecial, len(d), (batch_size, tgt_len), generator=g)
    prev[:, 0] = d.eos()
    return src, src.ne(d.pad()).sum(1), prev


def per_recursion(value: str, depth: int) -> str:
    return ",".join(value.split(",")[:depth])


@fuzz(12)
@given(cfg=schedules(), seed=st.integers(0, 2**16))
def test_every_depth_equals_a_model_built_with_that_many_recursions(cfg, seed):
    torch.manual_seed(seed)
    deep, _ = build("sret_transformer", TASK, **dict(NARROW, **cfg))
    randomize_lrc(deep, seed=seed)
    deep.eval()
    src, lengths, prev = batch(seed)
    for enc in range(1, cfg["encoder_recursions"] + 1):
        for dec in range(1, cfg["decoder_recursions"] + 1):
            shallow_cfg = dict(cfg, encoder_recursions=enc, decoder_recursions=dec,
                               **{f"{side}_{key}": per_recursion(cfg[f"{side}_{key}"], d)
                                  for side, d in (("encoder", enc), ("decoder", dec))
                                  for key in ("groups", "partition")})
            shallow, _ = build("sret_transformer", TASK, **dict(NARROW, **shallow_cfg))
            sd = deep.state_dict()
            shallow.load_state_dict({**{k: v for k, v in truncated(sd, enc).items() if not k.startswith("decoder.")},
                                     **{k: v for k, v in truncated(sd, dec).items() if k.startswith("decoder.")}})
            shallow.eval()
            with torch.no_grad():
                expected = shallow(src, lengths, prev)[0]
                with deep.at_depth(enc, dec):
                    full = deep(src, lengths, prev)[0]
                    encoder_out = deep.encoder(src, src_lengths=lengths)
                    state, steps = {}, []
                    for t in range(prev.size(1)):
                        steps.append(deep.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0])
            assert (full - expected).abs().max() <= 1e-4, (enc, dec)
            assert (torch.cat(steps, dim=1) - full).abs().max() <= 1e-4, (enc, dec)


@fuzz(8)
@given(cfg=schedules(), seed=st.integers(0, 2**16), weights=st.lists(st.sampled_from([0.25, 0.5, 1.0]), min_size=3,
                                                                     max_size=3))
def test_mixed_depth_gradient_is_the_weighted_sum_of_the_depths_gradients(cfg, seed, weights):
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    from fairseq_sret.criterions.mixed_depth import MixedDepthLabelSmoothedCrossEntropy

    full_depth = (cfg["encoder_recursions"], cfg["decoder_recursions"])
    depths = sorted({(e, d) for e in range(1, full_depth[0] + 1) for d in range(1, full_depth[1] + 1)} - {full_depth})
    if not depths:
        return  # one recursion per side: nothing shallower to mix in
    terms = [(depth, w) for depth, w in zip(depths[-3:], weights)]
    # deterministic training forward: no dropout, no random partition
    cfg = dict(cfg, encoder_partition=cfg["encoder_partition"].replace("random", "strided"),
               decoder_partition=cfg["decoder_partition"].replace("random", "strided"))
    torch.manual_seed(seed)
    model, _ = build("sret_transformer", TASK, **dict(NARROW, **cfg))
    randomize_lrc(model, seed=seed)
    model.train()
    src, lengths, prev = batch(seed)
    target = torch.roll(prev, -1, dims=1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
              "target": target, "ntokens": target.numel(), "nsentences": target.size(0)}
    plain = LabelSmoothedCrossEntropyCriterion(TASK, sentence_avg=False, label_smoothing=0.1)

    def grads(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}

    expected = grads(plain(model, sample)[0])
    for depth, w in terms:
        with model.at_depth(*depth):
            for name, g in grads(plain(model, sample)[0]).items():
                expected[name] += w * g
    option = ",".join(f"{e}/{d}:{w}" for (e, d), w in terms)
    mixed = MixedDepthLabelSmoothedCrossEntropy(TASK, sentence_avg=False, label_smoothing=0.1, mixed_depth=option)
    got = grads(mixed(model, sample)[0])
    for name in got:
        assert torch.allclose(got[name], expected[name], atol=1e-5, rtol=1e-4), (name, option)
    assert model.depth == full_depth


@fuzz(10)
@given(normalize_before=st.tuples(st.booleans(), st.booleans()), share=st.sampled_from(["none", "decoder", "all"]),
       layers=st.tuples(st.integers(1, 4), st.integers(1, 4)), recursions=st.integers(1, 3),
       additions=st.booleans(), seed=st.integers(0, 2**16))
def test_uptraining_with_one_recursion_is_the_transformer(normalize_before, share, layers, recursions, additions,
                                                         seed):
    from fairseq_sret.conversion.uptraining import uptrain_checkpoint
    from test_uptrain import build_converted, transformer_checkpoint

    if normalize_before[0] != normalize_before[1]:
        normalize_before = (normalize_before[0],) * 2  # mixed placements convert, but only as YAML configs
    torch.manual_seed(seed)
    ref, task, state = transformer_checkpoint(
        encoder_layers=layers[0], decoder_layers=layers[1], encoder_normalize_before=normalize_before[0],
        decoder_normalize_before=normalize_before[1], share_decoder_input_output_embed=share == "decoder",
        share_all_embeddings=share == "all")
    if any(n % recursions for n in layers):
        side = "encoder" if layers[0] % recursions else "decoder"
        with pytest.raises(ValueError, match=f"--{side}-layers"):
            uptrain_checkpoint(state, encoder_recursions=recursions, decoder_recursions=recursions)
        return
    converted, _ = uptrain_checkpoint(state, encoder_recursions=1, decoder_recursions=1,
                                      nll_ratio=0.5 if additions else 0.0, lrc=additions)
    ours = build_converted(converted, task)
    ours.load_state_dict(converted["model"], strict=True)
    ref.eval(), ours.eval()
    src, lengths, prev = batch(seed)
    src = src.clamp(max=len(task.source_dictionary) - 1)
    with torch.no_grad():
        assert (ours(src, lengths, prev)[0] - ref(src, lengths, prev)[0]).abs().max() <= 1e-5


@fuzz(10)
@given(cfg=schedules(), seed=st.integers(0, 2**16), train=st.booleans())
def test_folded_translation_model_computes_the_model(cfg, seed, train):
    torch.manual_seed(seed)
    model, _ = build("sret_transformer", TASK, **dict(NARROW, **cfg))
    model = model.double()
    randomize_lrc(model, seed=seed)
    folded = fold_lrc(model)
    src, lengths, prev = batch(seed)
    model.train(train), folded.train(train)  # dropout is 0; random partitions draw the same with one seed
    with torch.no_grad():
        torch.manual_seed(seed)
        expected = model(src, lengths, prev)[0]
        torch.manual_seed(seed)
        got = folded(src, lengths, prev)[0]
    assert rel_err(expected, got) < 1e-9


@fuzz(6)
@given(stage_blocks=st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 2)),
       groups=st.sampled_from([((1, 1), (1, 1), (1, 1)), ((4, 1), (2, 1), (1, 1)), ((2, 2), (1, 1), (1, 1))]),
       seed=st.integers(0, 2**16), train=st.booleans())
def test_folded_vision_model_computes_the_model(stage_blocks, groups, seed, train):
    from fairseq_sret.vision import SReT

    torch.manual_seed(seed)
    model = SReT(img_size=32, num_classes=5, embed_dims=(16, 32, 64), num_heads=(2, 2, 4), blocks=stage_blocks,
                 groups=groups).double()
    randomize_lrc(model, seed=seed)
    folded = fold_lrc(model)
    model.train(train), folded.train(train)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.manual_seed(seed)
        expected = model(x)
        torch.manual_seed(seed)
        got = folded(x)
    assert rel_err(expected, got) < 1e-9


TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@st.composite
def residual_inputs(draw):
    """x, y of a random shape and layout (contiguous, a strided slice, transposed), a dtype,
    and the two LRC scales, each a tensor, a Python number or absent."""
    dtype = draw(st.sampled_from(list(TOLERANCE)))
    # The LayerNorm gradient of a handful of bf16/fp16 values is dominated by the rounding
    # of the residual it normalises (1/std of two nearly equal numbers): below 16 features
    # only fp32 has a gradient to compare against the definition.
    rows, width = draw(st.integers(1, 40)), draw(st.integers(1 if dtype == torch.float32 else 16, 96))
    lead = draw(st.sampled_from([(), (2,), (3, 2)]))
    layout = draw(st.sampled_from(["contiguous", "sliced", "transposed"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))

    def tensor():
        if layout == "sliced":  # every other row of a larger buffer: a row stride of 2 * width
            t = torch.randn(*lead, rows * 2, width, generator=g)[..., ::2, :]
        elif layout == "transposed":  # rows and columns swapped in memory
            t = torch.randn(*lead, width, rows, generator=g).transpose(-1, -2)
        else:
            t = torch.randn(*lead, rows, width, generator=g)
        return t.to(dtype).requires_grad_()

    def scale():
        kind = draw(st.sampled_from(["tensor", "number", None]))
        value = draw(st.floats(-2.0, 2.0, allow_nan=False).filter(lambda v: abs(v) > 1e-3))
        return torch.tensor([value], dtype=dtype, requires_grad=True) if kind == "tensor" else (
            value if kind == "number" else None)

    return tensor(), tensor(), scale(), scale(), dtype


@fuzz(40)
@given(inputs=residual_inputs(), eps=st.sampled_from([1e-5, 1e-6]), affine=st.booleans())
def test_fused_residual_lrc_layernorm_is_its_definition(inputs, eps, affine):
    """The path the models take (PyTorch on the CPU, the Triton kernel where active) against
    the definition computed in float64, forward and backward, within the dtype's rounding."""
    from torch import nn

    from fairseq_sret.core.fused import lrc_add_norm, lrc_add_norm_ref

    x, y, skip, branch, dtype = inputs
    width = x.shape[-1]
    norm = nn.LayerNorm(width, eps=eps, elementwise_affine=affine).to(dtype)
    if affine:  # drawn from the example itself, so that a failure reproduces
        params = torch.Generator().manual_seed(x.numel() * 97 + width)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(width, generator=params))
            norm.bias.copy_(torch.randn(width, generator=params))
    res, normed = lrc_add_norm(x, y, skip, branch, norm)
    assert res.shape == normed.shape == x.shape and res.dtype == normed.dtype == dtype

    def wide(t):
        return t.detach().double().requires_grad_() if isinstance(t, torch.Tensor) else t

    ref_in = [wide(t) for t in (x, y, skip, branch)]
    ref_w = (wide(norm.weight), wide(norm.bias)) if affine else (None, None)
    ref_res, ref_normed = lrc_add_norm_ref(*ref_in, *ref_w, eps)
    tol = TOLERANCE[dtype]
    scale = 1.0 + ref_res.abs().max().item()
    torch.testing.assert_close(res.double(), ref_res, rtol=tol, atol=tol * scale)
    torch.testing.assert_close(normed.double(), ref_normed, rtol=tol, atol=tol * 8)

    g = torch.Generator().manual_seed(1)
    grad_res, grad_normed = torch.randn(res.shape, generator=g), torch.randn(res.shape, generator=g)
    leaves = [t for t in (x, y, skip, branch) + ((norm.weight, norm.bias) if affine else ()) if isinstance(t, torch.Tensor)]
    ref_leaves = [t for t in ref_in + list(ref_w) if isinstance(t, torch.Tensor)]
    got = torch.autograd.grad((res, normed), leaves, (grad_res.to(dtype), grad_normed.to(dtype)))
    want = torch.autograd.grad((ref_res, ref_normed), ref_leaves, (grad_res.double(), grad_normed.double()))
    # The normalisation's gradient, rstd * w * (g - mean(g) - x_hat * mean(g * x_hat)), is a
    # difference of near-equal terms and x_hat = (res - mean) * rstd is one: its rounding is
    # the unit roundoff times rstd * |w| * |g| * (1 + rstd * |res|) per row, large where a
    # row is (nearly) constant and rstd approaches 1 / sqrt(eps).
    rows = ref_res.detach()
    rstd = (rows.var(-1, unbiased=False, keepdim=True) + eps).rsqrt()
    w_max = norm.weight.detach().abs().max().item() if affine else 1.0
    g_max = grad_normed.abs().max().item()
    per_row = 8 * torch.finfo(dtype).eps * rstd * w_max * g_max * (1 + rstd * rows.abs().amax(-1, keepdim=True))
    for a, b in zip(got, want):
        assert a.shape == b.shape
        if a.numel() == x.numel():
            bound = tol * 4 * b.abs() + tol * 8 * (1 + b.abs().max().item()) + per_row
        else:  # the scales' and norm parameters' gradients sum over every element
            size = float(x.numel()) ** 0.5
            bound = tol * 4 * b.abs() + size * (tol * 8 * (1 + b.abs().max().item()) + per_row.max())
        excess = (a.double() - b).abs() - bound
        assert excess.max().item() <= 0, (f"gradient off by {(a.double() - b).abs().max().item():.3g}"
                                          f" (bound exceeded by {excess.max().item():.3g})")


@pytest.mark.slow
@fuzz(2)
@given(img_size=st.sampled_from([32, 48, 64, 96]), stage_groups=st.sampled_from([((1, 1), (1, 1), (1, 1)),
                                                                                 ((4, 1), (2, 1), (1, 1)),
                                                                                 ((3, 2), (1, 1), (1, 1))]),
       recursions=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_onnx_export_of_random_vision_configurations(img_size, stage_groups, recursions, seed, tmp_path_factory):
    """Exported random SReTs match ONNX Runtime within the stated 1e-4; a size that is not a
    multiple of 32 is refused when the model is built, naming it."""
    from test_export_onnx import MISSING, randomised

    from fairseq_sret.vision import check_onnx, export_onnx

    if MISSING:
        pytest.skip(f"ONNX export needs {', '.join(MISSING)}")
    kwargs = dict(blocks=(1, 1, 1), img_size=img_size, num_classes=7, recursions=recursions,
                  groups=tuple(g[:recursions] for g in stage_groups), partition=("contiguous", "random")[:recursions])
    if img_size % 32:
        with pytest.raises(ValueError, match="img_size"):
            randomised("sret_t", **kwargs)
        return
    torch.manual_seed(seed)
    model = randomised("sret_t", **kwargs)
    path = export_onnx(model, tmp_path_factory.mktemp("onnx") / "model.onnx", dynamic_batch=False, batch_size=2)
    images = torch.randn(2, 3, img_size, img_size, generator=torch.Generator().manual_seed(seed))
    assert check_onnx(model, path, images) <= 1e-4
