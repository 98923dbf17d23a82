"""sret-export-ct2: SReT translation models unrolled into CTranslate2 Transformers.

- fp32 exports score as fairseq's teacher-forced log-probabilities (float32 rounding) on a toy
  data-bin made by sret-prepare's Multi30k recipe: pre-LN with NLL, negative skip scales, no
  NLL/LRC, post-LN, separate embeddings with learned positions, a mixed-depth model exported
  at depth 1; a toy model trained for a few seconds translates as fairseq's
  SequenceGenerator (beam 5: the same hypotheses and scores).
- Where LRC skip scales are not +-1 the one LayerNorm epsilon CTranslate2 holds differs from
  what the fold asks for: the export says so, and stays close to fairseq.
- Unrolled applications of one shared layer are stored once (CTranslate2 aliases equal weights).
- int8 exports load and translate; refusals (sliced group attention, outputs in the way, a
  plain transformer) are one line.
"""

import json
import subprocess

import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")
pytest.importorskip("fairseq")

from cli_helpers import ENV, USER_DIR  # noqa: E402
from fairseq_sret_cli.export_ct2 import MARKER, main  # noqa: E402
from test_modeling import make_data_bin, toy_batch  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

SMALL = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "48",
         "--decoder-ffn-embed-dim", "48", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
         "--encoder-layers", "2", "--decoder-layers", "2", "--nll-ratio", "0.5", "--dropout", "0"]
SHARED = ["--share-all-embeddings"]


# ---------------------------------------------------------------- checkpoints
def fairseq_checkpoint(data_bin, path, argv=(), seed=0, skip_scales=None):
    """An sret_transformer checkpoint as fairseq-train saves it, with trained-like weights
    (perturbed LayerNorms, NLLs, LRC coefficients; every LRC skip scale set to ``skip_scales``
    when given)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    import fairseq_sret.models  # noqa: F401

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data_bin), "--arch", "sret_transformer", *USER_DIR, *SMALL, *map(str, argv)])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.3 if p.numel() == 1 else 0.05))
            if skip_scales is not None and name.endswith("skip_scale"):
                p.fill_(skip_scales)
    torch.save({"cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "model": model.state_dict(),
                "args": None, "extra_state": {},
                "optimizer_history": [{"num_updates": 0, "optimizer_name": "Adam", "lr_scheduler_state": {}}]}, path)
    return path


def trained_checkpoint(data_bin, path, steps=120):
    """A pre-LN sret_transformer (NLL, LRC) trained on the toy data-bin for ``steps`` Adam
    steps, so that beam search ends its translations: saved as fairseq-train saves it."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    import fairseq_sret.models  # noqa: F401

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data_bin), "--arch", "sret_transformer", *USER_DIR, *SMALL, *SHARED])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    dataset = task.dataset("train")
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        batch = dataset.collater([dataset[i] for i in torch.randint(0, len(dataset), (32,)).tolist()])
        net = batch["net_input"]
        logits = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])[0]
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["target"],
                                                 ignore_index=task.target_dictionary.pad())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save({"cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "model": model.state_dict(),
                "args": None, "extra_state": {},
                "optimizer_history": [{"num_updates": steps, "optimizer_name": "Adam", "lr_scheduler_state": {}}]},
               path)
    return path


def load(checkpoint, data_bin, depth=None):
    from fairseq_sret_cli.export_ct2 import load_model

    model, task = load_model(checkpoint, data_bin)
    if depth:
        model.set_depth(*depth)
    return model, task


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(tmp_path_factory.mktemp("ct2_toy"))


@pytest.fixture(scope="module")
def trained(data_bin, tmp_path_factory):
    return trained_checkpoint(data_bin, tmp_path_factory.mktemp("ct2_trained") / "checkpoint.pt")


@pytest.fixture(scope="module")
def made(data_bin, tmp_path_factory):
    """name -> checkpoint, made once per variant."""
    root = tmp_path_factory.mktemp("ct2_checkpoints")
    cache = {}

    def get(name):
        if name not in cache:
            argv, skip = VARIANTS[name]
            cache[name] = fairseq_checkpoint(data_bin, root / f"{len(cache)}.pt", argv, seed=len(cache),
                                             skip_scales=skip)
        return cache[name]

    return get


