"""SReT translation models as CTranslate2 Transformer specifications (``sret-export-ct2``).

CTranslate2's Transformer runs every layer once, and each of its layers has one
self-attention sub-block (and one encoder attention in the decoder) and one feed-forward
sub-block, each ``x + f(LN(x))`` (pre-LN) or ``LN(x + f(x))`` (post-LN). A side of an
``sret_transformer`` becomes such a side unrolled:

- every application of a shared layer that runs (at the model's depth) is one CTranslate2
  layer with that layer's weights; CTranslate2 stores equal tensors once, so applications
  whose weights stay equal after the LRC fold below cost no file size;
- every NLL (paper Eq. 5/8, ``theta * z + zeta * MLP(LN(z))``) is one more layer: its
  feed-forward sub-block is the NLL, its attention sub-blocks have zero projections and add
  exactly nothing (``x + 0``), at the run-time cost of those attentions;
- the LRC coefficients (paper Eq. 7-8) fold into the weights as
  :func:`fairseq_sret.core.fold_lrc` folds them, except that a CTranslate2 residual is
  always ``x + f``: no layer can carry the skip factor that ``fold_lrc`` keeps. The stream
  is stored divided by ``c``, the product of the skip scales so far: the branch's last linear
  gets ``b / c'`` (``c' = s * c``), and every LayerNorm reading the stream gets
  ``sign(c) * weight`` and ``eps / c^2`` (``LN_eps(c * u) = sign(c) * normalize_{eps/c^2}(u)
  * w + bias``). Post-LN: ``LN(s * x + b * f) = LN'(x + (b / s) * f)``, ``LN'`` with
  ``eps / s^2`` and ``sign(s) * w``.

What cannot be carried: CTranslate2 holds **one** LayerNorm epsilon per model
(``config.layer_norm_epsilon``), where the fold asks for ``eps / c^2`` per LayerNorm. The
export takes the geometric middle of the epsilons asked for; where every ``|c|`` is 1
(no LRC, or skip scales of +-1) that is every one of them and the unrolled model computes
exactly SReT's function; otherwise each LayerNorm's epsilon is off by up to the factor
:attr:`CT2Spec.epsilon_spread` ** 0.5, which changes its output by about
``|eps_used - eps_asked| / (2 var)`` relative (``var`` the variance it normalises) and is
recorded, not hidden. Refused, with one line naming it: sliced group attention with more
than one group (CTranslate2's attention attends over the whole sequence), an attention layer
other than the default (``--attention-layer``), an NLL in a
post-LN model (CTranslate2's post-LN layers normalise after the residual, the NLL before),
a skip scale of 0, activations CTranslate2 lacks or two activations on one side, sides
without token positions.

The model is read from its modules (fairseq's encoder and decoder, whose layers hold a
:class:`~fairseq_sret.core.Recursive`); nothing here imports fairseq, and ctranslate2 only
when a spec is built.
"""

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from ..core.attention import DEFAULT_ATTENTION_LAYER, attention_layer
from ..core.residual import FoldedResidual, LearnableResidual

#: our activation names -> CTranslate2's ``common_spec.Activation`` member names
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_accurate": "GELUTanh", "tanh": "Tanh", "silu": "SWISH"}


class CT2ExportError(ValueError):
    """A model CTranslate2 cannot run as SReT computes it; the message names what."""


@dataclass
class CT2Spec:
    """A built CTranslate2 ``TransformerSpec`` and what the export had to choose.

    ``epsilons``: the LayerNorm epsilon each LayerNorm of the unrolled model asks for;
    ``layer_norm_epsilon``: the one CTranslate2 uses; ``layers``: CTranslate2 layers per side
    (applications + NLLs); ``applications``: applications of shared layers per side."""

    spec: object
    layer_norm_epsilon: float
    epsilons: List[float] = field(default_factory=list)
    layers: Tuple[int, int] = (0, 0)
    applications: Tuple[int, int] = (0, 0)

    @property
    def epsilon_spread(self) -> float:
        """largest / smallest epsilon asked for (1.0: CTranslate2's one epsilon is every one of them)."""
        return max(self.epsilons) / min(self.epsilons) if self.epsilons else 1.0


def _array(tensor: torch.Tensor, factor: float = 1.0) -> np.ndarray:
    """fp32 numpy copy of ``tensor * factor`` (the product taken in float64)."""
    value = tensor.detach().to(torch.float64)
    if factor != 1.0:
        value = value * factor
    return value.to(torch.float32).numpy().copy()


def _scales(residual: nn.Module) -> Tuple[float, float]:
    """(skip scale, branch scale) of a residual: LRC, folded or plain."""
    if isinstance(residual, LearnableResidual) and residual.learnable:
        return float(residual.skip_scale.detach()), float(residual.branch_scale.detach())
    if isinstance(residual, FoldedResidual):
        return residual.skip_factor, 1.0
    return 1.0, 1.0


