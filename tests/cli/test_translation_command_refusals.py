"""The translation commands against what a user may try that the documentation does not forbid:
options that change what a report measures, a corpus swapped under a data-bin, a run folder
asked for one checkpoint, a model too large for memory. Each command must refuse by name
(one line, no traceback) or do what was asked, and leave the user's files as they were."""

import json
import os
import re
import shutil
import struct
from pathlib import Path

import pytest

from bad_input_cases import Case, corpus, fake_data_bin, one_line, run_here as run, snapshot, transformer_checkpoint, write
from conftest import requires_fairseq



def binarised_subset(folder: Path, sentences: int, name: str = "bin") -> None:
    """A data-bin of empty files whose test target index says it holds ``sentences``."""
    fake_data_bin(folder, name, splits=("test",))
    header = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 4) + struct.pack("<Q", sentences)
    (folder / name / "test.src-tgt.tgt.idx").write_bytes(header)


def generated(sentences: int) -> str:
    """A fairseq-generate output of ``sentences`` translated sentences of the subset test."""
    return "".join(f"S-{i}\tw{i}\nT-{i}\tv{i}\nH-{i}\t-0.5\tv{i}\n" for i in range(sentences)) + \
        "Generate test with beam=5: BLEU4 = 100.00\n"


# ---------------------------------------------------------------- sret-evaluate
@pytest.mark.parametrize("given,option", [
    ("--nbest 3", "--nbest"),                  # the last, worst hypothesis of each sentence was scored
    ("--score-reference", "--score-reference"),  # the references scored against themselves: BLEU 100
    ("--quiet", "--quiet"),                    # no H- lines: a traceback, or BLEU 0 of empty hypotheses
    ("--prefix-size=2", "--prefix-size"),      # translations started from the references' first tokens
    ("--num-shards 2 --shard-id 0", "--num-shards"),  # a part of the subset scored as the whole
])
@pytest.mark.reliability("tied-to-inputs")
def test_generate_args_that_change_what_is_scored_are_refused(tmp_path, given, option):
    fake_data_bin(tmp_path, splits=("test",))
    write(tmp_path, "c.pt", "weights")
    rc, stderr, changed = run(tmp_path, "sret-evaluate", "--data", "bin", "--checkpoint", "c.pt",
                              f"--generate-args={given}")
    assert rc == 2 and option in one_line(stderr, "sret-evaluate") and "would change what is scored" in stderr
    assert changed == []


@pytest.mark.reliability("tied-to-inputs")
def test_the_library_refuses_them_too(tmp_path):
    """The experiment runner passes an experiment file's eval.variants to run_generate."""
    from fairseq_sret_cli.evaluation.generate import run_generate

    with pytest.raises(ValueError, match="--score-reference would change what is scored"):
        run_generate(tmp_path / "bin", tmp_path / "c.pt", tmp_path / "eval", extra_args=["--score-reference"])
    assert list(tmp_path.iterdir()) == []


EXPERIMENT = """\
name: variants
train: {{args: --optimizer adam --lr 1e-3 --max-tokens 500, max_update: 2}}
eval: {{subsets: [test], beam: 2, variants: {{"": "", other: "{flags}"}}}}
rows:
  - {{id: sret, arch: sret_transformer_tiny}}
"""


@pytest.mark.parametrize("flags,message", [
    ("--nbest 2", "eval.variants.other: --nbest would change what is scored"),
    ("--score-reference", "eval.variants.other: --score-reference would change what is scored"),
    ("--gen-subset valid", "eval.variants.other: --gen-subset is set by the runner itself: give it as eval.subsets"),
    ("--path other.pt", "eval.variants.other: --path is set by the runner itself: give it as eval.checkpoints"),
    ("--beam 1 --lenpen 0.6", None),  # another decoding: the report names the variant's flags
])
@pytest.mark.reliability("tied-to-inputs")
def test_experiment_variants_are_checked_when_the_file_is_read(tmp_path, flags, message):
    import yaml

    from fairseq_sret_cli.experiment_runner import ExperimentError, parse_experiment

    text = EXPERIMENT.format(flags=flags)
    if message is None:
        assert parse_experiment(yaml.safe_load(text), tmp_path / "e.yaml").evaluation.variants["other"] == flags.split()
        return
    with pytest.raises(ExperimentError, match=re.escape(message)):
        parse_experiment(yaml.safe_load(text), tmp_path / "e.yaml")