#: name -> (fairseq-train options, every LRC skip scale or None for the trained-like values)
VARIANTS = {
    "pre-LN, NLL, LRC branch scales": (SHARED, 1.0),
    "negative skip scales": (SHARED, -1.0),
    "no NLL, no LRC": ([*SHARED, "--nll-ratio", "0", "--no-lrc"], None),
    "post-LN, no NLL": ([*SHARED, "--post-ln", "--nll-ratio", "0"], 1.0),
    "separate embeddings, learned positions, embedding LayerNorm, unscaled": (
        ["--encoder-learned-pos", "--decoder-learned-pos", "--layernorm-embedding", "--no-scale-embedding"], 1.0),
    "3 recursions, 1 unique layer": ([*SHARED, "--encoder-layers", "1", "--decoder-layers", "1",
                                      "--encoder-recursions", "3", "--decoder-recursions", "3"], 1.0),
    "LRC as trained": (SHARED, None),
    "groups 2,1": ([*SHARED, "--encoder-groups", "2,1"], None),
    "groups 1,2": ([*SHARED, "--encoder-groups", "1,2", "--no-lrc"], None),
    "no NLL, no LRC, 3 recursions": ([*SHARED, "--nll-ratio", "0", "--no-lrc", "--encoder-recursions", "3",
                                      "--decoder-recursions", "3"], None),
}


def export(capsys, *argv):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    return code, (err[-1] if err else "")


# ---------------------------------------------------------------- what fairseq computes
def pieces(task, rows):
    d = task.source_dictionary
    return [[d[i] for i in row.tolist() if i not in (d.pad(), d.eos())] for row in rows]


