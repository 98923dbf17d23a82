"""The toy data-bin and the fairseq checkpoints the transformers tests export: sret-prepare's
Multi30k recipe on a reversal task in German and English words, sret_transformer checkpoints
as fairseq-train, sret-uptrain and fairseq-hydra-train save them, and the batches fairseq
makes of the toy test set. (test_modeling imports them for the other test modules that import
them from there.)"""

import argparse
import copy
import itertools
from pathlib import Path

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_sret.conversion.uptraining import uptrain_checkpoint
from fairseq_sret_cli.data import multi30k
from fairseq_sret_cli.toy import architecture_args, reversal_pairs

GERMAN = "Hund Katze Mann Frau Kind läuft schläft spielt rot groß klein über dem Ball Straße Wasser".split()
ENGLISH = "dog cat man woman child runs sleeps plays red big small over the ball street water".split()
SMALL = dict(encoder_embed_dim=32, decoder_embed_dim=32, encoder_ffn_embed_dim=48, decoder_ffn_embed_dim=48,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_layers=2, decoder_layers=2,
             dropout=0.0, share_all_embeddings=True, nll_ratio=0.5)
MIXED_DEPTH = {"_name": "sret_mixed_depth_label_smoothed_cross_entropy", "mixed_depth": "1:0.5"}


# ---------------------------------------------------------------- toy data and checkpoints
def write_toy_multi30k(folder: Path, sizes=(("train", 300), ("val", 20), ("test_2016_flickr", 24))) -> Path:
    """A Multi30k-shaped raw folder of the reversal toy task in German and English words:
    ``Hund läuft über dem Ball.`` -> ``Ball the over runs dog.``"""
    folder.mkdir(parents=True, exist_ok=True)
    pairs = reversal_pairs(0, len(GERMAN), (2, 7))
    for name, size in sizes:
        chosen = list(itertools.islice(pairs, size))
        (folder / f"{name}.de").write_text(
            "".join(" ".join(GERMAN[i] for i in s) + ".\n" for s, _ in chosen), encoding="utf-8")
        (folder / f"{name}.en").write_text(
            "".join(" ".join(ENGLISH[i] for i in t).capitalize() + ".\n" for _, t in chosen), encoding="utf-8")
    return folder


def make_data_bin(root: Path) -> Path:
    """sret-prepare's Multi30k recipe on the toy corpus: spm.model, joint fairseq dictionaries,
    binarised splits, text/."""
    return multi30k.prepare(root / "bin", src=write_toy_multi30k(root / "raw"), vocab_size=80)


class BinTask:
    """What fairseq's build_model reads of a translation task: the data-bin's dictionaries."""

    def __init__(self, data_bin: Path):
        self.source_dictionary = Dictionary.load(str(data_bin / "dict.de.txt"))
        self.target_dictionary = Dictionary.load(str(data_bin / "dict.en.txt"))


def perturb(model, seed: int) -> None:
    """Weights unlike the initialisation (LayerNorms, LRC coefficients, NLLs), as training leaves them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.3 if p.numel() == 1 else 0.05))


def checkpoint_state(args, model, criterion) -> dict:
    """A checkpoint as fairseq-train saves it (the parts the export reads)."""
    return {"args": None, "model": model.state_dict(),
            "cfg": {"model": args, "criterion": criterion,
                    "task": {"_name": "translation", "source_lang": "de", "target_lang": "en"}}}


def sret_checkpoint(data_bin: Path, path: Path, criterion=None, seed=0, **overrides) -> dict:
    """An sret_transformer of the toy data-bin, built by fairseq, with trained-like weights."""
    criterion = criterion or {"_name": "label_smoothed_cross_entropy"}
    args = architecture_args("sret_transformer", **dict(SMALL, **overrides))
    args.arch = args._name = "sret_transformer"
    args.criterion = criterion["_name"]
    if "mixed_depth" in criterion:
        args.mixed_depth = criterion["mixed_depth"]
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY["sret_transformer"].build_model(args, BinTask(data_bin))
    perturb(model, seed)
    state = checkpoint_state(args, model, criterion)
    torch.save(state, path)
    return state


def uptrained_checkpoint(data_bin: Path, path: Path) -> dict:
    """sret-uptrain of a 4+4-layer fairseq transformer into 2 x 2 recursions, then 'fine-tuned'."""
    kw = dict(SMALL, encoder_layers=4, decoder_layers=4)
    del kw["nll_ratio"]
    args = architecture_args("transformer", **kw)
    args.arch = args._name = "transformer"
    torch.manual_seed(0)
    transformer = ARCH_MODEL_REGISTRY["transformer"].build_model(args, BinTask(data_bin))
    perturb(transformer, 1)
    converted, _ = uptrain_checkpoint(checkpoint_state(args, transformer, {"_name": "cross_entropy"}),
                                      encoder_recursions=2, decoder_recursions=2, nll_ratio=0.5)
    model = fairseq_model(converted, BinTask(data_bin))
    perturb(model, 2)
    converted["model"] = model.state_dict()
    torch.save(converted, path)
    return converted


def hydra_style(state: dict, path: Path) -> dict:
    """The checkpoint as fairseq-hydra-train saves it: the model options a plain dict, without
    what sret_transformer records on its build namespace (the dictionaries' fingerprints, the
    older name of the recursions)."""
    options = {k: v for k, v in vars(state["cfg"]["model"]).items()
               if not k.endswith(("_trained_recursions", "_dictionary_fingerprint"))}
    hydra = dict(state, cfg=dict(state["cfg"], model=options))
    torch.save(hydra, path)
    return dict(state, cfg=dict(state["cfg"], model=argparse.Namespace(**options)))


def fairseq_model(state: dict, task, depth=None):
    """The checkpoint's model as fairseq builds it, at ``depth`` (fairseq's depth override:
    ``--model-overrides "{'encoder_depth': 1, 'decoder_depth': 1}"``)."""
    args = copy.deepcopy(state["cfg"]["model"])
    if depth is not None:
        for side in ("encoder", "decoder"):
            setattr(args, f"{side}_depth", depth)
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(args, task)
    model.load_state_dict(state["model"], strict=True)
    return model.eval()


def toy_batch(data_bin: Path, task, count=None, with_targets=False):
    """The toy test set as fairseq batches it: left-padded sources, prev_output_tokens
    (eos + target) right-padded (and the right-padded targets), built with fairseq's Dictionary
    from the SentencePiece pieces."""
    d = task.source_dictionary
    pieces = {lang: (data_bin / "text" / f"test.sp.{lang}").read_text(encoding="utf-8").splitlines()
              for lang in ("de", "en")}
    sources = [d.encode_line(line, add_if_not_exist=False).long() for line in pieces["de"][:count]]
    targets = [d.encode_line(line, add_if_not_exist=False).long() for line in pieces["en"][:count]]
    width = max(len(s) for s in sources)
    src = torch.full((len(sources), width), d.pad())
    for i, s in enumerate(sources):
        src[i, width - len(s):] = s
    prev = torch.full((len(targets), max(len(t) for t in targets)), d.pad())
    target = prev.clone()
    for i, t in enumerate(targets):
        prev[i, : len(t)] = torch.cat([torch.tensor([d.eos()]), t[:-1]])
        target[i, : len(t)] = t
    return (src, src.ne(d.pad()).sum(1), prev) + ((target,) if with_targets else ())