@pytest.mark.parametrize("sentences", [3, 7])
@pytest.mark.reliability("tied-to-inputs")
def test_an_output_of_other_sentences_than_the_binarised_subset_is_refused(tmp_path, sentences):
    """A data-bin of fairseq-preprocess keeps its references in the output's T- lines: an output
    of 3 of the 5 sentences (fairseq skipped some, or a part was translated) was scored as if
    it were the subset, and one of 7 came from another data-bin."""
    binarised_subset(tmp_path, 5)
    write(tmp_path, "gen/generate-test.txt", generated(sentences))
    rc, stderr, changed = run(tmp_path, "sret-evaluate", "--data", "bin", "--generate-output", "gen/generate-test.txt")
    assert rc == 1 and f"holds {sentences} translated sentences, but the subset 'test' of bin has 5" in one_line(
        stderr, "sret-evaluate")
    assert changed == []  # not even the eval folder


@requires_fairseq  # the score needs sacreBLEU, of the fairseq extra
def test_the_whole_binarised_subset_is_scored(tmp_path):
    binarised_subset(tmp_path, 5)
    write(tmp_path, "gen/generate-test.txt", generated(5))
    rc, stderr, changed = run(tmp_path, "sret-evaluate", "--data", "bin", "--generate-output", "gen/generate-test.txt")
    assert rc == 0, stderr
    assert sorted(c for c in changed if not c.endswith(".sret-outputs.json")) == [
        "+gen/eval", "+gen/eval/test.hyp", "+gen/eval/test.results.json"]


@requires_fairseq
@pytest.mark.reliability("inputs-as-they-seem")
def test_average_last_1_evaluates_the_last_checkpoint_not_the_best(tmp_path):
    """``--average-last 1 --by-update`` translated with checkpoint_best.pt; the checkpoints are
    text here, so the error names the one that was chosen."""
    fake_data_bin(tmp_path, splits=("test",))
    for name in ("checkpoint_1_2.pt", "checkpoint_1_6.pt", "checkpoint_best.pt"):
        write(tmp_path, f"run/{name}", name)
    rc, stderr, changed = run(tmp_path, "sret-evaluate", "--data", "bin", "--checkpoint-dir", "run",
                              "--average-last", "1", "--by-update", "--cpu")
    assert rc == 1 and "run/checkpoint_1_6.pt is truncated or corrupted" in one_line(stderr, "sret-evaluate")
    assert changed == []  # a failed evaluation leaves no eval folder behind


@pytest.mark.reliability("inputs-as-they-seem")
def test_by_update_without_an_average_is_refused(tmp_path):
    fake_data_bin(tmp_path, splits=("test",))
    write(tmp_path, "c.pt", "weights")
    rc, stderr, changed = run(tmp_path, "sret-evaluate", "--data", "bin", "--checkpoint", "c.pt", "--by-update")
    assert rc == 2 and "--by-update chooses which checkpoints --average-last averages" in stderr
    assert changed == []


@requires_fairseq
@pytest.mark.reliability("one-run-per-output")
def test_an_average_is_not_written_when_the_evaluation_is_in_the_way(tmp_path):
    fake_data_bin(tmp_path, splits=("test",))
    for name in ("checkpoint1.pt", "checkpoint2.pt"):
        transformer_checkpoint(tmp_path / "run", name)
    write(tmp_path, "run/eval/test.hyp", "my hypotheses\n")
    rc, stderr, changed = run(tmp_path, "sret-evaluate", "--data", "bin", "--checkpoint-dir", "run",
                              "--average-last", "2")
    assert rc == 2 and "run/eval/test.hyp: exists, not made by sret-evaluate" in one_line(stderr, "sret-evaluate")
    assert changed == []  # no checkpoint.avg2.pt


