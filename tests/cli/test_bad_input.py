"""Bad input: invalid options, awkward interactive input, damaged checkpoints.

- Every invalid option combination in ``INVALID`` fails when the model is built - before
  the first update - with a ``ValueError`` naming the option; two of them go through
  ``fairseq-train`` to show that it stops before training.
- ``fairseq-interactive`` treats empty lines and inputs longer than the maximum positions
  exactly as it does for fairseq's own ``transformer``.
- A truncated, empty, bit-flipped or foreign checkpoint file gives one clear error that
  names the file (``CorruptCheckpointError``), from the library and from
  ``fairseq-generate``.
"""

import re
import struct
import zipfile

import pytest
import torch

pytest.importorskip("fairseq")

from fairseq import checkpoint_utils
from fairseq.data import Dictionary

from cli_helpers import SRET, TRAIN, USER_DIR, command, preprocess, run_parallel, write_corpus
from fairseq_sret.checkpoints import CorruptCheckpointError, check_checkpoint_file
from nmt_helpers import SMALL, DummyTask, build

INVALID = [
    # (overrides, text the message must contain)
    (dict(encoder_recursions=2, encoder_groups="2,2,2"), "--encoder-groups"),
    (dict(encoder_groups=""), "--encoder-groups"),
    (dict(encoder_groups="2;1"), "--encoder-groups"),
    (dict(encoder_groups="1.5"), "--encoder-groups"),
    (dict(encoder_groups="0"), "--encoder-groups"),
    (dict(encoder_groups="two"), "--encoder-groups"),
    (dict(decoder_groups="-2"), "--decoder-groups"),
    (dict(decoder_recursions=3, decoder_groups="1,2"), "--decoder-groups"),
    (dict(encoder_recursions="3"), "--encoder-recursions"),
    (dict(decoder_recursions=0), "--decoder-recursions"),
    (dict(encoder_recursions=0), "--encoder-recursions"),
    (dict(decoder_recursions=-1), "--decoder-recursions"),
    (dict(encoder_partition="contiguous,random,strided"), "--encoder-partition"),
    (dict(encoder_partition="sorted"), "--encoder-partition"),
    (dict(decoder_groups="2,2", decoder_partition="strided,contiguous"), "--decoder-partition"),
    (dict(decoder_groups="1,2", decoder_partition="contiguous"), "--decoder-partition"),
    (dict(decoder_groups="2", decoder_partition="contiguous"), "--decoder-partition"),
    (dict(encoder_layers=0), "--encoder-layers"),
    (dict(decoder_attention_heads=0), "--decoder-attention-heads"),
    (dict(encoder_attention_heads=3), "--encoder-attention-heads"),
    (dict(encoder_attention_heads=5), "--encoder-attention-heads"),
    (dict(decoder_attention_heads=3), "--decoder-attention-heads"),
    (dict(encoder_ffn_embed_dim=0), "--encoder-ffn-embed-dim"),
    (dict(decoder_ffn_embed_dim=-3), "--decoder-ffn-embed-dim"),
    (dict(decoder_embed_dim=48, decoder_ffn_embed_dim=48), "--encoder-embed-dim"),
    (dict(nll_ratio=-1.0), "--nll-ratio"),
    (dict(nll_ratio=-0.5), "--nll-ratio"),
    (dict(nll_ratio=float("nan")), "--nll-ratio"),
    (dict(nll_ratio=float("inf")), "--nll-ratio"),
    (dict(dropout=1.0), "--dropout"),
    (dict(attention_dropout=-0.1), "--attention-dropout"),
    (dict(activation_fn="gelu_fast"), "--activation-fn"),
    (dict(encoder_layerdrop=0.2), "--encoder-layerdrop"),
    (dict(encoder_layerdrop=0.1), "layerdrop"),
    (dict(decoder_layers_to_keep="0"), "--decoder-layers-to-keep"),
    (dict(quant_noise_pq=0.1), "--quant-noise-pq"),
    (dict(quant_noise_scalar=0.1), "--quant-noise-scalar"),
    (dict(offload_activations=True), "--offload-activations"),
    (dict(checkpoint_activations=True), "--checkpoint-recursions"),
    (dict(cross_self_attention=True), "--cross-self-attention"),
]


