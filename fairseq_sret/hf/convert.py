"""fairseq ``sret_transformer`` checkpoints -> transformers model folders (``sret-export-hf``).

Reads the checkpoint with :mod:`fairseq_sret.checkpoints` (safe loading, clear errors for
damaged files) and the run's data-bin (``spm.model`` and fairseq's ``dict.<lang>.txt``), and
writes a folder that ``from_pretrained`` loads after ``import fairseq_sret.hf``:

- ``config.json`` (:class:`~fairseq_sret.hf.SReTConfig` from the checkpoint's options),
  ``generation_config.json`` (fairseq-generate's search: beam 5, length penalty 1, at most
  200 tokens before the forced ``</s>``, no ``</s>`` first, never ``<pad>``);
- ``model.safetensors``: each unique layer once (it is one module, applied ``recursions``
  times), the tied embeddings once;
- the tokenizer (``spm.model``, ``dict.source.txt``, ``dict.target.txt``, its config);
- ``sret_export.json``: what the folder was made from.

:func:`export_checkpoint` writes into the folder it is given, as ``save_pretrained`` does;
``sret-export-hf`` gives it a new folder and applies the commands' output rule (nothing it did
not make is replaced) when it moves the files to ``--out``. Nothing here imports fairseq: a
checkpoint's options are read as saved.
"""

import hashlib
import re
from argparse import Namespace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from torch import Tensor

from .. import __version__
from ..checkpoints import load_checkpoint
from .configuration import SReTConfig
from .tokenization import read_fairseq_dictionary
from .. import json_text

MARKER = "sret_export.json"
#: the files an export always writes (transformers may add more, e.g. a sharded model's)
EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "spm.model", "dict.source.txt",
                "dict.target.txt", "tokenizer_config.json", MARKER)
MADE_BY = "sret-export-hf"
SPM_MODEL = "spm.model"

#: fairseq-generate's defaults (--beam 5 --lenpen 1 --max-len-a 0 --max-len-b 200 --min-len 1)
FAIRSEQ_GENERATE = dict(num_beams=5, length_penalty=1.0, max_len_b=200)

#: options of fairseq's transformer that an exported model does not compute, with the value
#: that means "off"
UNSUPPORTED = {
    "adaptive_softmax_cutoff": None,
    "adaptive_input": False,
    "no_cross_attention": False,
    "cross_self_attention": False,
    "merge_src_tgt_embed": False,
}


class ExportError(ValueError):
    """A checkpoint or data-bin that cannot be exported; the message names it and what is wrong."""


# ---------------------------------------------------------------- reading the checkpoint
def model_options(state: dict, source) -> Namespace:
    """The model options saved in a fairseq checkpoint (the command line's namespace, or the
    ``model`` section of fairseq-hydra-train's config)."""
    if not isinstance(state, dict) or "model" not in state:
        raise ExportError(f"{source}: not a fairseq checkpoint (no 'model' weights)")
    cfg = state.get("cfg") or {}
    options = cfg.get("model") if isinstance(cfg, dict) else None
    if options is None:
        options = state.get("args")
    if isinstance(options, dict):
        options = Namespace(**options)
    if not isinstance(options, Namespace):
        raise ExportError(f"{source}: not a fairseq translation checkpoint (no model options in cfg.model or args)")
    arch = getattr(options, "arch", None) or getattr(options, "_name", None)
    if not (isinstance(arch, str) and arch.startswith("sret_transformer")):
        hint = " (convert a fairseq transformer with sret-uptrain first)" if str(arch).startswith("transformer") else ""
        raise ExportError(f"{source}: holds a {arch!r} model; sret-export-hf exports sret_transformer models{hint}")
    return options


def _option(options: Namespace, name: str, source):
    if not hasattr(options, name):
        raise ExportError(
            f"{source}: the saved model options lack {name!r} (a checkpoint of fairseq-hydra-train that"
            " lists only the options it set?); give the full sret_transformer options"
        )
    return getattr(options, name)


def training_mixed_depth(state: dict, options: Namespace) -> Optional[str]:
    """The ``--mixed-depth`` terms of the training criterion ("" for none), or None when the
    checkpoint does not record its criterion."""
    criterion = (state.get("cfg") or {}).get("criterion")
    if isinstance(criterion, Namespace):
        criterion = vars(criterion)
    if isinstance(criterion, dict) and criterion.get("_name"):
        return criterion.get("mixed_depth") or ""
    if getattr(options, "criterion", None) is not None:
        return getattr(options, "mixed_depth", None) or ""
    return None


