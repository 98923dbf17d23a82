"""fairseq-hydra-train: SReT options in a YAML ``model:`` section, checked like the command line.

- Every architecture resolves a hydra model config to exactly the options the command line
  gives (``--arch NAME``), and both paths build the same model.
- Every invalid option of the command-line table (test_bad_input.INVALID) fails with the same
  message from a YAML config; unknown keys and badly typed values fail naming the key.
- fairseq-hydra-train trains on toy data and fairseq-generate translates with its checkpoint.
- Each recipe's config (examples/*/config/sret.yaml) holds exactly the settings of its train.sh.
"""

import argparse
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fairseq")

from omegaconf import OmegaConf, open_dict

import fairseq.models
from cli_helpers import ENV, REPO, preprocess, run, write_corpus
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq_sret.models.sret_transformer.hydra_config import _options, namespace_from_config
from fairseq_sret.models.sret_transformer import SReTTransformerModel
from fairseq_sret_cli.toy import architecture_args
from nmt_helpers import SMALL, DummyTask, build
from test_bad_input import INVALID

ARCHS = ["sret_transformer", "sret_transformer_tiny", "sret_transformer_iwslt_de_en",
         "sret_transformer_wmt_en_de", "sret_transformer_wmt_en_de_big"]
OPTIONS = _options(SReTTransformerModel)


def hydra_namespace(model_cfg: dict, task=None) -> argparse.Namespace:
    """What build_model sees for a YAML ``model:`` section: fairseq's own resolution (the
    architecture function on the DictConfig, as fairseq.models.build_model runs it), then ours."""
    cfg = OmegaConf.create({"model": model_cfg})
    OmegaConf.set_struct(cfg, True)
    with open_dict(cfg.model):
        ARCH_CONFIG_REGISTRY[model_cfg["_name"]](cfg.model)
    return namespace_from_config(SReTTransformerModel, cfg.model, task)


def option_values(ns: argparse.Namespace) -> dict:
    """Every model option's value, the parser's default where ``ns`` lacks it."""
    return {k: getattr(ns, k, action.default) for k, action in OPTIONS.items()}


def assert_same_options(cli: dict, hydra: dict):
    differ = {k: (cli[k], hydra[k]) for k in cli if not (cli[k] == hydra[k] or cli[k] != cli[k] and hydra[k] != hydra[k])}
    assert not differ, f"(command line, hydra) differ: {differ}"


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_resolves_like_the_command_line(arch):
    overrides = dict(encoder_recursions=3, decoder_groups="2,1", nll_ratio=0.25, no_lrc=True)
    cli = architecture_args(arch, **overrides)
    hydra = hydra_namespace(dict(_name=arch, **overrides))
    assert_same_options(option_values(cli), option_values(hydra))


def test_hydra_and_command_line_build_the_same_model():
    overrides = dict(SMALL, encoder_groups="2,1", decoder_recursions=3, share_all_embeddings=True)
    torch.manual_seed(0)
    cli, task = build("sret_transformer_tiny", **overrides)
    cfg = OmegaConf.create({"model": dict(_name="sret_transformer_tiny", **overrides)})
    OmegaConf.set_struct(cfg, True)
    torch.manual_seed(0)
    hydra = fairseq.models.build_model(cfg.model, task)
    assert type(hydra) is type(cli)
    ours, theirs = hydra.state_dict(), cli.state_dict()
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert cfg.model.decoder_recursions == 3 and cfg.model.encoder_groups == "2,1"  # saved in the checkpoint


def test_yaml_values_are_converted_as_argparse_converts_text():
    ns = hydra_namespace(dict(_name="sret_transformer_tiny", encoder_recursions="3", encoder_groups=[2, 1, 1],
                              decoder_groups=2, nll_ratio=1, dropout="0.2"))
    assert (ns.encoder_recursions, ns.encoder_groups, ns.decoder_groups) == (3, "2,1,1", "2")
    assert isinstance(ns.nll_ratio, float) and ns.dropout == 0.2
    # null = not given: the architecture's default, as leaving out the flag
    unset = hydra_namespace(dict(_name="sret_transformer_iwslt_de_en", encoder_embed_dim=None, nll_ratio=None))
    assert (unset.encoder_embed_dim, unset.decoder_embed_dim, unset.nll_ratio) == (512, 512, 1.0)


