"""The IWSLT'14 and WMT'14 recipes as their READMEs run them, on the real samples in
``../shared/data``: ``sret-prepare`` on a folder shaped like the official download, then
``bash examples/RECIPE/train.sh sret`` with the paper's SReT architecture and settings for
a few updates on the CPU, and its evaluation with the recipe's BLEU flavours.

Bounded: two updates (WMT: one batch each, not eight), a 4K-piece vocabulary, and the
evaluation on a 100-sentence valid set with hypotheses capped at 20 tokens (an untrained
model would otherwise decode to the 200-token limit; the test sets take 6,750 and 3,003
sentences at about 6 sentences/s here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, shared_path
from recipe_sources import iwslt14_source, wmt14_source

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

N_VALID = 100
UPDATES = 2
EVAL_ARGS = "--subset valid --generate-args=--max-len-b=20"


def run(cmd, env, timeout):
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd[:3]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture
def env():
    venv = Path(sys.executable).parents[1]
    return dict(os.environ, SRET_VENV=str(venv), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")


def prepare(recipe, source, data, env, *extra):
    run([sys.executable, "-m", "fairseq_sret_cli.prepare", recipe, "--src", str(source), "--out", str(data),
         "--vocab-size", "4000", *extra], env, timeout=600)
    meta = json.loads((data / "sret_data.json").read_text())
    assert meta["recipe"] == recipe
    return meta


def trained(save_dir: Path):
    """The architecture and update count of ``checkpoint_last.pt``."""
    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    model = state["cfg"]["model"]
    arch = getattr(model, "arch", None) or model.get("_name")
    return arch, state["optimizer_history"][-1]["num_updates"]


def evaluation(save_dir: Path):
    """The recipe's evaluation report of the valid set, and its scores by name."""
    report = json.loads((save_dir / "eval" / "valid.results.json").read_text())
    assert report["sentences"] == len((save_dir / "eval" / "valid.hyp").read_text().splitlines())
    return report, {r["name"]: r for r in report["scores"]}


def test_iwslt14_recipe_prepares_trains_and_scores(tmp_path, env):
    shared = shared_path().resolve()
    source = iwslt14_source(shared, tmp_path / "de-en", N_VALID)
    data, save_dir = tmp_path / "data-bin", tmp_path / "checkpoints"
    meta = prepare("iwslt14", source, data, env)
    assert meta["source_lang"] == "de" and meta["target_lang"] == "en"

    run(["bash", str(REPO / "examples/iwslt14/train.sh"), "sret"],
        dict(env, DATA=str(data), SAVE_DIR=str(save_dir), EXTRA_ARGS=f"--cpu --max-update {UPDATES}",
             EVAL_ARGS=EVAL_ARGS), timeout=900)

    assert trained(save_dir) == ("sret_transformer_iwslt_de_en", UPDATES)
    _, scores = evaluation(save_dir)
    # the valid set is cut from the training text: tokenized references only, so the
    # literature's tokenized BLEU alone (the test set adds the lowercased sacreBLEU)
    assert [name.split(" (")[0] for name in scores] == ["tokenized BLEU"], scores
    assert all(0 <= r["score"] <= 100 for r in scores.values())


def test_wmt14_recipe_prepares_trains_averages_and_scores(tmp_path, env):
    shared = shared_path().resolve()
    source = wmt14_source(shared, tmp_path / "wmt14", n_train=3000, n_dev=N_VALID)
    data, save_dir = tmp_path / "data-bin", tmp_path / "checkpoints"
    meta = prepare("wmt14", source, data, env, "--input-sentence-size", "0")
    assert meta["source_lang"] == "en" and meta["target_lang"] == "de"

    # an update checkpoint after every update, so that the recipe's averaging has two to average
    run(["bash", str(REPO / "examples/wmt14/train.sh"), "sret"],
        dict(env, DATA=str(data), SAVE_DIR=str(save_dir), UPDATE_FREQ="1", MAX_UPDATE=str(UPDATES),
             AVERAGE_LAST="2", EXTRA_ARGS="--cpu --save-interval-updates 1", EVAL_ARGS=EVAL_ARGS), timeout=900)

    assert trained(save_dir) == ("sret_transformer_wmt_en_de", UPDATES)
    assert sorted(p.name for p in save_dir.glob("checkpoint_*_*.pt")) == ["checkpoint_1_1.pt", "checkpoint_1_2.pt"]
    report, scores = evaluation(save_dir)
    # detokenized cased sacreBLEU, compound-split tokenized BLEU, chrF
    assert [name.split(" (")[0] for name in scores] == ["sacreBLEU", "compound-split BLEU", "chrF2"], scores
    assert all("case:mixed" in r["signature"] for r in scores.values())
    assert Path(report["checkpoint"]).name == "checkpoint.avg2.pt"  # the average of the two update checkpoints
    assert all(0 <= r["score"] <= 100 for r in scores.values())