@pytest.mark.parametrize("overrides,option", INVALID, ids=[o for _, o in INVALID])
def test_invalid_option_combination_fails_at_build_naming_it(overrides, option):
    with pytest.raises(ValueError, match=re.escape(option)):
        build("sret_transformer", **dict(SMALL, **overrides))


def test_shared_embeddings_need_a_joined_dictionary():
    task = DummyTask()
    task.target_dictionary = Dictionary()
    for i in range(12):
        task.target_dictionary.add_symbol(f"v{i}")
    with pytest.raises(ValueError, match="--share-all-embeddings"):
        build("sret_transformer", task, **dict(SMALL, share_all_embeddings=True))


def test_valid_edge_configurations_build():
    # no cross-attention: the widths may differ; groups beyond the length; 1 recursion
    build("sret_transformer", **dict(SMALL, decoder_embed_dim=48, decoder_ffn_embed_dim=48,
                                     no_cross_attention=True))
    build("sret_transformer", **dict(SMALL, encoder_recursions=1, decoder_recursions=1,
                                     encoder_groups="64", decoder_groups="64", nll_ratio=0.0))


# ------------------------------------------------------------------ the command line
MAX_POSITIONS = ["--max-source-positions", "16", "--max-target-positions", "16"]
SMALL_CLI = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
             "--decoder-ffn-embed-dim", "64", "--share-all-embeddings"]