def fairseq_beams(model, task, src, lengths, beam=5, max_len_b=200):
    """fairseq's best hypotheses and scores, ``</s>`` allowed from the first step (as in
    CTranslate2, which renormalises the log-probabilities of a step where it bans a token;
    fairseq does not)."""
    from fairseq.sequence_generator import SequenceGenerator

    hypos = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=max_len_b, min_len=0).forward(
        {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    return [h[0]["tokens"].tolist() for h in hypos], [h[0]["score"].item() for h in hypos]


def ct2_beams(translator, task, sources, beam=5, max_len_b=200):
    """Hypotheses as fairseq's ids, ``</s>`` appended where the length limit stopped them
    (fairseq forces it there), and their scores."""
    results = translator.translate_batch(sources, beam_size=beam, max_decoding_length=max_len_b,
                                         min_decoding_length=0, return_scores=True, return_end_token=True)
    d = task.target_dictionary
    hyps = [[d.index(t) for t in r.hypotheses[0]] for r in results]
    return [h if h[-1:] == [d.eos()] else h + [d.eos()] for h in hyps], [r.scores[0] for r in results]


def teacher_forced_difference(model, translator, task, data_bin):
    """Largest |log p| difference between fairseq and CTranslate2 over the toy test set's targets."""
    src, lengths, prev, target = toy_batch(data_bin, task, with_targets=True)
    with torch.no_grad():
        log_probs = torch.log_softmax(model(src, lengths, prev)[0].double(), -1)
    d = task.target_dictionary
    scored = translator.score_batch(pieces(task, src), pieces(task, target))
    worst = 0.0
    for i, result in enumerate(scored):
        n = len(result.log_probs)  # the target's pieces and </s>
        ref = log_probs[i, torch.arange(n), target[i, :n]]
        assert n == int(target[i].ne(d.pad()).sum())
        worst = max(worst, (torch.tensor(result.log_probs, dtype=torch.float64) - ref).abs().max().item())
    return worst


# ---------------------------------------------------------------- fp32: the same function
EXACT = ["pre-LN, NLL, LRC branch scales", "negative skip scales", "no NLL, no LRC", "post-LN, no NLL",
         "separate embeddings, learned positions, embedding LayerNorm, unscaled", "3 recursions, 1 unique layer"]


def exported(checkpoint, data_bin, out, capsys, *options):
    """(export record, CTranslate2 translator) of ``checkpoint`` exported into ``out``."""
    code, line = export(capsys, checkpoint, "--data-bin", data_bin, "--out", out, *options)
    assert code == 0, line
    record = json.loads((out / MARKER).read_text())
    compute_type = "int8" if "int8" in options else "default"
    return record, line, ctranslate2.Translator(str(out), device="cpu", compute_type=compute_type, intra_threads=1)


@pytest.mark.parametrize("name", EXACT)
def test_fp32_export_scores_as_fairseq(made, data_bin, tmp_path, capsys, name):
    """Where every LRC skip scale is +-1 the unrolled model is SReT's function: teacher-forced
    log-probabilities of the toy test set equal fairseq's to float32 rounding."""
    checkpoint = made(name)
    record, line, translator = exported(checkpoint, data_bin, tmp_path / "ct2", capsys)
    assert "exactly SReT's function" in line
    assert record["exact"] and record["layer_norm_epsilons_asked"] == [1e-5, 1e-5]
    model, task = load(checkpoint, data_bin)
    assert teacher_forced_difference(model, translator, task, data_bin) < 1e-4


def test_skip_scales_other_than_one_cost_one_layernorm_epsilon(made, data_bin, tmp_path, capsys):
    """CTranslate2's one epsilon cannot be eps / c^2 for every LayerNorm: the export says how
    far apart they are, and the model stays close to fairseq's."""
    checkpoint = made("LRC as trained")
    record, line, translator = exported(checkpoint, data_bin, tmp_path / "ct2", capsys)
    low, high = record["layer_norm_epsilons_asked"]
    assert not record["exact"] and low < record["layer_norm_epsilon"] < high
    assert "but for one LayerNorm epsilon" in line
    model, task = load(checkpoint, data_bin)
    assert 0 < teacher_forced_difference(model, translator, task, data_bin) < 1e-2


def test_a_mixed_depth_model_exports_at_depth_1(made, data_bin, tmp_path, capsys):
    checkpoint = made("3 recursions, 1 unique layer")
    record, _, translator = exported(checkpoint, data_bin, tmp_path / "ct2", capsys, "--depth", "1/2")
    assert record["depth"] == [1, 2] and record["recursions"] == [3, 3]
    assert record["ct2_layers"] == [2, 4]  # each application and its NLL
    model, task = load(checkpoint, data_bin, depth=(1, 2))
    assert teacher_forced_difference(model, translator, task, data_bin) < 1e-4


def test_applications_of_a_shared_layer_are_stored_once(made, data_bin, tmp_path, capsys):
    checkpoint = made("no NLL, no LRC, 3 recursions")
    sizes = {}
    for depth in ("1", "3"):
        assert export(capsys, checkpoint, "--data-bin", data_bin, "--out", tmp_path / depth, "--depth", depth)[0] == 0
        sizes[depth] = (tmp_path / depth / "model.bin").stat().st_size
    assert json.loads((tmp_path / "3" / MARKER).read_text())["ct2_layers"] == [6, 6]
    one_layer = 4 * (4 * 32 * 32 + 2 * 32 * 48)  # one encoder layer's attention and FFN weights, fp32
    assert sizes["3"] - sizes["1"] < one_layer  # 8 more layers, stored as names of the first ones


# ---------------------------------------------------------------- beam search: a trained model
@pytest.mark.slow
def test_a_trained_model_translates_as_fairseq(trained, data_bin, tmp_path, capsys):
    """Beam 5 on the toy test set: CTranslate2's hypotheses and scores are fairseq's, the
    trained LRC (skip scales off 1: one LayerNorm epsilon for all) included. int8 translates
    too (this 32-wide toy loses much to int8 activations: its hypotheses are not compared)."""
    record, _, translator = exported(trained, data_bin, tmp_path / "fp32", capsys)
    assert not record["exact"]
    model, task = load(trained, data_bin)
    src, lengths, _ = toy_batch(data_bin, task)
    expected, scores = fairseq_beams(model, task, src, lengths)
    assert all(len(h) < 50 for h in expected)  # every search ends well before the length limit
    got, got_scores = ct2_beams(translator, task, pieces(task, src))
    assert got == expected
    assert torch.allclose(torch.tensor(got_scores), torch.tensor(scores), atol=1e-4)

    record, _, int8 = exported(trained, data_bin, tmp_path / "int8", capsys, "--quantization", "int8")
    assert record["quantization"] == "int8"
    assert (tmp_path / "int8" / "model.bin").stat().st_size < 0.6 * (tmp_path / "fp32" / "model.bin").stat().st_size
    assert all(len(h) < 50 for h in ct2_beams(int8, task, pieces(task, src))[0])
    # per target token, int8's log-probabilities stay near fp32's (a broken model is nats away)
    targets = toy_batch(data_bin, task, with_targets=True)[3]
    fp32_scores, int8_scores = (t.score_batch(pieces(task, src), pieces(task, targets)) for t in (translator, int8))
    differences = [abs(a - b) for x, y in zip(fp32_scores, int8_scores) for a, b in zip(x.log_probs, y.log_probs)]
    assert sum(differences) / len(differences) < 0.5


# ---------------------------------------------------------------- refusals and the output rule
def test_sliced_group_attention_is_refused_in_one_line(made, data_bin, tmp_path, capsys):
    checkpoint = made("groups 2,1")
    code, line = export(capsys, checkpoint, "--data-bin", data_bin, "--out", tmp_path / "ct2")
    assert code == 1
    assert line.startswith("sret-export-ct2: error: ") and "sliced group attention with 2 groups" in line
    assert not (tmp_path / "ct2").exists()


def test_a_depth_whose_applications_have_one_group_exports(made, data_bin, tmp_path, capsys):
    checkpoint = made("groups 1,2")
    assert export(capsys, checkpoint, "--data-bin", data_bin, "--out", tmp_path / "ct2")[0] == 1
    code, line = export(capsys, checkpoint, "--data-bin", data_bin, "--out", tmp_path / "ct2", "--depth", "1/2")
    assert code == 0, line


def test_refuses_what_it_did_not_make_unless_forced(made, data_bin, tmp_path, capsys):
    checkpoint = made("no NLL, no LRC")
    out = tmp_path / "ct2"
    out.mkdir()
    (out / "model.bin").write_text("mine")
    code, line = export(capsys, checkpoint, "--data-bin", data_bin, "--out", out)
    assert code == 2 and line.startswith("sret-export-ct2: error: ") and "model.bin" in line and "--force" in line
    assert (out / "model.bin").read_text() == "mine"
    assert export(capsys, checkpoint, "--data-bin", data_bin, "--out", out, "--force")[0] == 0
    assert export(capsys, checkpoint, "--data-bin", data_bin, "--out", out)[0] == 0  # its own: refreshed
    code, line = export(capsys, checkpoint, "--data-bin", data_bin, "--out", out, "--quantization", "int8")
    assert code == 2 and "other settings" in line
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        ["config.json", "model.bin", "shared_vocabulary.json", "spm.model", MARKER])
    record = json.loads((out / MARKER).read_text())
    assert record["checkpoint_fingerprint"].startswith("sha256:")
    assert set(record["data_bin_fingerprints"]) == {"spm.model", "dict.de.txt", "dict.en.txt"}


def test_a_plain_transformer_is_sent_to_ctranslate2s_own_converter(data_bin, tmp_path, capsys):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data_bin), "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "16",
        "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"])
    cfg = convert_namespace_to_omegaconf(args)
    path = tmp_path / "transformer.pt"
    torch.save({"cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "args": None,
                "model": tasks.setup_task(cfg.task).build_model(cfg.model).state_dict()}, path)
    code, line = export(capsys, path, "--data-bin", data_bin, "--out", tmp_path / "ct2")
    assert code == 1 and "ct2-fairseq-converter" in line and len(line.splitlines()) == 1


@pytest.mark.e2e
def test_the_console_script_runs(made, data_bin, tmp_path):
    from cli_helpers import BIN

    result = subprocess.run([str(BIN / "sret-export-ct2"), str(made("no NLL, no LRC")), "--data-bin", str(data_bin),
                             "--out", str(tmp_path / "ct2"), "--quantization", "int8"],
                            env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ct2" / "model.bin").is_file()