def sret_config(state: dict, options: Namespace, vocab_sizes: Tuple[int, int], source) -> SReTConfig:
    """The transformers configuration of the checkpoint's model (see
    :mod:`fairseq_sret.hf.configuration` for the fields that differ from fairseq's options)."""
    for name, off in UNSUPPORTED.items():
        if getattr(options, name, off) not in (off, None, False):
            raise ExportError(f"{source}: --{name.replace('_', '-')} is not supported by the exported model")
    read = lambda name: _option(options, name, source)  # noqa: E731
    post_ln = bool(getattr(options, "post_ln", False))
    values = dict(
        vocab_size=vocab_sizes[0], decoder_vocab_size=vocab_sizes[1],
        nll_ratio=float(read("nll_ratio")), lrc=not read("no_lrc"), activation_fn=read("activation_fn"),
        dropout=float(read("dropout")), attention_dropout=float(read("attention_dropout")),
        activation_dropout=float(read("activation_dropout") or getattr(options, "relu_dropout", 0) or 0.0),
        max_source_positions=int(read("max_source_positions")), max_target_positions=int(read("max_target_positions")),
        no_token_positional_embeddings=bool(read("no_token_positional_embeddings")),
        no_scale_embedding=bool(read("no_scale_embedding")), layernorm_embedding=bool(read("layernorm_embedding")),
        no_decoder_final_norm=bool(getattr(options, "no_decoder_final_norm", False)),
        decoder_output_dim=int(read("decoder_output_dim")),
        share_all_embeddings=bool(read("share_all_embeddings")),
        share_decoder_input_output_embed=bool(read("share_decoder_input_output_embed")),
        mixed_depth=training_mixed_depth(state, options),
    )
    for side in ("encoder", "decoder"):
        depth = int(read(f"{side}_recursions"))
        trained = getattr(options, f"{side}_trained_recursions", None) or depth
        values.update({
            f"{side}_{name}": int(read(f"{side}_{name}"))
            for name in ("embed_dim", "ffn_embed_dim", "attention_heads", "layers")
        })
        values.update({
            f"{side}_recursions": int(trained), f"{side}_depth": None if depth == trained else depth,
            f"{side}_groups": str(read(f"{side}_groups")), f"{side}_partition": str(read(f"{side}_partition")),
            f"{side}_normalize_before": (not post_ln) and bool(read(f"{side}_normalize_before")),
            f"{side}_learned_pos": bool(read(f"{side}_learned_pos")),
        })
    try:
        return SReTConfig(**values)
    except ValueError as exc:
        raise ExportError(f"{source}: its model options do not make an SReT model: {exc}") from None


_LAYER = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.recursive\.")
_SKIPPED = re.compile(r"(^|\.)version$|embed_positions\.(_float_tensor|weights)$")