class _SideWriter:
    """Fills one CTranslate2 side (encoder or decoder) from one fairseq side, tracking the
    scale ``c`` of the stored stream (see the module docstring)."""

    def __init__(self, name: str, module: nn.Module, pre_norm: bool):
        self.name, self.module, self.pre_norm = name, module, pre_norm
        self.scale = 1.0
        self.epsilons: List[float] = []
        self.activation: Optional[str] = None

    # ------------------------------------------------------------ pieces
    def layer_norm(self, spec, norm: nn.LayerNorm, stream_scale: float) -> None:
        """``norm`` reading the stream stored at ``stream_scale``."""
        if norm.weight is None or norm.bias is None:
            raise CT2ExportError(f"{self.name}: a LayerNorm without weight or bias (CTranslate2's has both)")
        spec.gamma = _array(norm.weight, math.copysign(1.0, stream_scale))
        spec.beta = _array(norm.bias)
        self.epsilons.append(norm.eps / (stream_scale * stream_scale))

    def use_activation(self, name: str, where: str) -> None:
        if name not in ACTIVATIONS:
            raise CT2ExportError(f"{where}: activation {name!r} has no CTranslate2 equivalent"
                                 f" (it has {', '.join(ACTIVATIONS)})")
        if self.activation is not None and name != self.activation:
            raise CT2ExportError(f"{where}: activation {name!r} beside {self.activation!r} on the {self.name}"
                                 " (CTranslate2 has one activation per side)")
        self.activation = name

    @staticmethod
    def linear(spec, linear: nn.Linear, factor: float = 1.0, rows: Optional[slice] = None) -> None:
        weight = linear.weight if rows is None else linear.weight[rows]
        spec.weight = _array(weight, factor)
        if linear.bias is not None:
            spec.bias = _array(linear.bias if rows is None else linear.bias[rows], factor)

    @staticmethod
    def zero_linear(spec, rows: int, columns: int) -> None:
        spec.weight = np.zeros((rows, columns), dtype=np.float32)

    def sublayer(self, norm_spec, norm: nn.LayerNorm, residual: nn.Module, set_branch, where: str) -> None:
        """One residual sub-layer: its LayerNorm (read at the current scale) and its branch,
        whose last linear ``set_branch(factor)`` writes scaled by ``factor``."""
        skip, branch = _scales(residual)
        if skip == 0.0:
            raise CT2ExportError(f"{where}: a skip scale of 0 (CTranslate2's residual always adds the stream)")
        if self.pre_norm:
            self.layer_norm(norm_spec, norm, self.scale)
            self.scale *= skip
            set_branch(branch / self.scale)
        else:  # LN(s x + b f) = LN'(x + (b/s) f), LN' reading the sum at scale s
            self.layer_norm(norm_spec, norm, skip)
            set_branch(branch / skip)

    # ------------------------------------------------------------ layers
    def attention(self, spec, attention: nn.Module, norm: nn.LayerNorm, residual: nn.Module, cross: bool,
                  where: str) -> None:
        dim = attention.embed_dim
        if cross:
            self.linear(spec.linear[0], attention.qkv, rows=slice(0, dim))
            self.linear(spec.linear[1], attention.qkv, rows=slice(dim, 3 * dim))
        else:
            self.linear(spec.linear[0], attention.qkv)
        self.sublayer(spec.layer_norm, norm, residual,
                      lambda factor: self.linear(spec.linear[-1], attention.out_proj, factor), where)

    def silent_attention(self, spec, dim: int, cross: bool) -> None:
        """An attention sub-block that adds exactly 0: zero projections (CTranslate2 stores the
        zero tensors of one shape once); its LayerNorm reads the stream and is never seen."""
        if cross:
            self.zero_linear(spec.linear[0], dim, dim)
            self.zero_linear(spec.linear[1], 2 * dim, dim)
        else:
            self.zero_linear(spec.linear[0], 3 * dim, dim)
        self.zero_linear(spec.linear[-1], dim, dim)
        spec.layer_norm.gamma = np.ones(dim, dtype=np.float32)
        spec.layer_norm.beta = np.zeros(dim, dtype=np.float32)

    def feed_forward(self, spec, mlp: nn.Module, norm: nn.LayerNorm, residual: nn.Module, where: str) -> None:
        self.use_activation(mlp.activation, where)
        self.linear(spec.linear_0, mlp.fc1)
        self.sublayer(spec.layer_norm, norm, residual, lambda factor: self.linear(spec.linear_1, mlp.fc2, factor),
                      where)

    def application(self, spec, block: nn.Module, where: str) -> None:
        """One application of a shared :class:`~fairseq_sret.core.SReTBlock`."""
        if bool(block.normalize_before) != self.pre_norm:
            raise CT2ExportError(f"{where}: a {'pre' if block.normalize_before else 'post'}-LN layer in a"
                                 f" {'pre' if self.pre_norm else 'post'}-LN {self.name}")
        self.attention(spec.self_attention, block.self_attn, block.self_attn_norm, block.self_attn_residual,
                       False, where)
        if block.cross_attn is not None:
            self.attention(spec.attention, block.cross_attn, block.cross_attn_norm, block.cross_attn_residual,
                           True, where)
        self.feed_forward(spec.ffn, block.ffn, block.ffn_norm, block.ffn_residual, where)

    def nll(self, spec, nll: nn.Module, dim: int, cross: bool, where: str) -> None:
        """An NLL as a layer whose attention adds nothing."""
        if not self.pre_norm:
            raise CT2ExportError(f"{where}: an NLL in a post-LN model (CTranslate2's post-LN layers normalise after"
                                 " the residual, the NLL before); export a pre-LN model or one without NLL")
        self.silent_attention(spec.self_attention, dim, cross=False)
        if cross:
            self.silent_attention(spec.attention, dim, cross=True)
        self.feed_forward(spec.ffn, nll.mlp, nll.norm, nll.residual, where)