# The command line's table, through a YAML config. A quoted "3" for an int option is read as
# 3 here, as argparse reads the text 3 (and OmegaConf an int field), so that row does not apply.
HYDRA_INVALID = [(o, m) for o, m in INVALID if o != dict(encoder_recursions="3")]
YAML_ONLY = [
    (dict(encoder_recursion=3), "model.encoder_recursion"),            # misspelt: not ignored
    (dict(encoder_recursion=3), "did you mean model.encoder_recursions"),
    (dict(encoder_recursions="two"), "argument --encoder-recursions (model.encoder_recursions): invalid int value: 'two'"),
    (dict(encoder_recursions=2.5), "--encoder-recursions"),
    (dict(encoder_recursions=True), "--encoder-recursions"),
    (dict(nll_ratio="half"), "--nll-ratio"),
    (dict(no_lrc="yes"), "argument --no-lrc (model.no_lrc): expected true or false"),
    (dict(post_ln=1), "--post-ln"),
    (dict(activation_fn="swish"), "argument --activation-fn (model.activation_fn): invalid choice: 'swish'"),
]


@pytest.mark.parametrize("overrides,message", HYDRA_INVALID + YAML_ONLY,
                         ids=[m for _, m in HYDRA_INVALID] + [m[:40] for _, m in YAML_ONLY])
def test_invalid_yaml_option_fails_at_build_naming_it(overrides, message):
    cfg = OmegaConf.create({"model": dict(dict(_name="sret_transformer", **SMALL), **overrides)})
    OmegaConf.set_struct(cfg, True)
    with pytest.raises(ValueError, match=re.escape(message)):
        fairseq.models.build_model(cfg.model, DummyTask())


# ---------------------------------------------------------------- fairseq-hydra-train
TOY_CONFIG = """
hydra:
  run:
    dir: ${{checkpoint.save_dir}}
  job:
    chdir: false
common:
  user_dir: {user_dir}
  cpu: true
  seed: 1
  log_format: simple
  log_interval: 1
task:
  _name: translation
  data: {data}
model:
  _name: sret_transformer_tiny
  encoder_embed_dim: 32
  decoder_embed_dim: 32
  encoder_ffn_embed_dim: 64
  decoder_ffn_embed_dim: 64
  encoder_recursions: 2
  decoder_recursions: 3
  encoder_groups: [2, 1]
  decoder_groups: "2,1,1"
  share_all_embeddings: true
criterion:
  _name: label_smoothed_cross_entropy
  label_smoothing: 0.1
optimizer:
  _name: adam
lr_scheduler:
  _name: fixed
optimization:
  lr: [0.001]
  max_update: 4
dataset:
  max_tokens: 400
  num_workers: 0
checkpoint:
  save_dir: {save_dir}
  no_epoch_checkpoints: true
"""


