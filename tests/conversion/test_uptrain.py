"""Uptraining a fairseq transformer checkpoint into an sret_transformer one (sret-uptrain).

- The layer mapping: original layer j of L -> unique layer j*U//L, each unique layer the
  average of its originals; NLLs start as the identity, LRC coefficients at 1.
- With one recursion and all layers kept, the converted model reproduces the original
  exactly (pre- and post-LN, every embedding sharing, with and without NLL/LRC).
- The checkpoint's configuration becomes a valid sret_transformer one (command-line and
  hydra-style checkpoints), and the printed fairseq-train options build the same model.
- End to end: fairseq-train a 4+4 transformer, convert it to 2 x 2, then fairseq-generate
  loads it and fairseq-train --finetune-from-model fine-tunes it.
"""

import argparse
import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fairseq")


from cli_helpers import ENV, TRAIN, USER_DIR, preprocess, run, write_corpus
from fairseq import options as fairseq_options
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq_sret_cli.toy import architecture_args
from fairseq_sret.conversion.uptraining import layer_groups, uptrain_checkpoint
from nmt_helpers import SMALL, build
from test_sret_transformer import sample_batch

WIDTHS = dict(SMALL, encoder_ffn_embed_dim=48, decoder_ffn_embed_dim=40, encoder_layers=4, decoder_layers=2,
              dropout=0.0)


def transformer_checkpoint(style="cli", **overrides):
    """A fairseq transformer with random weights (layer norms too) as fairseq saves it:
    cfg.model a flat namespace (command line) or a dict (fairseq-hydra-train)."""
    kw = dict(WIDTHS, **overrides)
    torch.manual_seed(0)
    model, task = build("transformer", **kw)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    args = architecture_args("transformer", **kw)
    args.arch = args._name = "transformer"
    model_cfg = args if style == "cli" else {k: v for k, v in vars(args).items() if k != "arch"}
    state = {"args": None, "cfg": {"model": model_cfg, "task": {"_name": "translation"}}, "model": model.state_dict(),
             "optimizer_history": [{"criterion_name": "x", "optimizer_name": "y", "lr_scheduler_state": {},
                                    "num_updates": 7}],
             "extra_state": {"epoch": 3}, "last_optimizer_state": {"state": {}}}
    return model, task, state


def build_converted(state, task):
    model_cfg = state["cfg"]["model"]
    if isinstance(model_cfg, dict):  # hydra style: what fairseq-generate builds from it
        import fairseq.models
        from omegaconf import OmegaConf

        return fairseq.models.build_model(OmegaConf.create(model_cfg), task)
    return ARCH_MODEL_REGISTRY[model_cfg.arch].build_model(copy.deepcopy(model_cfg), task)


def test_layer_groups_are_contiguous_in_depth_order():
    assert layer_groups(6, 3) == [[0, 1], [2, 3], [4, 5]]  # i*R .. i*R+R-1
    assert layer_groups(6, 4) == [[0, 1], [2], [3, 4], [5]]
    assert layer_groups(5, 2) == [[0, 1, 2], [3, 4]]
    assert layer_groups(4, 4) == [[0], [1], [2], [3]]
    for bad in (0, 7):
        with pytest.raises(ValueError, match="unique layers"):
            layer_groups(6, bad)


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("share", ["none", "decoder", "all"])
@pytest.mark.parametrize("additions", ["plain", "nll+lrc"])
def test_one_recursion_reproduces_the_transformer(normalize_before, share, additions):
    ref, task, state = transformer_checkpoint(
        encoder_normalize_before=normalize_before, decoder_normalize_before=normalize_before,
        share_decoder_input_output_embed=share == "decoder", share_all_embeddings=share == "all")
    plain = additions == "plain"
    converted, report = uptrain_checkpoint(state, encoder_recursions=1, decoder_recursions=1,
                                           nll_ratio=0.0 if plain else 0.5, lrc=not plain)
    assert report["groups"] == {"encoder": [[0], [1], [2], [3]], "decoder": [[0], [1]]}
    ours = build_converted(converted, task)
    ours.load_state_dict(converted["model"], strict=True)
    ref.eval(), ours.eval()
    src, lengths, prev = sample_batch(task)
    expected, _ = ref(src, lengths, prev)
    got, _ = ours(src, lengths, prev)
    assert (got - expected).abs().max() <= 1e-5
    if plain:
        assert report["params"] == report["source_params"]