# ---------------------------------------------------------------- sret-prepare
@requires_fairseq
@pytest.mark.slow
@pytest.mark.reliability("tied-to-inputs")
def test_a_data_bin_of_another_corpus_is_not_already_prepared(tmp_path):
    """The same --out from another --src answered "already prepared" and kept the first
    corpus's data-bin."""
    corpus(tmp_path)
    shutil.copytree(tmp_path / "raw", tmp_path / "other")
    for path in (tmp_path / "other").iterdir():
        path.write_text(path.read_text().replace("w", "x"))
    prepare = ["sret-prepare", "multi30k", "--out", "data-bin", "--vocab-size", "60"]
    assert run(tmp_path, *prepare, "--src", "raw")[0] == 0
    before = snapshot(tmp_path / "data-bin")
    rc, stderr, _ = run(tmp_path, *prepare, "--src", "other")
    line = one_line(stderr, "sret-prepare")
    assert rc == 2 and "made by sret-prepare with other settings (" in line and "src=" in line, line
    assert snapshot(tmp_path / "data-bin") == before
    (tmp_path / "link").symlink_to("raw")  # the same corpus by another path is prepared already
    rc, stderr, _ = run(tmp_path, *prepare, "--src", "link")
    assert rc == 0 and "already prepared" in stderr and snapshot(tmp_path / "data-bin") == before
    assert run(tmp_path, *prepare, "--src", "other", "--force")[0] == 0
    assert "\u2581x" in (tmp_path / "data-bin/dict.de.txt").read_text()


# ---------------------------------------------------------------- errors
@requires_fairseq
@pytest.mark.parametrize("ratio,message", [
    ("6e7", "not enough memory: it asked for 228.9 GiB"),  # torch's allocator's RuntimeError
    ("1e30", "--nll-ratio 1e+30 gives NLLs 3.2e+31 wide, more than a tensor can hold"),  # an overflow's TypeError
])
@pytest.mark.reliability("one-line-errors")
def test_a_model_too_large_for_memory_is_one_line(tmp_path, ratio, message):
    """sret-uptrain --nll-ratio 6e7 asks torch for 229 GiB, 1e30 for a size no integer holds:
    both were tracebacks."""
    transformer_checkpoint(tmp_path)
    rc, stderr, changed = run(tmp_path, "sret-uptrain", "transformer.pt", "out.pt", "--nll-ratio", ratio)
    assert rc == 1 and message in one_line(stderr, "sret-uptrain")
    assert changed == []


