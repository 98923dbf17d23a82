"""Data-parallel training through fairseq's own launcher, 2 CPU processes, gloo.

Every shared layer is applied twice per step (and recomputed once more with
``--checkpoint-recursions``); with fairseq's default DDP backend and no extra flag, both
ranks must end with the same parameters, equal to the checkpoint rank 0 writes.
"""

import subprocess
import sys

import pytest
import torch

from cli_helpers import ENV, REPO, SRET, TRAIN, free_port, preprocess, write_corpus

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return preprocess(write_corpus(tmp_path_factory.mktemp("ddp")))


MIXED_DEPTH = ["--criterion", "sret_mixed_depth_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--mixed-depth", "1:0.5"]


@pytest.mark.parametrize("criterion", ["plain", "mixed_depth"])
def test_two_rank_gloo_training_keeps_shared_weights_identical(data_bin, tmp_path, criterion):
    # mixed depth: the depth-1 pass bypasses the DDP wrapper (one forward per backward);
    # its gradients must still be reduced, or the ranks' weights would drift apart
    save = tmp_path / "ckpt"
    dump = tmp_path / "rank{rank}.pt"
    common = [
        sys.executable, REPO / "tests" / "fairseq_train_dump.py", dump, data_bin, *SRET, *TRAIN,
        "--encoder-partition", "random", "--decoder-partition", "strided,random",
        "--checkpoint-recursions", "--max-update", "4", "--save-dir", save,
        *(MIXED_DEPTH if criterion == "mixed_depth" else []),
        "--distributed-world-size", "2", "--distributed-backend", "gloo",
        "--distributed-no-spawn", "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}",
    ]
    ranks = [
        subprocess.Popen([*map(str, common), "--distributed-rank", str(rank)], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)
    ]
    logs = []
    try:
        for proc in ranks:
            logs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
    for rank, (proc, log) in enumerate(zip(ranks, logs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{log[-4000:]}"
    assert "ddp_backend='pytorch_ddp'" in logs[0] and "find_unused_parameters=False" in logs[0]
    assert "num_updates=4" in logs[0]
    assert ("loss_depth1=" in logs[0]) == (criterion == "mixed_depth")

    states = [torch.load(str(dump).format(rank=r)) for r in (0, 1)]
    assert [s["num_updates"] for s in states] == [4, 4]
    first, second = (s["model"] for s in states)
    assert first.keys() == second.keys()
    differing = [k for k in first if not torch.equal(first[k], second[k])]
    assert not differing, differing[:5]
    saved = torch.load(save / "checkpoint_last.pt", weights_only=False)["model"]
    assert all(torch.equal(saved[k], first[k]) for k in saved)
    # the shared layer and the per-recursion NLLs are there and were trained
    assert any(".recursive.layer." in k for k in first) and any(".recursive.nlls." in k for k in first)
    assert any(k.endswith("skip_scale") and not torch.equal(v, torch.ones(1)) for k, v in first.items())
