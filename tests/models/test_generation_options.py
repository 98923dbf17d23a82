"""fairseq's own generation and training options with our models: each works, or is refused
by name (the options of the model itself: ``test_transformer_options.py``).

Every field of fairseq's ``GenerationConfig``, ``CommonEvalConfig`` and ``InteractiveConfig``
is in ``GENERATION``: in a group of options decoded together (``GROUPS``, in this process
with fairseq's own ``generate``/``interactive`` entry points), refused by the model with an
error naming it (``REFUSED``), or noted where fairseq itself decides for every model. A
fairseq with a new option fails ``test_the_matrix_covers_every_generation_option`` until the
option is placed. Training: the options of the trainer that act on the model's parameters
(EMA, accumulation, clipping, BLEU validation by generation) in one ``fairseq-train`` run.
"""

import contextlib
import dataclasses
import io
import logging
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

pytest.importorskip("fairseq")


from cli_helpers import ENV, SRET, TRAIN, USER_DIR, command, preprocess, write_corpus
from fairseq_sret.models.sret_transformer.model import UNSUPPORTED_GENERATION

pytestmark = pytest.mark.e2e

#: options decoded together, each group in one call; "{lm}" is a tiny language model
GROUPS = {
    "beam": ["--beam", "3", "--nbest", "2", "--lenpen", "0.5", "--unkpen", "0.5", "--min-len", "2",
             "--max-len-a", "1", "--max-len-b", "6", "--unnormalized", "--no-beamable-mm", "--no-early-stop",
             "--no-repeat-ngram-size", "2", "--eos-token", "</s>", "--sacrebleu", "--post-process", "sentencepiece"],
    "sampling": ["--sampling", "--beam", "2", "--nbest", "2", "--sampling-topk", "3", "--temperature", "0.7"],
    "nucleus": ["--sampling", "--beam", "2", "--nbest", "2", "--sampling-topp", "0.9", "--retain-dropout",
                "--retain-dropout-modules", "SReTDecoderLayer"],
    "diverse": ["--beam", "4", "--nbest", "4", "--diverse-beam-groups", "2", "--diverse-beam-strength", "0.3",
                "--prefix-size", "1"],
    "siblings": ["--beam", "3", "--diversity-rate", "0.5"],
    "reference": ["--score-reference", "--quiet"],
    "language model": ["--lm-path", "{lm}", "--lm-weight", "0.5", "--match-source-len"],
}
#: fairseq-interactive: constraints come with the input lines
INTERACTIVE = ["--constraints", "--buffer-size", "4", "--beam", "2"]

