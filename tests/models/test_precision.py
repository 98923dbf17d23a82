"""Reduced precision: bf16 autocast on CPU, the GPU fp16 check in smoke mode.

The GPU run itself (``python -m benchmarks.gpu_checks`` on CUDA: fp16 autocast + GradScaler, 100
updates of the tiny arch) is recorded in docs/benchmarks/translation.md.
"""

import pytest
import torch

from benchmarks import gpu_checks
from conftest import requires_fairseq
from nmt_helpers import SMALL, build


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_softmax_stays_within_half_precision_rounding_under_cpu_autocast(dtype):
    result = gpu_checks.attention_check(torch.device("cpu"), dtype, length=64)
    assert result["ok"], result
    for name in ("plain", "grouped", "causal"):
        assert result[f"module_{name}"]["finite"] and result[f"module_{name}"]["dtype"] == str(dtype)[6:]


def test_gpu_check_script_smoke_on_cpu():
    assert gpu_checks.main(["--device", "cpu", "--updates", "3", "--batch", "4", "--width", "64",
                            "--attention-length", "16"]) == 0


@requires_fairseq
@pytest.mark.parametrize("train", [False, True])
def test_sret_transformer_under_bf16_autocast_is_finite_and_close_to_fp32(train):
    torch.manual_seed(0)
    model, task = build("sret_transformer", **dict(
        SMALL, dropout=0.0, encoder_recursions=3, decoder_recursions=2, encoder_groups="2,4,1",
        decoder_groups="2,1", nll_ratio=0.5, checkpoint_recursions=train))
    model.train(train)
    d = task.source_dictionary
    g = torch.Generator().manual_seed(1)
    src = torch.randint(d.nspecial, len(d), (4, 23), generator=g)
    src[1, :7] = d.pad()
    src[:, -1] = d.eos()
    prev = torch.randint(d.nspecial, len(d), (4, 11), generator=g)
    prev[:, 0] = d.eos()
    lengths = src.ne(d.pad()).sum(1)

    def run(autocast):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(5)  # the same random partitions in both runs
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, _ = model(src, lengths, prev)
            lprobs = torch.log_softmax(logits.float(), dim=-1)
        loss = -lprobs.gather(-1, prev.roll(-1, 1).unsqueeze(-1)).mean()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return logits, lprobs.detach(), loss.item(), grads

    logits16, lprobs16, loss16, grads16 = run(True)
    _, lprobs32, loss32, grads32 = run(False)
    assert logits16.dtype == torch.bfloat16  # autocast really ran the projections in bf16
    assert torch.isfinite(lprobs16).all() and torch.isfinite(grads16).all()
    assert (lprobs16.exp() - lprobs32.exp()).abs().max() < 0.03
    assert abs(loss16 - loss32) < 0.02 * abs(loss32)
    cosine = torch.nn.functional.cosine_similarity(grads16, grads32, dim=0)
    assert cosine > 0.99, cosine