@pytest.mark.e2e
def test_fairseq_hydra_train_then_generate(tmp_path):
    data = preprocess(write_corpus(tmp_path / "raw"))
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "toy.yaml").write_text(TOY_CONFIG.format(user_dir=REPO / "fairseq_sret", data=data, save_dir="ckpt"))
    train = subprocess.run([str(Path(sys.executable).parent / "fairseq-hydra-train"), "--config-dir", str(config_dir),
                            "--config-name", "toy", "model.decoder_recursions=3", "+model.nll_ratio=0.25"],
                           cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    checkpoint = tmp_path / "ckpt" / "checkpoint_last.pt"  # relative to the launch directory
    assert "num_updates 4" in train.stdout + train.stderr and (tmp_path / "ckpt" / "hydra_train.log").exists()
    from fairseq_sret.checkpoints import load_checkpoint

    model_cfg = load_checkpoint(checkpoint)["cfg"]["model"]
    assert (model_cfg["decoder_recursions"], model_cfg["encoder_groups"], model_cfg["nll_ratio"]) == (3, "2,1", 0.25)
    out = run("fairseq-generate", data, "--user-dir", REPO / "fairseq_sret", "--path", checkpoint,
              "--gen-subset", "test", "--beam", "2", "--batch-size", "8", "--cpu").stdout
    assert len(re.findall(r"^H-\d+\t", out, flags=re.M)) == 20


@pytest.mark.e2e
def test_fairseq_hydra_train_stops_naming_an_invalid_yaml_option(tmp_path):
    data = preprocess(write_corpus(tmp_path / "raw", sizes=(("train", 20), ("valid", 4), ("test", 4))))
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "toy.yaml").write_text(TOY_CONFIG.format(user_dir=REPO / "fairseq_sret", data=data, save_dir="ckpt"))
    cases = {"model.encoder_recursions=0": "--encoder-recursions must be an integer >= 1, got 0",
             "+model.decoder_recursion=2": "unrecognized model option model.decoder_recursion"}
    for override, message in cases.items():
        train = subprocess.run([str(Path(sys.executable).parent / "fairseq-hydra-train"), "--config-dir", str(config_dir),
                                "--config-name", "toy", override],
                               cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
        log = train.stdout + train.stderr
        assert train.returncode != 0 and message in log, log[-3000:]
        assert "begin training" not in log and not (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


# ---------------------------------------------------------------- the recipes' configs
FAKE_PYTHON = """#!/usr/bin/env bash
# records fairseq-train's arguments; data preparation, evaluation and reports do nothing
if [ "$1" = "-m" ] && [ "$2" = "fairseq_cli.train" ]; then shift 2; printf '%s\\n' "$@" > "$SRET_TRAIN_ARGS_DUMP"; exit 0; fi
if [ "$1" = "-m" ]; then exit 0; fi
if [ "$1" = "-" ]; then cat > /dev/null; exit 0; fi
exec {python} "$@"
"""
RECIPES = {
    # recipe: (environment of its train.sh, the data and checkpoint folders it uses)
    "multi30k": lambda tmp: ({"SRET_RUN_DIR": str(tmp / "run"), "SRET_SKIP_SETUP": "1"},
                             tmp / "run" / "data-bin", tmp / "run" / "checkpoints"),
    "iwslt14": lambda tmp: ({"DATA": str(tmp / "data"), "SAVE_DIR": str(tmp / "ckpt")}, tmp / "data", tmp / "ckpt"),
    "wmt14": lambda tmp: ({"DATA": str(tmp / "data"), "SAVE_DIR": str(tmp / "ckpt")}, tmp / "data", tmp / "ckpt"),
}


# what fairseq-train does not read (generation, scoring, LM evaluation, interactive decoding)
NOT_TRAINING = {"model", "common_eval", "generation", "eval_lm", "interactive", "scoring", "bpe", "tokenizer"}


def train_sh_arguments(recipe, tmp_path):
    """The fairseq-train arguments of ``examples/<recipe>/train.sh`` (run with a python that
    only records them), and the data and checkpoint folders."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env, data, save_dir = RECIPES[recipe](tmp_path)
    dump = tmp_path / "train_args.txt"
    subprocess.run(["bash", str(REPO / "examples" / recipe / "train.sh"), "sret"], check=True, capture_output=True,
                   stdin=subprocess.DEVNULL, timeout=120,
                   env=dict(os.environ, **env, SRET_VENV=str(venv), SRET_TRAIN_ARGS_DUMP=str(dump)))
    return dump.read_text().splitlines(), data, save_dir


@pytest.mark.e2e
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_recipe_config_equals_its_train_sh(recipe, tmp_path):
    from fairseq import options
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    argv, data, save_dir = train_sh_arguments(recipe, tmp_path)
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    cli = convert_namespace_to_omegaconf(args)

    hydra_init("sret")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO / "examples" / recipe / "config"), version_base="1.1"):
            hydra = compose("sret", overrides=[f"task.data={data}", f"checkpoint.save_dir={save_dir}",
                                               f"common.user_dir={REPO / 'fairseq_sret'}"])
    finally:
        GlobalHydra.instance().clear()
    add_defaults(hydra)
    hydra = OmegaConf.create(OmegaConf.to_container(hydra, resolve=True, enum_to_str=True))

    differ = {}
    for group in FairseqConfig.__dataclass_fields__:
        if group in NOT_TRAINING:
            continue
        ours, theirs = (OmegaConf.to_container(c[group], resolve=True) if OmegaConf.is_config(c[group]) else c[group]
                        for c in (hydra, cli))
        if isinstance(theirs, argparse.Namespace):  # not migrated to a dataclass: compare what the config gives
            theirs = {k: getattr(theirs, k) for k in (ours or {})}
        if isinstance(ours, dict) and isinstance(theirs, dict):
            differ.update({f"{group}.{k}": (theirs.get(k), ours.get(k))
                           for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)})
        elif ours != theirs:
            differ[group] = (theirs, ours)
    assert not differ, f"{recipe}: (train.sh, config) differ: {differ}"
    model = OmegaConf.to_container(hydra.model)
    assert model["_name"] == args.arch
    assert_same_options(option_values(cli.model), option_values(hydra_namespace(model)))