#: option -> how it is covered: a group, "interactive", "refused", or fairseq's own rule (why)
GENERATION = {
    **{name: "beam" for name in ("beam", "nbest", "lenpen", "unkpen", "min_len", "max_len_a", "max_len_b",
                                 "unnormalized", "no_beamable_mm", "no_early_stop", "no_repeat_ngram_size",
                                 "eos_token", "sacrebleu", "post_process")},
    **{name: "sampling" for name in ("sampling", "sampling_topk", "temperature")},
    **{name: "nucleus" for name in ("sampling_topp", "retain_dropout", "retain_dropout_modules")},
    **{name: "diverse" for name in ("diverse_beam_groups", "diverse_beam_strength", "prefix_size")},
    "diversity_rate": "siblings",
    **{name: "reference" for name in ("score_reference", "quiet")},
    **{name: "language model" for name in ("lm_path", "lm_weight", "match_source_len")},
    **{name: "interactive" for name in ("constraints", "buffer_size", "input")},
    **{name: "refused" for name in UNSUPPORTED_GENERATION},
    "path": "every call", "results_path": "every call", "model_overrides": "test_depth_overrides.py, test_bad_input_table.py",
    "no_seed_provided": "fairseq's own bookkeeping (set when --seed is not given)",
}
#: a value for each refused option (flags: no value)
REFUSED = {"print_alignment": [], "replace_unk": [], "print_step": [], "retain_iter_history": [],
           "iter_decode_force_max_iter": [], "iter_decode_with_external_reranker": [],
           "iter_decode_eos_penalty": ["0.5"], "iter_decode_max_iter": ["3"], "iter_decode_with_beam": ["2"],
           "decoding_format": ["unigram"], "beam_mt": ["2"], "max_len_a_mt": ["1"], "max_len_b_mt": ["9"],
           "lenpen_mt": ["0.5"]}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A toy data-bin (with the dict.txt a language model reads), a tiny SReT after one update
    and a tiny transformer language model over the target dictionary."""
    folder = tmp_path_factory.mktemp("options")
    data = preprocess(write_corpus(folder / "raw"))
    shutil.copy(data / "dict.tgt.txt", data / "dict.txt")
    subprocess.run(command("fairseq-train", data, *SRET, *TRAIN, "--max-update", "1", "--save-dir", folder / "ckpt"),
                   env=ENV, check=True, capture_output=True, timeout=300)
    return data, folder / "ckpt" / "checkpoint_last.pt", language_model(data, folder / "lm.pt")


def language_model(data: Path, path: Path) -> Path:
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        str(data), "--task", "language_modeling", "--arch", "transformer_lm", "--decoder-layers", "1",
        "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--cpu"])
    cfg = convert_namespace_to_omegaconf(args)
    model = tasks.setup_task(cfg.task).build_model(cfg.model)
    torch.save({"cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "model": model.state_dict(),
                "args": None, "extra_state": {},
                "optimizer_history": [{"num_updates": 0, "optimizer_name": "Adam", "lr_scheduler_state": {}}]}, path)
    return path


def decode(entry: str, argv, stdin: str = "") -> str:
    """fairseq's ``generate`` (or ``interactive``) main in this process; returns what it prints."""
    from fairseq import options
    from fairseq_cli import generate, interactive

    import fairseq_sret.models  # noqa: F401  (--user-dir does not import an imported plugin again)

    parser = options.get_generation_parser(interactive=entry == "interactive")
    out = io.StringIO()
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            args = options.parse_args_and_arch(parser, input_args=list(map(str, argv)))
            (interactive.main if entry == "interactive" else generate.main)(args)
    finally:
        logging.disable(logging.NOTSET)
    return out.getvalue()


def generation_argv(model, *extra):
    data, checkpoint, lm = model
    # no data-loading worker: each would cost seconds to start and stop per call
    return [data, *USER_DIR, "--path", checkpoint, "--gen-subset", "test", "--cpu", "--max-len-b", "12",
            "--required-batch-size-multiple", "1", "--num-workers", "0", *[str(lm) if a == "{lm}" else a for a in extra]]


def test_the_matrix_covers_every_generation_option():
    from fairseq.dataclass.configs import CommonEvalConfig, GenerationConfig, InteractiveConfig

    fields = {f.name for c in (GenerationConfig, CommonEvalConfig, InteractiveConfig) for f in dataclasses.fields(c)}
    assert fields - {"_name"} == set(GENERATION), sorted(set(GENERATION) ^ (fields - {"_name"}))
    assert set(REFUSED) == set(UNSUPPORTED_GENERATION)


@pytest.mark.parametrize("group", list(GROUPS))
def test_options_that_work_with_our_model(group, model):
    printed = decode("generate", generation_argv(model, *GROUPS[group]))
    hypotheses = [line for line in printed.splitlines() if line.startswith("H-")]
    nbest = int(GROUPS[group][GROUPS[group].index("--nbest") + 1]) if "--nbest" in GROUPS[group] else 1
    assert len(hypotheses) == (0 if "--quiet" in GROUPS[group] else 20 * nbest), printed[-2000:]
    assert "Generate test with beam=" in printed
    if group == "reference":  # the references scored as hypotheses
        assert "BLEU4 = 100.00" in printed