TRANSFORMER = ["--arch", "transformer", *SMALL_CLI, "--encoder-layers", "1", "--decoder-layers", "1",
               "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
BAD_TRAIN = [
    (["--encoder-recursions", "2", "--encoder-groups", "2,2,2"], "--encoder-groups"),
    (["--decoder-embed-dim", "48", "--decoder-ffn-embed-dim", "96"], "--encoder-embed-dim"),
]
LINES = ["w1 w2 w3", "", " ".join(["w4"] * 40), "w5", ""]


def save_checkpoint(data_bin, argv, path):
    """What fairseq-train saves before its first update, written in this process."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    args = options.parse_args_and_arch(options.get_training_parser(), [str(data_bin), *map(str, argv)])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()
    trainer.save_checkpoint(str(path), {})
    return path


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """Checkpoints of sret_transformer and of fairseq's transformer, and the outputs of
    every command-line run of this module (run two at a time)."""
    root = tmp_path_factory.mktemp("bad_input")
    data_bin = preprocess(write_corpus(root / "raw"))
    common = [*TRAIN, *MAX_POSITIONS]
    sret = save_checkpoint(data_bin, [*common, *SRET], root / "sret.pt")
    transformer = save_checkpoint(data_bin, [*common, *TRANSFORMER], root / "transformer.pt")
    truncated = root / "checkpoint_cut.pt"
    truncated.write_bytes(sret.read_bytes()[: sret.stat().st_size // 2])

    interactive = [data_bin, "--source-lang", "src", "--target-lang", "tgt", "--beam", "2", *USER_DIR]
    stdin = "\n".join(LINES) + "\n"
    commands = {
        f"interactive {name} {mode}": (command("fairseq-interactive", *interactive, "--path", path, *extra), stdin)
        for name, path in (("sret", sret), ("transformer", transformer))
        for mode, extra in (("skip", ["--skip-invalid-size-inputs-valid-test"]), ("strict", []))
    }
    for i, (options, _) in enumerate(BAD_TRAIN):
        commands[f"train {i}"] = command("fairseq-train", data_bin, *TRAIN, *SRET, *options, "--max-update", "2",
                                         "--no-save", "--save-dir", root / f"unused{i}")
    commands["generate truncated"] = command("fairseq-generate", data_bin, *USER_DIR, "--path", truncated, "--gen-subset", "valid")
    results = dict(zip(commands, run_parallel(list(commands.values()))))
    return dict(data_bin=data_bin, sret=sret, transformer=transformer, truncated=truncated, results=results)


@pytest.mark.e2e
def test_fairseq_train_stops_before_training_naming_the_option(cli):
    for i, (options, option) in enumerate(BAD_TRAIN):
        code, log = cli["results"][f"train {i}"]
        assert code != 0, log[-2000:]
        last = log.strip().splitlines()[-1]
        assert last.startswith("ValueError") and option in last, last
        assert "begin training" not in log and "num_updates" not in log, log[-2000:]


def interactive_outputs(log: str):
    """{sentence id: (source, hypothesis)} and the fairseq warnings about skipped inputs."""
    sources = dict(re.findall(r"^S-(\d+)\t(.*)$", log, flags=re.M))
    hyps = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", log, flags=re.M))
    skipped = re.findall(r"(\d+) samples have invalid sizes and will be skipped, max_positions=(\(\d+, \d+\))", log)
    return {int(i): (sources[i], hyps.get(i)) for i in sources}, skipped


@pytest.mark.e2e
def test_interactive_empty_and_overlong_lines_like_fairseq_transformer(cli):
    results = cli["results"]
    ours_skip, theirs_skip = results["interactive sret skip"], results["interactive transformer skip"]
    # with --skip-invalid-size-inputs-valid-test: the long line is skipped with fairseq's
    # warning, the empty lines are translated (from </s> alone), ids keep the input order
    assert ours_skip[0] == theirs_skip[0] == 0, (ours_skip[1][-2000:], theirs_skip[1][-2000:])
    ours, ours_skipped = interactive_outputs(ours_skip[1])
    theirs, theirs_skipped = interactive_outputs(theirs_skip[1])
    assert sorted(ours) == sorted(theirs) == [0, 1, 3, 4]
    assert ours_skipped == theirs_skipped == [("1", "(16, 16)")]
    for i in (0, 1, 3, 4):
        assert ours[i][0] == theirs[i][0] == LINES[i]
        assert ours[i][1] is not None and theirs[i][1] is not None
        assert len(ours[i][1].split()) < 16  # bounded by --max-target-positions
    # without it: both translate the lines before the long one, then stop with fairseq's
    # message about the size of the sample
    for name in ("sret", "transformer"):
        code, log = results[f"interactive {name} strict"]
        assert code != 0
        assert re.search(r"Size of sample #0 is invalid .* since max_positions=\(16, 16\)", log), log[-2000:]
        assert sorted(interactive_outputs(log)[0]) == [0, 1]


def damaged_copies(checkpoint, folder):
    data = checkpoint.read_bytes()
    # flip 16 bytes in the middle of the largest tensor record (torch does not check CRCs)
    with zipfile.ZipFile(checkpoint) as archive:
        tensors = [info for info in archive.infolist() if "/data/" in info.filename]
        record = max(tensors, key=lambda info: info.file_size)
    name_len, extra_len = struct.unpack("<HH", data[record.header_offset + 26 : record.header_offset + 30])
    middle = record.header_offset + 30 + name_len + extra_len + record.file_size // 2
    flipped = bytearray(data)
    flipped[middle:middle + 16] = bytes(b ^ 0xFF for b in flipped[middle:middle + 16])
    files = {
        "truncated": data[: len(data) // 3],
        "empty": b"",
        "flipped": bytes(flipped),
        "html": b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n",
        "pickle_cut": data[:30],
    }
    paths = {}
    for name, content in files.items():
        paths[name] = folder / f"{name}.pt"
        paths[name].write_bytes(content)
    return paths


@pytest.mark.e2e
@pytest.mark.reliability("one-line-errors")
def test_damaged_checkpoints_give_one_clear_error(cli, tmp_path):
    sret = cli["sret"]
    check_checkpoint_file(sret)  # a sound file passes
    assert "model" in checkpoint_utils.load_checkpoint_to_cpu(str(sret))
    paths = damaged_copies(sret, tmp_path)
    torch.load(paths["flipped"], weights_only=False)  # torch alone loads the damaged weights
    for name, path in paths.items():
        with pytest.raises(CorruptCheckpointError, match="is truncated or corrupted") as info:
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
        assert str(path) in str(info.value), name
        error = info.value  # no chained unpickling traceback
        assert error.__context__ is None or error.__suppress_context__, name


@pytest.mark.e2e
def test_fairseq_generate_on_a_truncated_checkpoint(cli):
    code, log = cli["results"]["generate truncated"]
    assert code != 0
    last = log.strip().splitlines()[-1]
    assert last.startswith("fairseq_sret.checkpoints.CorruptCheckpointError"), last
    assert f"checkpoint file {cli['truncated']} is truncated or corrupted" in last
    for noise in ("Unpickl", "weights_only", "During handling of the above exception", "PytorchStreamReader"):
        assert noise not in log, noise
