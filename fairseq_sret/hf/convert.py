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
- ``sret_export.json``: what the folder was made from: the checkpoint (its path and the
  fingerprint of its bytes, and for an average the inputs it records), the data-bin, the
  languages.

The tokenizer's files must belong together and to the checkpoint: the dictionaries have the
checkpoint's sizes and recorded fingerprints, and ``spm.model`` is the SentencePiece model the
dictionaries were made with (:func:`check_sentencepiece_fits`). ``config.json`` and
``tokenizer_config.json`` record the fingerprints of the three files as exported
(``tokenizer_fingerprints``), which the model and the tokenizer check when they load.

:func:`export_checkpoint` writes into the folder it is given, as ``save_pretrained`` does;
``sret-export-hf`` gives it a new folder and applies the commands' output rule (nothing it did
not make is replaced) when it moves the files to ``--out``. Nothing here imports fairseq: a
checkpoint's options are read as saved.
"""

import copy
import itertools
import json
import re
from argparse import Namespace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from torch import Tensor

from .. import __version__
from ..checkpoints import load_checkpoint
from ..depth_options import upgrade_depth_options
from ..core.attention import DEFAULT_ATTENTION_LAYER
from .configuration import SReTConfig
from .tokenization import dictionary_fingerprint, file_fingerprint, read_fairseq_dictionary, tokenizer_fingerprints
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
        attention_layer=str(getattr(options, "attention_layer", None) or DEFAULT_ATTENTION_LAYER),
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
    options = copy.copy(options)
    try:
        upgrade_depth_options(options)  # a checkpoint saved before --encoder-depth, in today's words
    except ValueError as exc:
        raise ExportError(f"{source}: {exc}") from None
    for side in ("encoder", "decoder"):
        depth = getattr(options, f"{side}_depth", None)
        values.update({
            f"{side}_{name}": int(read(f"{side}_{name}"))
            for name in ("embed_dim", "ffn_embed_dim", "attention_heads", "layers")
        })
        values.update({
            f"{side}_recursions": int(read(f"{side}_recursions")), f"{side}_depth": None if depth is None else int(depth),
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


#: lines of the data-bin's text that the SentencePiece model must encode as the data-bin holds them
ENCODING_SAMPLE = 200
_FILLER = re.compile(r"^madeupword\d+$")  # fairseq-preprocess pads a dictionary with these


def check_sentencepiece_fits(spm: Path, dictionaries: Sequence[Path], data_bin: Path, langs: Sequence[str]) -> None:
    """Refuse, naming ``spm``, a SentencePiece model that is not the one the dictionaries were
    made with (another ``sret-prepare``'s ``spm.model``), by what the data-bin holds:

    - ``sret_data.json``'s vocabulary size, the size of the model ``sret-prepare`` made;
    - the dictionaries: each symbol is a piece of the model, or made only of characters it does
      not know (which it passes on as they are);
    - ``text/``: the first lines of each language's text encode to the pieces the data-bin was
      binarised from (``text/{split}.sp.{lang}``), where ``sret-prepare`` left them.
    """
    import sentencepiece

    try:
        processor = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    except (RuntimeError, OSError) as exc:
        raise ExportError(f"{spm}: not a SentencePiece model ({str(exc).splitlines()[0]})") from None
    fix = "give the data-bin sret-prepare made for this model's run, with its own spm.model"
    metadata = data_bin / "sret_data.json"
    if metadata.is_file():
        try:
            options = json.loads(metadata.read_text(encoding="utf-8")).get("options") or {}
        except (ValueError, AttributeError):
            options = {}
        made = options.get("vocab_size") if "requested_vocab_size" in options else None
        if isinstance(made, int) and made != processor.get_piece_size():
            raise ExportError(f"{spm}: {processor.get_piece_size()} pieces, but {metadata} records the {made} of the"
                              f" SentencePiece model its dictionaries were made with: {fix}")

    def known(piece: str) -> bool:
        return not processor.is_unknown(processor.piece_to_id(piece))

    for path in dictionaries:
        for symbol in read_fairseq_dictionary(path)[4:]:
            if known(symbol) or _FILLER.match(symbol):
                continue
            if any(known(char) or known("\u2581" + char) for char in symbol.lstrip("\u2581")):
                raise ExportError(f"{spm}: not the SentencePiece model of {path} (its symbol {symbol!r} is not a"
                                  f" piece of it): {fix}")
    text = data_bin / "text"
    for lang in langs:
        for split in ("train", "valid", "test"):
            raw, pieces = text / f"{split}.{lang}", text / f"{split}.sp.{lang}"
            if raw.is_file() and pieces.is_file():
                break
        else:
            continue
        with open(raw, encoding="utf-8") as raw_lines, open(pieces, encoding="utf-8") as piece_lines:
            for number, (line, expected) in enumerate(itertools.islice(zip(raw_lines, piece_lines), ENCODING_SAMPLE), 1):
                got = " ".join(processor.encode(line.rstrip("\r\n").removeprefix("\ufeff"), out_type=str))
                if got != expected.rstrip("\r\n").removeprefix("\ufeff"):
                    raise ExportError(f"{spm}: encodes line {number} of {raw} otherwise than the data-bin holds it"
                                      f" ({pieces}): not the SentencePiece model of this data-bin; {fix}")


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
    check_sentencepiece_fits(spm, files, data_bin, (source_lang, target_lang))
    return spm, files[0], files[1], (source_lang, target_lang)


def checkpoint_fingerprint(path) -> str:
    """The identity of a checkpoint file that ``sret_export.json`` records: its bytes' SHA-256
    (first 16 hex digits), the same file wherever it lies."""
    return file_fingerprint("checkpoint", path)


def check_exported_from(folder, checkpoint) -> dict:
    """The ``sret_export.json`` of ``folder``, after checking that the folder is an export of the
    checkpoint file ``checkpoint`` (by the fingerprint it records; an export made before
    fingerprints were recorded, by the checkpoint's path). ExportError naming both otherwise."""
    folder, checkpoint = Path(folder), Path(checkpoint)
    marker = folder / MARKER
    if not marker.is_file():
        raise ExportError(f"{folder}: not a folder of sret-export-hf (no {MARKER})")
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ExportError(f"{marker}: not JSON ({exc})") from None
    if not checkpoint.is_file():
        raise ExportError(f"{checkpoint}: no such checkpoint file")
    recorded = record.get("checkpoint_fingerprint")
    if recorded is not None:
        actual = checkpoint_fingerprint(checkpoint)
        if actual != recorded:
            raise ExportError(f"{folder} was exported from another checkpoint than {checkpoint} (fingerprint {actual};"
                              f" the folder records {recorded}, {record.get('checkpoint')})")
    elif Path(str(record.get("checkpoint"))) != checkpoint.resolve():
        raise ExportError(f"{folder} was exported from {record.get('checkpoint')}, not {checkpoint}")
    return record


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
    config.tokenizer_fingerprints = tokenizer_fingerprints(spm, source_dict, target_dict)

    from .modeling import SReTForConditionalGeneration
    from .tokenization import SReTTokenizer

    model = SReTForConditionalGeneration(config)
    load_weights(model, weights, checkpoint)
    model.generation_config = generation_config(config)
    tokenizer = SReTTokenizer(spm, source_dict, target_dict, tokenizer_fingerprints=config.tokenizer_fingerprints)

    before = set(folder.iterdir()) if folder.is_dir() else set()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    summary = {
        "made_by": MADE_BY, "fairseq_sret": __version__, "checkpoint": str(checkpoint.resolve()),
        "checkpoint_fingerprint": checkpoint_fingerprint(checkpoint),
        **({"averaged_from": state["averaged_from"]} if state.get("averaged_from") else {}),
        "data_bin": str(data_bin.resolve()), "source_lang": langs[0], "target_lang": langs[1],
        "unique_parameters": sum(p.numel() for p in model.parameters()),
        "depth": list(model.depth), "recursions": list(model.recursions),
    }
    (folder / MARKER).write_text(json_text.dumps(summary, indent=2) + "\n", encoding="utf-8")
    written = sorted(p.name for p in set(folder.iterdir()) - before | {folder / MARKER})
    return dict(summary, files=written)