def test_unique_layers_start_from_the_average_with_identity_nlls():
    _, task, state = transformer_checkpoint()
    converted, report = uptrain_checkpoint(state, encoder_recursions=2, decoder_recursions=2, nll_ratio=1.0)
    assert report["groups"] == {"encoder": [[0, 1], [2, 3]], "decoder": [[0, 1]]}
    src, sd = state["model"], converted["model"]
    mean = lambda *ts: torch.stack(ts).mean(0)  # noqa: E731
    assert torch.equal(sd["encoder.layers.1.recursive.layer.ffn.fc1.weight"],
                       mean(src["encoder.layers.2.fc1.weight"], src["encoder.layers.3.fc1.weight"]))
    assert torch.equal(sd["encoder.layers.1.recursive.layer.ffn_norm.weight"],
                       mean(src["encoder.layers.2.final_layer_norm.weight"], src["encoder.layers.3.final_layer_norm.weight"]))
    q = mean(src["decoder.layers.0.encoder_attn.q_proj.weight"], src["decoder.layers.1.encoder_attn.q_proj.weight"])
    assert torch.allclose(sd["decoder.layers.0.recursive.layer.cross_attn.qkv.weight"][:32], q)
    assert torch.equal(sd["encoder.embed_tokens.weight"], src["encoder.embed_tokens.weight"])
    assert torch.equal(sd["decoder.output_projection.weight"], src["decoder.output_projection.weight"])
    nll_out = [k for k in sd if re.search(r"nlls\.\d+\.mlp\.fc2\.", k)]
    assert len(nll_out) == 2 * 2 * (2 + 1) and all(not sd[k].any() for k in nll_out)  # 2 NLLs x 3 layers, w+b
    lrc = [k for k in sd if k.endswith(("skip_scale", "branch_scale"))]
    assert lrc and all(torch.equal(sd[k], torch.ones(1)) for k in lrc)
    # an identity NLL: the 2x2 model equals running each averaged layer twice without NLLs
    model = build_converted(converted, task).eval()
    model.load_state_dict(sd, strict=True)
    no_nll, _ = uptrain_checkpoint(state, encoder_recursions=2, decoder_recursions=2, nll_ratio=0.0)
    bare = build_converted(no_nll, task).eval()
    bare.load_state_dict(no_nll["model"], strict=True)
    src_tokens, lengths, prev = sample_batch(task)
    assert (model(src_tokens, lengths, prev)[0] - bare(src_tokens, lengths, prev)[0]).abs().max() <= 1e-5
    # the training state of the transformer does not carry over; the record of the conversion does
    assert "last_optimizer_state" not in converted and converted["extra_state"]["sret_uptrain"]["groups"] == report["groups"]


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_configuration_becomes_a_valid_sret_transformer_one(placement):
    pre = placement == "pre"
    _, task, state = transformer_checkpoint(encoder_normalize_before=pre, decoder_normalize_before=pre)
    converted, report = uptrain_checkpoint(state, encoder_layers=3, decoder_recursions=1, encoder_recursions=2,
                                           encoder_groups="2,1")
    args = converted["cfg"]["model"]
    assert isinstance(args, argparse.Namespace) and args.arch == "sret_transformer"
    assert (args.encoder_layers, args.encoder_recursions, args.decoder_layers, args.decoder_recursions) == (3, 2, 2, 1)
    assert (args.encoder_normalize_before, args.decoder_normalize_before, args.post_ln) == (pre, pre, not pre)
    assert report["groups"]["encoder"] == [[0, 1], [2], [3]]
    # the printed fairseq-train options build exactly this model
    options = report["finetune_options"]
    assert options[:2] == ["--arch", "sret_transformer"] and "--encoder-groups" in options
    assert ("--post-ln" in options) == (not pre)
    cli = fairseq_options.parse_args_and_arch(fairseq_options.get_training_parser(),
                                              ["data-bin", *USER_DIR, *options])
    model = ARCH_MODEL_REGISTRY[cli.arch].build_model(cli, task)
    model.load_state_dict(converted["model"], strict=True)


def test_mixed_layer_norm_placement_converts_but_needs_a_yaml_config_to_fine_tune():
    ref, task, state = transformer_checkpoint(encoder_normalize_before=True, decoder_normalize_before=False)
    converted, report = uptrain_checkpoint(state, encoder_recursions=1, decoder_recursions=1)
    assert report["finetune_options"] is None and "model.decoder_normalize_before: false" in report["note"]
    ours = build_converted(converted, task).eval()
    ours.load_state_dict(converted["model"], strict=True)
    src, lengths, prev = sample_batch(task)
    assert (ours(src, lengths, prev)[0] - ref.eval()(src, lengths, prev)[0]).abs().max() <= 1e-5


def test_hydra_style_checkpoint_converts_to_a_hydra_style_one():
    ref, task, state = transformer_checkpoint(style="hydra", encoder_normalize_before=True)
    converted, _ = uptrain_checkpoint(state, encoder_recursions=1, decoder_recursions=1)
    model_cfg = converted["cfg"]["model"]
    assert isinstance(model_cfg, dict) and model_cfg["_name"] == "sret_transformer" and "arch" not in model_cfg
    ours = build_converted(converted, task).eval()
    ours.load_state_dict(converted["model"], strict=True)
    src, lengths, prev = sample_batch(task)
    assert (ours(src, lengths, prev)[0] - ref.eval()(src, lengths, prev)[0]).abs().max() <= 1e-5