def test_constraints_in_fairseq_interactive(model):
    data, checkpoint, _ = model
    lines = "w1 w2 w3\tv3\nw4 w5\tv5\n"
    printed = decode("interactive", [data, *USER_DIR, "--path", checkpoint, "--cpu", "--num-workers", "0", "--source-lang", "src",
                                     "--target-lang", "tgt", *INTERACTIVE, "--input", write_input(data, lines)])
    hypotheses = [line.split("\t")[2] for line in printed.splitlines() if line.startswith("H-")]
    assert len(hypotheses) == 2 and "v3" in hypotheses[0].split() and "v5" in hypotheses[1].split(), printed


def write_input(folder: Path, text: str) -> Path:
    path = folder / "input.txt"
    path.write_text(text)
    return path


@pytest.mark.parametrize("option", list(REFUSED))
def test_options_our_model_cannot_honour_are_refused_by_name(option, model):
    flag = f"--{option.replace('_', '-')}"
    if option == "replace_unk":  # fairseq-generate first asks for a raw data set: fairseq-interactive reads text
        data, checkpoint, _ = model
        argv = [data, *USER_DIR, "--path", checkpoint, "--cpu", "--num-workers", "0", "--source-lang", "src",
                "--target-lang", "tgt", flag, "--input", write_input(data, "w1 w2\n")]
        entry = "interactive"
    else:
        argv, entry = generation_argv(model, flag, *REFUSED[option]), "generate"
    with pytest.raises(ValueError, match=rf"^{flag}\b.*: .*drop (it|{flag})$"):
        decode(entry, argv)


def test_training_options_that_act_on_the_parameters(tmp_path, model):
    """EMA of the weights, gradient accumulation and clipping, and BLEU
    validation by generation, in one fairseq-train run."""
    data, _, _ = model
    train = [a for a in TRAIN if a != "--disable-validation"]
    result = subprocess.run(command(
        "fairseq-train", data, *SRET, *train, "--max-update", "4", "--save-dir", tmp_path / "ckpt",
        "--ema-decay", "0.9", "--store-ema", "--ema-start-update", "1", "--ema-update-freq", "1", "--ema-fp32",
        "--update-freq", "2", "--clip-norm", "0.5",
        "--eval-bleu", "--eval-bleu-detok", "space", "--eval-bleu-args", '{"beam": 2, "max_len_b": 10}',
        "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"), env=ENV, capture_output=True,
        text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"valid_bleu"' in result.stdout or "| bleu " in result.stdout, result.stdout[-2000:]
    from fairseq_sret.checkpoints import load_checkpoint

    state = load_checkpoint(tmp_path / "ckpt" / "checkpoint_last.pt")
    ema = state["extra_state"]["ema"]
    assert ema and set(ema) <= set(state["model"]) and any("recursive" in k for k in ema)
    assert any(not torch.equal(ema[k].float(), state["model"][k].float()) for k in ema)  # the average lags


def test_int8_through_a_model_override(model, monkeypatch):
    """fairseq-generate --model-overrides "{'int8_in_generation': True}" decodes with the
    linear layers quantized (all but the output projection tied to the embeddings)."""
    pytest.importorskip("torchao")
    from fairseq_sret.core.int8 import is_int8
    from fairseq_sret.models.sret_transformer import model as sret_model

    quantized = []
    real = sret_model.quantize_int8_
    monkeypatch.setattr(sret_model, "quantize_int8_", lambda m: quantized.append(real(m)))
    printed = decode("generate", generation_argv(model, "--model-overrides", "{'int8_in_generation': True}"))
    assert len([line for line in printed.splitlines() if line.startswith("H-")]) == 20
    (decoded,) = quantized
    linears = [m for m in decoded.modules() if isinstance(m, torch.nn.Linear)]
    assert sum(map(is_int8, linears)) == len(linears) - 1 and not is_int8(decoded.decoder.output_projection)