# ---------------------------------------------------------------- with a trained tiny model
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A toy data-bin of fairseq-preprocess and a tiny SReT trained on it for 2 updates."""
    pytest.importorskip("fairseq")
    from cli_helpers import SRET, TRAIN, preprocess, run as run_tool, write_corpus

    folder = tmp_path_factory.mktemp("trained")
    data = preprocess(write_corpus(folder / "raw"))
    run_tool("fairseq-train", data, *SRET, *TRAIN, "--max-update", "2", "--save-dir", folder / "ckpt")
    return data, folder / "ckpt/checkpoint_last.pt"


@pytest.mark.e2e
@pytest.mark.reliability("tied-to-inputs")
def test_a_variants_own_beam_and_length_penalty_are_reported(trained, tmp_path):
    """An experiment's variant "--beam 1 --lenpen=0.5" decoded greedily, but its results said
    beam 2, lenpen 1.0 (the experiment's)."""
    from fairseq_sret_cli.evaluation.evaluate import evaluate

    data, checkpoint = trained
    report = evaluate(data, checkpoint=checkpoint, output_dir=tmp_path / "eval", beam=2, lenpen=1.0, cpu=True,
                      extra_args=["--beam", "1", "--lenpen=0.5"])
    saved = json.loads((tmp_path / "eval/test.results.json").read_text())
    assert (report["beam"], report["lenpen"]) == (saved["beam"], saved["lenpen"]) == (1, 0.5)
    assert "beam=1" in (tmp_path / "eval/generate-test.txt").read_text()
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == ["generate-test.txt", "test.hyp",
                                                                     "test.results.json"]  # no staging left


@pytest.mark.reliability("one-run-per-output")
def test_a_second_evaluation_into_a_folder_in_use_is_refused(tmp_path):
    """Two evaluations started together into one folder both passed the check (nothing was
    there yet) and both said they wrote its files: one of them held the other's."""
    from fairseq_sret_cli.outputs import exclusive

    binarised_subset(tmp_path, 5)
    write(tmp_path, "gen/generate-test.txt", generated(5))
    with exclusive(tmp_path / "eval", "sret-evaluate (pid 1)", remove=True):
        rc, stderr, changed = run(tmp_path, "sret-evaluate", "--data", "bin", "--generate-output",
                                  "gen/generate-test.txt", "--output-dir", "eval")
    assert rc == 2 and "eval is in use by sret-evaluate (pid 1" in one_line(stderr, "sret-evaluate")
    assert "would mix their files" in stderr
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize("argv,needs", [
    (["sret-toy-data", "out"], None),
    (["sret-prepare", "multi30k", "--src", "raw", "--out", "out", "--vocab-size", "60"], "fairseq"),
    (["sret-export-hf", "c.pt", "--data-bin", "raw", "--out", "out"], "transformers"),
])
@pytest.mark.reliability("one-run-per-output")
def test_a_second_writer_into_a_folder_in_use_is_refused(tmp_path, argv, needs):
    """Two runs into one folder (another seed, corpus or checkpoint) moved their files in
    side by side: a folder of both, and each said it wrote it."""
    from fairseq_sret_cli.outputs import exclusive

    if needs:
        pytest.importorskip(needs)
    corpus(tmp_path)
    write(tmp_path, "c.pt", "weights")
    before = snapshot(tmp_path)
    with exclusive(tmp_path / "out", "another run (pid 1)", remove=True):
        rc, stderr, _ = run(tmp_path, *argv)
    assert rc == 2 and "out is in use by another run (pid 1" in one_line(stderr, argv[0])
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("argv,needs", [
    (["sret-average-checkpoints", "--inputs", "pipe.pt", "a.pt", "--output", "avg.pt"], None),
    (["sret-evaluate", "--data", "bin", "--checkpoint", "pipe.pt", "--cpu"], "fairseq"),  # fairseq's loader
])
@pytest.mark.reliability("inputs-as-they-seem")
def test_a_pipe_given_as_a_checkpoint_is_refused_not_waited_on(tmp_path, argv, needs):
    """torch.load of a FIFO waits for a writer: the command hung."""
    from bad_input_cases import run_case

    if needs:
        pytest.importorskip(needs)
    fake_data_bin(tmp_path, splits=("test",))
    write(tmp_path, "a.pt", "weights")
    os.mkfifo(tmp_path / "pipe.pt")
    rc, stderr, changed = run_case(Case("pipe", "", argv, ""), tmp_path, timeout=120)
    assert rc == 1 and "pipe.pt is a pipe or device (reading it waits for a writer), not a checkpoint file" in \
        one_line(stderr, argv[0])
    assert changed == []


@pytest.mark.reliability("inputs-as-they-seem")
def test_a_path_fairseq_would_split_is_refused(tmp_path):
    """fairseq-generate reads a:b.pt as two checkpoints to ensemble (and a data-bin x:y as two
    shards): sret-evaluate translated with both and reported the non-existent path /.../a:b.pt
    as the checkpoint (ckpt/x.pt:run/y.pt also made the folder ckpt/x.pt:run/eval for it)."""
    from fairseq_sret_cli.evaluation.generate import run_generate

    fake_data_bin(tmp_path, splits=("test",))
    for name in ("a", "b.pt"):
        write(tmp_path, name, "weights")
    rc, stderr, changed = run(tmp_path, "sret-evaluate", "--data", "bin", "--checkpoint", "a:b.pt", "--cpu")
    assert rc == 2 and "the checkpoint a:b.pt: fairseq reads ':' in a path as a list" in one_line(stderr, "sret-evaluate")
    assert changed == []
    with pytest.raises(ValueError, match="the data-bin x:y: fairseq reads ':'"):
        run_generate("x:y", tmp_path / "b.pt", tmp_path / "eval")
    assert not (tmp_path / "eval").exists()


@requires_fairseq  # the score needs sacreBLEU, of the fairseq extra
@pytest.mark.reliability("one-line-errors")
def test_a_data_bin_whose_name_is_not_utf8_is_reported(tmp_path):
    """A folder name of non-UTF-8 bytes (Python holds it as a lone surrogate) could not be
    written into the UTF-8 results file: the evaluation failed after it was done, with an
    error naming neither the file nor the cause."""
    name = os.fsdecode(b"bin\xff")
    binarised_subset(tmp_path, 5, name=name)
    write(tmp_path, "gen/generate-test.txt", generated(5))
    rc, stderr, _ = run(tmp_path, "sret-evaluate", "--data", name, "--generate-output", "gen/generate-test.txt")
    assert rc == 0, stderr
    assert json.loads((tmp_path / "gen/eval/test.results.json").read_text(encoding="utf-8"))["data"] == name


@requires_fairseq
@pytest.mark.reliability("metadata-survives")
def test_checkpoints_of_different_models_do_not_average(tmp_path):
    """A tiny SReT with one attention group and one with groups 2,1 have the same parameters:
    their average was written (exit 0) as a model of the newest one's kind."""
    import torch

    transformer_checkpoint(tmp_path, "a.pt", layers=2, arch="sret_transformer_tiny")
    state = torch.load(tmp_path / "a.pt", weights_only=False)
    state["cfg"]["model"].encoder_groups = "2,1"
    torch.save(state, tmp_path / "b.pt")
    rc, stderr, changed = run(tmp_path, "sret-average-checkpoints", "--inputs", "a.pt", "b.pt", "--output", "avg.pt")
    assert rc == 1 and "b.pt is another kind of model than a.pt (encoder_groups '2,1' against" in one_line(
        stderr, "sret-average-checkpoints")
    assert changed == []


@requires_fairseq
@pytest.mark.slow
@pytest.mark.reliability("tied-to-inputs")
def test_a_corpus_edited_in_place_is_not_already_prepared(tmp_path):
    """The same --src and --out after the corpus changed answered "already prepared"."""
    corpus(tmp_path)
    beside = ["sret-prepare", "multi30k", "--out", "raw", "--vocab-size", "60", "--src", "raw"]  # --out is --src
    assert run(tmp_path, *beside)[0] == 0
    rc, stderr, _ = run(tmp_path, *beside)  # its own data-bin beside the corpus is not the corpus
    assert rc == 0 and "already prepared" in stderr, stderr
    prepare = ["sret-prepare", "multi30k", "--out", "data-bin", "--vocab-size", "60", "--src", "raw"]
    assert run(tmp_path, *prepare)[0] == 0
    before = snapshot(tmp_path / "data-bin")
    edited = tmp_path / "raw" / "train.de"
    edited.write_text(edited.read_text().replace("w", "x"))
    rc, stderr, _ = run(tmp_path, *prepare)
    assert rc == 2 and "made by sret-prepare with other settings (corpus=" in one_line(stderr, "sret-prepare")
    assert snapshot(tmp_path / "data-bin") == before
    assert run(tmp_path, *prepare, "--force")[0] == 0
    assert "\u2581x" in (tmp_path / "data-bin/dict.de.txt").read_text()
