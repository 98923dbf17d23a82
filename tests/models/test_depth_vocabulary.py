"""One vocabulary for depth: ``--{side}-recursions`` is what a layer is built (and trained) with,
``--{side}-depth`` what runs. A checkpoint saved before ``--{side}-depth`` existed (the built
count as ``{side}_trained_recursions``, the depth as ``{side}_recursions``), and the older way
to ask for a depth (fewer recursions than the checkpoint holds), load through fairseq's own
loader to the same model, with one warning naming the option to use now, and export to the
same transformers folder."""

import copy
import json
import logging
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fairseq")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))

from test_modeling import make_data_bin, perturb  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

RECURSIONS = (2, 3)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(folder, data-bin): ``today.pt`` as the plugin saves a checkpoint now, ``older.pt`` the same
    model as it saved it before ``--{side}-depth`` existed."""
    from fairseq import options, tasks

    root = tmp_path_factory.mktemp("depth_words")
    data_bin = make_data_bin(root)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data_bin), "--arch", "sret_transformer", "--task", "translation", "-s", "de", "-t", "en",
        "--optimizer", "adam", "--lr", "0.001", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "48", "--decoder-ffn-embed-dim", "48", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4", "--encoder-layers", "1", "--decoder-layers", "2", "--dropout", "0",
        "--encoder-recursions", str(RECURSIONS[0]), "--decoder-recursions", str(RECURSIONS[1]),
        "--decoder-groups", "2", "--nll-ratio", "0.5", "--share-all-embeddings"])
    torch.manual_seed(0)
    model = tasks.setup_task(args).build_model(args)
    perturb(model, 0)
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam", "lr_scheduler_state": {},
                "num_updates": 0}]
    state = {"args": args, "model": model.state_dict(), "extra_state": {}, "optimizer_history": history}
    torch.save(state, root / "today.pt")
    older = copy.copy(args)
    for side, recursions in zip(("encoder", "decoder"), RECURSIONS):
        setattr(older, f"{side}_trained_recursions", recursions)
        delattr(older, f"{side}_depth")
    torch.save(dict(state, args=older), root / "older.pt")
    # without NLLs the weights are the same whatever the recursions: only their record says them
    plain = copy.copy(args)
    plain.nll_ratio = 0.0
    torch.manual_seed(0)
    model = tasks.setup_task(plain).build_model(plain)
    torch.save(dict(state, args=plain, model=model.state_dict()), root / "no_nll.pt")
    return root, data_bin


def load(saved, name, **overrides):
    from fairseq import checkpoint_utils

    root, data_bin = saved
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(root / name)], arg_overrides={"data": str(data_bin), **overrides})
    return models[0].eval(), task


def decoder_output(model, task):
    d = task.source_dictionary
    g = torch.Generator().manual_seed(1)
    src = torch.randint(d.nspecial, len(d), (3, 7), generator=g)
    src[:, -1] = d.eos()
    prev = torch.cat([torch.full((3, 1), d.eos()), torch.randint(d.nspecial, len(d), (3, 5), generator=g)], dim=1)
    with torch.no_grad():
        return model(src, torch.full((3,), 7), prev)[0]


def test_a_checkpoint_records_the_built_count_as_recursions(saved):
    from fairseq_sret.checkpoints import load_checkpoint

    args = load_checkpoint(saved[0] / "today.pt")["args"]
    assert (args.encoder_recursions, args.decoder_recursions) == RECURSIONS
    assert (args.encoder_depth, args.decoder_depth) == (None, None)
    assert (args.encoder_trained_recursions, args.decoder_trained_recursions) == (None, None)


@pytest.mark.parametrize("depth", [None, (1, 2)], ids=["full depth", "depth 1/2"])
def test_the_older_words_load_the_same_model(saved, depth, caplog):
    today = {} if depth is None else dict(encoder_depth=depth[0], decoder_depth=depth[1])
    older_words = {} if depth is None else dict(encoder_recursions=depth[0], decoder_recursions=depth[1])
    reference, task = load(saved, "today.pt", **today)
    assert reference.recursions == RECURSIONS and reference.depth == (depth or RECURSIONS)
    expected = decoder_output(reference, task)
    runs = [("older.pt", older_words)] + ([("today.pt", older_words)] if depth else [])
    for name, overrides in runs:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            model, _ = load(saved, name, **overrides)
        assert model.recursions == RECURSIONS and model.depth == (depth or RECURSIONS), name
        assert torch.equal(decoder_output(model, task), expected), name
        warned = [r.getMessage() for r in caplog.records if "--encoder-depth" in r.getMessage()
                  or "'encoder_depth'" in r.getMessage()]
        assert warned, (name, [r.getMessage() for r in caplog.records])


def test_more_recursions_than_the_checkpoint_holds_fail_naming_both(saved):
    with pytest.raises(ValueError, match="--decoder-recursions=4 is larger than the 3 recursions this model was"
                                         " trained with"):
        load(saved, "today.pt", decoder_recursions=4)
    with pytest.raises(ValueError, match="--decoder-recursions=4 is larger than the 3 recursions this model was"
                                         r" trained with \(decoder_trained_recursions=3\)"):
        load(saved, "older.pt", decoder_recursions=4)


def test_fewer_recursions_than_groups_listed_run_that_depth_with_one_warning(saved, caplog):
    # a trained model's groups per recursion fix the count it was built with: fewer recursions
    # (the older way to say its depth) run that depth, as --decoder-depth says it now
    with caplog.at_level(logging.WARNING):
        model, task = load(saved, "today.pt", decoder_recursions=2, decoder_groups="2,1,1")
    assert [r.getMessage() for r in caplog.records if "'decoder_depth': 2" in r.getMessage()]
    assert (model.args.decoder_recursions, model.args.decoder_depth) == (3, 2)
    expected = decoder_output(*load(saved, "today.pt", decoder_depth=2, decoder_groups="2,1,1"))
    assert torch.equal(decoder_output(model, task), expected)


def test_the_older_words_export_the_same_transformers_folder(saved, tmp_path):
    from fairseq_sret.hf.convert import export_checkpoint

    root, data_bin = saved
    configs = []
    for name in ("today.pt", "older.pt"):
        export_checkpoint(root / name, data_bin, tmp_path / name)
        configs.append(json.loads((tmp_path / name / "config.json").read_text(encoding="utf-8")))
    assert configs[0] == configs[1]
    assert [configs[0][f"{side}_recursions"] for side in ("encoder", "decoder")] == list(RECURSIONS)
    assert (configs[0]["encoder_depth"], configs[0]["decoder_depth"]) == (None, None)


def test_without_nlls_the_recorded_count_still_decides(saved, caplog):
    with caplog.at_level(logging.WARNING):
        model, _ = load(saved, "no_nll.pt", encoder_recursions=1)
    assert model.recursions == RECURSIONS and model.depth == (1, RECURSIONS[1])
    assert any("'encoder_depth': 1" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="--encoder-recursions=3 is larger than the 2 recursions this model was"
                                         " trained with"):
        load(saved, "no_nll.pt", encoder_recursions=3)
