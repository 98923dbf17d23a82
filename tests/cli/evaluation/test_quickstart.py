"""scripts/quickstart.sh end to end on a tiny Multi30k cut (a few updates of a tiny SReT
model, checkpoint averaging, sacreBLEU on the test set) -- the pipeline, not the quality."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_sret_cli.data.io import read_lines, write_lines

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]


def test_quickstart_runs_end_to_end(shared_dir, tmp_path):
    raw = shared_dir / "data/multi30k/raw"
    data = tmp_path / "multi30k"
    for lang in ("de", "en"):
        write_lines(data / f"train.{lang}", read_lines(raw / f"train.{lang}")[:600])
        write_lines(data / f"val.{lang}", read_lines(raw / f"val.{lang}")[:40])
        write_lines(data / f"test_2016_flickr.{lang}", read_lines(raw / f"test_2016_flickr.{lang}")[:30])
    small = ("--encoder-embed-dim 32 --decoder-embed-dim 32 --encoder-ffn-embed-dim 64 "
             "--decoder-ffn-embed-dim 64 --encoder-attention-heads 2 --decoder-attention-heads 2")
    env = dict(
        os.environ, SRET_VENV=str(Path(sys.executable).parents[1]), SRET_SKIP_SETUP="1", OMP_NUM_THREADS="1",
        SRET_MODEL_ARGS=small, SRET_MAX_UPDATE="40", SRET_MAX_TOKENS="2048", SRET_VOCAB="300",
        SRET_AVERAGE_LAST="2", SRET_BEAM="2", SRET_EVAL_ARGS="--max-len-b 5",
    )
    env.pop("SRET_DATA_MULTI30K", None)
    run_dir = tmp_path / "run"
    result = subprocess.run(["bash", str(REPO / "scripts/quickstart.sh"), "--data", str(data), "--run-dir", str(run_dir)],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert re.search(r"==> sacreBLEU de-en on test_2016_flickr: \d+\.\d\d", out), out[-2000:]
    model = Path(re.search(r"==> trained model: (\S+)", out).group(1))
    assert model == run_dir.resolve() / "checkpoints" / "checkpoint.avg2.pt" and model.is_file()
    assert "[quickstart] training sret_transformer_tiny for 40 updates" in out
    assert "[quickstart] update 40/40 (100%)" in out and "[quickstart] epoch 3: valid loss" in out
    assert (run_dir / "eval/test.results.json").is_file() and (run_dir / "train.log").is_file()
    assert (run_dir / "data-bin/sret_data.json").is_file()