def hf_state_dict(weights: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """fairseq's parameter names -> the transformers model's: ``encoder.layers.I.recursive.X`` ->
    ``model.encoder.layers.I.X``, ``decoder.output_projection`` -> ``lm_head``, every other name
    under ``model.``; fairseq's version counters and computed position tables are left out."""
    out = {}
    for name, tensor in weights.items():
        if _SKIPPED.search(name):
            continue
        if name == "decoder.output_projection.weight":
            out["lm_head.weight"] = tensor
        else:
            out["model." + _LAYER.sub(r"\1.layers.\2.", name)] = tensor
    return out


def load_weights(model, weights: Dict[str, Tensor], source) -> None:
    """Load the converted weights strictly; a mismatch is one line counting and naming it."""
    converted = {name: tensor.float() for name, tensor in hf_state_dict(weights).items()}
    expected = model.state_dict()
    missing = [name for name in expected if name not in converted]
    unexpected = [name for name in converted if name not in expected]
    shapes = [name for name in converted if name in expected and converted[name].shape != expected[name].shape]
    if missing or unexpected or shapes:
        parts = [f"{len(missing)} missing (e.g. {missing[0]})"] if missing else []
        parts += [f"{len(unexpected)} unexpected (e.g. {unexpected[0]})"] if unexpected else []
        if shapes:
            name = shapes[0]
            parts.append(f"{len(shapes)} of another shape (e.g. {name}: {tuple(converted[name].shape)} in the"
                         f" checkpoint, {tuple(expected[name].shape)} in the model)")
        raise ExportError(f"{source}: the weights do not fit the model its options describe: {'; '.join(parts)}")
    model.load_state_dict(converted, strict=True)


# ---------------------------------------------------------------- reading the data-bin
def language_pair(state: dict, data_bin: Path) -> Tuple[str, str]:
    """(source, target) language: the checkpoint's task options, else the names of the data-bin's
    binarised files (``train.de-en.de.idx``), as fairseq infers them."""
    task = (state.get("cfg") or {}).get("task") or {}
    if isinstance(task, Namespace):
        task = vars(task)
    if task.get("source_lang") and task.get("target_lang"):
        return task["source_lang"], task["target_lang"]
    pairs = set()
    for path in data_bin.glob("*.idx"):
        match = re.match(r"^[^.]+\.([^.-]+)-([^.-]+)\.([^.]+)\.idx$", path.name)
        if match and match.group(3) in match.group(1, 2):
            pairs.add(match.group(1, 2))
    if len(pairs) != 1:
        found = ", ".join(sorted("-".join(p) for p in pairs)) or "none"
        raise ExportError(f"{data_bin}: cannot tell the language pair from its binarised files (found: {found})")
    return pairs.pop()


def dictionary_fingerprint(symbols: List[str]) -> str:
    """The fingerprint fairseq-sret records for a dictionary in a checkpoint (``{side}_dictionary_fingerprint``,
    :func:`fairseq_sret.models.sret_transformer.dictionaries.dictionary_fingerprint`): a hash of its
    symbols in id order."""
    return hashlib.sha256("\n".join(symbols).encode("utf-8")).hexdigest()[:16]


def data_bin_files(state: dict, options: Namespace, data_bin: Path, weights: Dict[str, Tensor], source):
    """(spm.model, source dictionary file, target dictionary file), checked against the checkpoint:
    the dictionaries must have the embeddings' sizes and, where the checkpoint records them, its
    fingerprints."""
    if not data_bin.is_dir():
        raise ExportError(f"{data_bin}: no such data-bin folder")
    spm = data_bin / SPM_MODEL
    if not spm.is_file():
        raise ExportError(f"{data_bin}: has no {SPM_MODEL}; give the data-bin sret-prepare made for this model's run")
    source_lang, target_lang = language_pair(state, data_bin)
    files = []
    for side, lang, key in (("source", source_lang, "encoder.embed_tokens.weight"),
                            ("target", target_lang, "decoder.embed_tokens.weight")):
        path = data_bin / f"dict.{lang}.txt"
        if not path.is_file():
            raise ExportError(f"{data_bin}: has no {path.name} (the {side} dictionary)")
        symbols = read_fairseq_dictionary(path)
        rows = weights[key].shape[0] if key in weights else None
        if rows is not None and rows != len(symbols):
            raise ExportError(
                f"{path}: {len(symbols)} symbols, but {source} embeds {rows}: give the data-bin the model was trained on"
            )
        recorded = getattr(options, f"{side}_dictionary_fingerprint", None)
        if recorded is not None and recorded != dictionary_fingerprint(symbols):
            raise ExportError(
                f"{path}: not the {side} dictionary {source} was trained with (fingerprint"
                f" {dictionary_fingerprint(symbols)}, the checkpoint records {recorded}): give the data-bin of its run"
            )
        files.append(path)
    return spm, files[0], files[1], (source_lang, target_lang)


# ---------------------------------------------------------------- writing
def generation_config(config: SReTConfig):
    """fairseq-generate's search as transformers generation settings: beam 5, length penalty 1
    (scores divided by the length, ``</s>`` included), a sentence done when 5 hypotheses are,
    at most ``max_len_b`` tokens and then ``</s>`` (forced by ``generate()`` as fairseq forces it,
    :class:`~fairseq_sret.hf.modeling.EndAtLengthLimit`), no ``</s>`` as the first token, never
    ``<pad>``."""
    from transformers import GenerationConfig

    return GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, suppress_tokens=[config.pad_token_id],
        num_beams=FAIRSEQ_GENERATE["num_beams"], length_penalty=FAIRSEQ_GENERATE["length_penalty"],
        early_stopping=True, min_new_tokens=1, max_new_tokens=FAIRSEQ_GENERATE["max_len_b"] + 1,
    )


def export_checkpoint(checkpoint, data_bin, folder) -> dict:
    """Export the fairseq checkpoint ``checkpoint`` with the tokenizer of ``data_bin`` into
    ``folder`` (see the module docstring; files of the same names are replaced). Returns what
    was written: a summary, also saved as ``sret_export.json``, and ``files`` (the names that
    were not in ``folder`` before)."""
    checkpoint, data_bin, folder = Path(checkpoint), Path(data_bin), Path(folder)
    if not checkpoint.is_file():
        raise ExportError(f"{checkpoint}: no such checkpoint file")
    state = load_checkpoint(checkpoint)
    options = model_options(state, checkpoint)
    weights = state["model"]
    spm, source_dict, target_dict, langs = data_bin_files(state, options, data_bin, weights, checkpoint)
    vocab = [len(read_fairseq_dictionary(path)) for path in (source_dict, target_dict)]
    config = sret_config(state, options, (vocab[0], vocab[1]), checkpoint)

    from .modeling import SReTForConditionalGeneration
    from .tokenization import SReTTokenizer

    model = SReTForConditionalGeneration(config)
    load_weights(model, weights, checkpoint)
    model.generation_config = generation_config(config)
    tokenizer = SReTTokenizer(spm, source_dict, target_dict)

    before = set(folder.iterdir()) if folder.is_dir() else set()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    summary = {
        "made_by": MADE_BY, "fairseq_sret": __version__, "checkpoint": str(checkpoint.resolve()),
        "data_bin": str(data_bin.resolve()), "source_lang": langs[0], "target_lang": langs[1],
        "unique_parameters": sum(p.numel() for p in model.parameters()),
        "depth": list(model.depth), "recursions": list(model.recursions),
    }
    (folder / MARKER).write_text(json_text.dumps(summary, indent=2) + "\n", encoding="utf-8")
    written = sorted(p.name for p in set(folder.iterdir()) - before | {folder / MARKER})
    return dict(summary, files=written)