def test_bad_inputs_fail_clearly():
    _, _, state = transformer_checkpoint()
    with pytest.raises(ValueError, match="--decoder-layers"):
        uptrain_checkpoint(state, encoder_recursions=2, decoder_recursions=3)  # 2 decoder layers / 3
    with pytest.raises(ValueError, match="--encoder-groups"):
        uptrain_checkpoint(state, encoder_groups="2,2,2")
    with pytest.raises(ValueError, match="unique layers"):
        uptrain_checkpoint(state, encoder_layers=5)
    tiny = architecture_args("sret_transformer_tiny")
    tiny.arch = "sret_transformer_tiny"
    sret = dict(state, cfg={"model": tiny})
    with pytest.raises(ValueError, match="'sret_transformer_tiny' model"):
        uptrain_checkpoint(sret)


@pytest.mark.e2e
def test_uptrain_then_generate_and_finetune(tmp_path):
    data = preprocess(write_corpus(tmp_path / "raw"))
    model = ["--arch", "transformer", "--encoder-layers", "4", "--decoder-layers", "4", "--encoder-embed-dim", "32",
             "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
             "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--encoder-normalize-before",
             "--decoder-normalize-before", "--share-all-embeddings"]
    # fairseq alone, as users train their transformers; without the plugin's consumer_exit patch its
    # reading thread can abort the exit after a mid-epoch --max-update, so none reads ahead
    run("fairseq-train", data, *TRAIN, *model, "--max-update", "4", "--data-buffer-size", "0",
        "--save-dir", tmp_path / "transformer")
    source = tmp_path / "transformer" / "checkpoint_last.pt"
    converted = tmp_path / "uptrained.pt"
    result = subprocess.run([sys.executable, "-m", "fairseq_sret_cli.uptrain", str(source), str(converted)],
                            env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "0+1 -> 0, 2+3 -> 1" in result.stderr
    options = result.stdout.split()
    assert options[:2] == ["--arch", "sret_transformer"]
    out = run("fairseq-generate", data, *USER_DIR, "--path", converted, "--gen-subset", "test", "--beam", "2",
              "--batch-size", "8", "--cpu").stdout
    assert len(re.findall(r"^H-\d+\t", out, flags=re.M)) == 20
    log = run("fairseq-train", data, *USER_DIR, *TRAIN, *options, "--finetune-from-model", converted,
              "--max-update", "3", "--save-dir", tmp_path / "finetuned")
    text = log.stdout + log.stderr
    assert f"Loaded checkpoint {converted}" in text and "num_updates 3" in text, text[-3000:]
    assert (Path(tmp_path) / "finetuned" / "checkpoint_last.pt").exists()
    # the transformer's dictionaries are recorded: a data-bin whose dictionaries hold the same
    # number of symbols in another order is refused, by fine-tuning and by generation
    assert f"recorded the dictionaries of {data}" in result.stderr
    other = tmp_path / "other-data"
    shutil.copytree(data, other)
    for path in other.glob("dict.*.txt"):
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join([lines[1], lines[0]] + lines[2:]), encoding="utf-8")
    for command in (["fairseq-train", other, *USER_DIR, *TRAIN, *options, "--finetune-from-model", converted,
                     "--max-update", "3", "--save-dir", tmp_path / "refused"],
                    ["fairseq-generate", other, *USER_DIR, "--path", converted, "--gen-subset", "test", "--cpu"]):
        refused = run(*command, check=False, timeout=600)
        assert refused.returncode != 0 and "dictionary" in refused.stderr.splitlines()[-1], refused.stderr[-2000:]


@pytest.mark.reliability("metadata-survives")
def test_recorded_dictionaries_travel_with_the_weights_and_must_fit_them(tmp_path):
    from fairseq_sret.conversion.uptraining import data_bin_fingerprints

    model, task, state = transformer_checkpoint()
    state["cfg"]["task"].update(source_lang="src", target_lang="tgt")
    task.source_dictionary.save(str(tmp_path / "dict.src.txt"))
    task.target_dictionary.save(str(tmp_path / "dict.tgt.txt"))
    fingerprints = data_bin_fingerprints(str(tmp_path), state)
    converted, _ = uptrain_checkpoint(state, fingerprints=fingerprints)
    assert converted["model"]._metadata[""] == fingerprints
    sret = build_converted(converted, task)
    sret.load_state_dict(converted["model"])  # the task's own dictionaries: accepted

    shuffled = copy.deepcopy(task)
    shuffled.source_dictionary.symbols[-2:] = shuffled.source_dictionary.symbols[-2:][::-1]
    with pytest.raises(ValueError, match="source dictionary .* is not the one the model was trained with"):
        build_converted(converted, shuffled).load_state_dict(converted["model"])

    with (tmp_path / "dict.tgt.txt").open("a", encoding="utf-8") as f:
        f.write("extra 1\n")
    with pytest.raises(ValueError, match="symbols, but the checkpoint's decoder embeddings have"):
        data_bin_fingerprints(str(tmp_path), state)