def _unrolled(side_name: str, module: nn.Module) -> List[Tuple[str, nn.Module, str]]:
    """("application" | "nll", module, where) in the order they run, at the model's depth."""
    out = []
    for i, layer in enumerate(module.layers):
        recursive = getattr(layer, "recursive", None)
        if recursive is None:
            raise CT2ExportError(f"{side_name} layer {i}: not an SReT layer ({type(layer).__name__})")
        attention = type(recursive.layer.self_attn)
        if attention is not attention_layer(DEFAULT_ATTENTION_LAYER):
            raise CT2ExportError(f"{side_name} layer {i}: its attention layer is {attention.__name__}; CTranslate2 computes"
                                 f" the {DEFAULT_ATTENTION_LAYER} attention only (--attention-layer {DEFAULT_ATTENTION_LAYER})")
        for step in recursive.schedule.running():
            where = f"{side_name} layer {i}, application {step.index + 1}"
            if step.groups > 1:
                raise CT2ExportError(
                    f"{where}: sliced group attention with {step.groups} groups (CTranslate2's attention attends over"
                    " the whole sequence); export a model, or a depth, whose applications that run have 1 group")
            out.append(("application", recursive.layer, where))
            if recursive.nlls is not None and step.nll is not None:
                out.append(("nll", recursive.nlls[step.nll], f"{where}'s NLL"))
    return out


def _pre_norm(side_name: str, units) -> bool:
    blocks = [m for kind, m, _ in units if kind == "application"]
    if not blocks:
        raise CT2ExportError(f"{side_name}: no layer runs")
    return bool(blocks[0].normalize_before)


def _input_layers(spec, module: nn.Module, side_name: str) -> None:
    """Embeddings, their scale and the positions, as CTranslate2's fairseq converter sets them."""
    positions = getattr(module, "embed_positions", None)
    if positions is None:
        raise CT2ExportError(f"{side_name}: no token positions (--no-token-positional-embeddings); CTranslate2's"
                             " fairseq-style Transformer adds positions")
    table = positions.weight if isinstance(positions, nn.Embedding) else positions.weights
    spec.position_encodings.encodings = _array(table[positions.padding_idx + 1:])
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(module.embed_tokens.weight)
    spec.scale_embeddings = float(module.embed_scale)
    if getattr(module, "quant_noise", None) is not None:
        raise CT2ExportError(f"{side_name}: quant-noise embeddings are not supported")


