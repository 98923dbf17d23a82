"""Depth on demand with fairseq's command-line tools: fairseq-train with mixed depth, then
fairseq-generate at every depth via ``--model-overrides`` and the hub's ``from_pretrained``
overrides (fairseq-interactive loads through the same ``load_model_ensemble_and_task``)."""

import hashlib
import re

import pytest
import torch

from cli_helpers import SRET, TRAIN, USER_DIR, command, preprocess, run, run_parallel, write_corpus

pytestmark = pytest.mark.e2e

DEPTHS = {1: "{'encoder_depth': 1, 'decoder_depth': 1}",
          2: "{'encoder_depth': 2, 'decoder_depth': 2}"}


def hypotheses(log):
    hyps = {int(i): h for i, h in re.findall(r"^H-(\d+)\t\S+\t(.*)$", log, flags=re.M)}
    return [hyps[i] for i in sorted(hyps)]


def generate(bin_dir, checkpoint, overrides):
    return command("fairseq-generate", bin_dir, *USER_DIR, "--path", checkpoint, "--gen-subset", "test",
                   "--beam", "5", "--batch-size", "32", "--model-overrides", overrides)


def test_train_mixed_depth_then_generate_at_every_depth(tmp_path, caplog):
    raw = tmp_path / "raw"
    write_corpus(raw)
    bin_dir = preprocess(raw)
    save = tmp_path / "ckpt"
    log = run("fairseq-train", bin_dir, *SRET, *TRAIN, "--max-update", "30", "--save-dir", save,
              "--criterion", "sret_mixed_depth_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
              "--mixed-depth", "1:0.5")
    log = log.stdout + log.stderr
    steps = re.findall(r"train_inner \|.* loss=([\d.]+),.* loss_depth1=([\d.]+), loss_depth2=([\d.]+),", log)
    assert len(steps) >= 25, log[-2000:]
    for total, depth1, depth2 in steps:  # loss = full depth + 0.5 x depth 1 (rounded to 3 decimals)
        assert abs(float(total) - float(depth2) - 0.5 * float(depth1)) < 3e-3
    assert float(steps[-1][1]) < float(steps[0][1]) and float(steps[-1][2]) < float(steps[0][2])

    checkpoint = save / "checkpoint_last.pt"
    digest = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    sources = (raw / "test.src").read_text().splitlines()
    runs = [generate(bin_dir, checkpoint, DEPTHS[1]), generate(bin_dir, checkpoint, DEPTHS[2]),
            generate(bin_dir, checkpoint, "{'encoder_recursions': 3}")]
    (rc1, out1), (rc2, out2), (rc3, out3) = run_parallel(runs)
    assert rc1 == rc2 == 0, (out1[-2000:], out2[-2000:])
    depth1, depth2 = hypotheses(out1), hypotheses(out2)
    assert len(depth1) == len(depth2) == len(sources)
    assert depth1 != depth2  # the depth changed the translations
    assert rc3 != 0 and "--encoder-recursions=3 is larger than the 2 recursions this model was trained with" in out3
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == digest  # the checkpoint is never changed

    # the hub (the loader of fairseq-generate/-interactive, in this process): from_pretrained(...,
    # encoder_depth=1) and set_depth on the full-depth model translate as fairseq-generate did
    from fairseq_sret.models.sret_transformer import SReTTransformerModel

    def hub(name="checkpoint_last.pt", **overrides):
        model = SReTTransformerModel.from_pretrained(
            str(save), checkpoint_file=name, data_name_or_path=str(bin_dir),
            source_lang="src", target_lang="tgt", **overrides)
        return model.eval()

    def translate(model):
        return [model.translate(s, beam=5) for s in sources[:5]]

    assert translate(hub(encoder_depth=1, decoder_depth=1)) == depth1[:5]
    full = hub()
    assert translate(full) == depth2[:5]
    full.models[0].set_depth(1, 1)
    assert translate(full) == depth1[:5]
    # the older way to say the depth (fewer recursions than the groups listed per recursion)
    assert translate(hub(encoder_recursions=1, decoder_recursions=1)) == depth1[:5]

    # a checkpoint saved before --encoder-depth existed (the built count under its older name)
    from fairseq_sret.checkpoints import load_checkpoint

    state = load_checkpoint(checkpoint)
    for side in ("encoder", "decoder"):
        setattr(state["cfg"]["model"], f"{side}_trained_recursions", 2)
    torch.save(state, save / "old.pt")
    assert translate(hub("old.pt")) == depth2[:5]
    assert translate(hub("old.pt", encoder_recursions=1, decoder_recursions=1)) == depth1[:5]

    # the same saved by fairseq-hydra-train before --encoder-depth existed: its model config holds
    # only model options, none of them {side}_depth, and fairseq overrides only the keys such a
    # config holds; the warning gives the older words, which reach it
    from fairseq_sret.models.sret_transformer.hydra_config import _options

    options = _options(SReTTransformerModel)
    model_cfg = {k: v for k, v in vars(state["cfg"]["model"]).items()
                 if k in options and k not in ("encoder_depth", "decoder_depth")}
    state["cfg"]["model"] = dict(model_cfg, _name=state["cfg"]["model"].arch)
    torch.save(state, save / "old_hydra.pt")
    with caplog.at_level("WARNING", logger="fairseq_sret.depth_options"):
        assert translate(hub("old_hydra.pt", encoder_depth=1, decoder_depth=1)) == depth2[:5]
    said = [r.getMessage() for r in caplog.records if "older words" in r.getMessage()]
    assert said and "does not reach it" in said[-1] and "'encoder_recursions': 1" in said[-1]
    assert translate(hub("old_hydra.pt", encoder_recursions=1, decoder_recursions=1)) == depth1[:5]