def sret_transformer_spec(model: nn.Module) -> CT2Spec:
    """The CTranslate2 ``TransformerSpec`` of a fairseq ``sret_transformer`` ``model`` at its
    current depth (``model.set_depth(enc, dec)`` first for another), with the vocabularies
    still to register. Raises :class:`CT2ExportError` for what cannot be carried."""
    from ctranslate2.specs import common_spec, transformer_spec

    encoder, decoder = model.encoder, model.decoder
    sides = {}
    for name, module in (("encoder", encoder), ("decoder", decoder)):
        units = _unrolled(name, module)
        sides[name] = (units, _pre_norm(name, units))
    (enc_units, enc_pre), (dec_units, dec_pre) = sides["encoder"], sides["decoder"]
    if enc_pre != dec_pre:
        raise CT2ExportError("a pre-LN encoder with a post-LN decoder, or the reverse (CTranslate2 has one setting)")
    for name, module, pre in (("encoder", encoder, enc_pre), ("decoder", decoder, dec_pre)):
        if not pre and getattr(module, "layer_norm", None) is not None:
            raise CT2ExportError(f"{name}: a final LayerNorm after post-LN layers (CTranslate2 has none there)")
    dec_block = next(m for kind, m, _ in dec_units if kind == "application")
    if dec_block.cross_attn is None:
        raise CT2ExportError("decoder: no encoder attention (--no-cross-attention)")
    heads = (next(m for k, m, _ in enc_units if k == "application").self_attn.num_heads, dec_block.self_attn.num_heads)

    enc_spec = transformer_spec.TransformerEncoderSpec(
        len(enc_units), heads[0], pre_norm=enc_pre,
        layernorm_embedding=getattr(encoder, "layernorm_embedding", None) is not None)
    dec_spec = transformer_spec.TransformerDecoderSpec(
        len(dec_units), heads[1], pre_norm=dec_pre,
        layernorm_embedding=getattr(decoder, "layernorm_embedding", None) is not None,
        no_final_norm=dec_pre and getattr(decoder, "layer_norm", None) is None,
        project_in_out=getattr(decoder, "project_in_dim", None) is not None)
    writers = []
    for name, module, units, side_spec, cross in (("encoder", encoder, enc_units, enc_spec, False),
                                                  ("decoder", decoder, dec_units, dec_spec, True)):
        writer = _SideWriter(name, module, pre_norm=sides[name][1])
        _input_layers(side_spec, module, name)
        if hasattr(side_spec, "layernorm_embedding"):
            writer.layer_norm(side_spec.layernorm_embedding, module.layernorm_embedding, 1.0)
        for layer_spec, (kind, unit, where) in zip(side_spec.layer, units):
            if kind == "application":
                writer.application(layer_spec, unit, where)
            else:
                writer.nll(layer_spec, unit, module.embed_tokens.embedding_dim, cross, where)
        final = getattr(module, "layer_norm", None)
        if final is not None:
            writer.layer_norm(side_spec.layer_norm, final, writer.scale)
            writer.scale = 1.0
        writers.append(writer)
    if writers[0].scale != 1.0:
        raise CT2ExportError("encoder: LRC skip scales and no final LayerNorm (the encoder output would reach the"
                             " decoder scaled)")
    _SideWriter.linear(dec_spec.projection, decoder.output_projection, writers[1].scale)
    if hasattr(dec_spec, "project_in"):
        _SideWriter.linear(dec_spec.project_in, decoder.project_in_dim)
        _SideWriter.linear(dec_spec.project_out, decoder.project_out_dim)
    for writer, side_spec in zip(writers, (enc_spec, dec_spec)):
        side_spec.activation = np.dtype("int8").type(getattr(common_spec.Activation, ACTIVATIONS[writer.activation]))

    spec = transformer_spec.TransformerSpec(enc_spec, dec_spec)
    epsilons = writers[0].epsilons + writers[1].epsilons
    epsilon = math.sqrt(min(epsilons) * max(epsilons))
    if all(e == epsilons[0] for e in epsilons):
        epsilon = epsilons[0]
    spec.config.layer_norm_epsilon = epsilon
    spec.config.decoder_start_token = spec.config.eos_token
    spec.config.add_source_eos = True
    count = lambda units, kind: sum(k == kind for k, _, _ in units)  # noqa: E731
    return CT2Spec(spec, epsilon, epsilons, (len(enc_units), len(dec_units)),
                   (count(enc_units, "application"), count(dec_units, "application")))


def ct2_vocabulary(symbols: Sequence[str]) -> List[str]:
    """A fairseq dictionary's symbols in id order as CTranslate2's vocabulary (``<pad>`` is
    its ``<blank>``, as in CTranslate2's fairseq converter)."""
    return ["<blank>" if token == "<pad>" else token for token in symbols]


def converter(model: nn.Module, source_symbols: Sequence[str], target_symbols: Sequence[str],
              files: Sequence[str] = ()):
    """A ``ctranslate2.converters.Converter`` of ``model`` (at its current depth) with these
    vocabularies; ``files`` are copied into the converted folder. Its ``convert(folder,
    quantization=...)`` writes the model; ``.built`` is the :class:`CT2Spec` once it has."""
    from ctranslate2.converters import Converter

    class SReTConverter(Converter):
        built: Optional[CT2Spec] = None

        def _load(self):
            self.built = sret_transformer_spec(model)
            spec = self.built.spec
            spec.register_source_vocabulary(ct2_vocabulary(source_symbols))
            spec.register_target_vocabulary(ct2_vocabulary(target_symbols))
            for path in files:
                spec.register_file(str(path))
            return spec

    return SReTConverter()
