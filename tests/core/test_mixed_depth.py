"""Mixed-depth training (the paper's explicit deep supervision): the option, the fairseq
criterion and the gradients.

The full-depth loss is the plain label-smoothed criterion's; each shallower loss reaches the
shared weights (and the head) and none of the NLLs its depth skips; one backward of the
mixed loss gives the weighted sum of the depths' gradients.
"""

import pytest
import torch

from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.logging import metrics
from fairseq_sret.core import (
    DepthTerm, DepthWarmup, check_mixed_depth, mixed_depth_loss, parse_depth_warmup, parse_mixed_depth,
)
from fairseq_sret.criterions.mixed_depth import MixedDepthLabelSmoothedCrossEntropy
from test_depth import nmt, sample_batch, tiny_sret


pytestmark = pytest.mark.usefixtures("single_thread")


def test_parse_mixed_depth_forms_and_errors():
    assert parse_mixed_depth("") == () and parse_mixed_depth(None) == ()
    assert parse_mixed_depth("1:0.5") == (DepthTerm((1,), 0.5),)
    assert parse_mixed_depth("1:0.3, 2") == (DepthTerm((1,), 0.3), DepthTerm((2,), 1.0))
    assert parse_mixed_depth("1:0.5,1/2:0.25", sides=2) == (DepthTerm((1, 1), 0.5), DepthTerm((1, 2), 0.25))
    assert [t.label for t in parse_mixed_depth("1,2/1", sides=2)] == ["1", "2_1"]
    bad = {
        "1:": "DEPTH\\[:WEIGHT\\]", ":0.5": "DEPTH\\[:WEIGHT\\]", "a:0.5": "integers", "0:1": ">= 1",
        "1:x": "must be a number", "1:0": "> 0", "1:-1": "> 0", "1:nan": "finite", "1:0.5,1:0.2": "listed twice",
        "1/2": "one depth",
    }
    for value, message in bad.items():
        with pytest.raises(ValueError, match="--mixed-depth.*" + message):
            parse_mixed_depth(value)
    with pytest.raises(ValueError, match="gives 3 depths"):
        parse_mixed_depth("1/1/1", sides=2)
    with pytest.raises(ValueError, match="larger than the 2 recursions the decoder"):
        check_mixed_depth(parse_mixed_depth("1/3", sides=2), (3, 2), sides=("the encoder", "the decoder"))
    with pytest.raises(ValueError, match="full depth"):
        check_mixed_depth(parse_mixed_depth("2"), (2,))
    check_mixed_depth(parse_mixed_depth("2", sides=2), (3, 2))  # shallower in the encoder


# ----------------------------------------------------------------------- criterion
def make_sample(task, **kw):
    src, lengths, prev, target = sample_batch(task, **kw)
    return {
        "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
        "target": target, "ntokens": int(target.ne(task.target_dictionary.pad()).sum()),
    }


def criterion(task, mixed_depth="", depth_warmup=""):
    return MixedDepthLabelSmoothedCrossEntropy(task, sentence_avg=False, label_smoothing=0.1, mixed_depth=mixed_depth,
                                               depth_warmup=depth_warmup)


def test_mixed_depth_off_is_the_plain_criterion_and_on_adds_the_weighted_shallow_losses():
    torch.manual_seed(4)
    model, task = nmt((2, 2), dropout=0.0, encoder_groups="2,1", decoder_groups="2,1",
                      encoder_partition="contiguous,strided", decoder_partition="strided")
    model.train()  # deterministic: no dropout, no random partition
    sample = make_sample(task)
    plain = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    expected, size, log = plain(model, sample)
    off = criterion(task)(model, sample)
    assert torch.equal(off[0], expected) and off[1] == size and off[2] == log

    loss, size_on, log_on = criterion(task, "1:0.5,2/1:0.25")(model, sample)
    with model.at_depth(1, 1):
        depth1 = plain(model, sample)[0]
    with model.at_depth(2, 1):
        depth21 = plain(model, sample)[0]
    assert size_on == size and torch.equal(log_on["nll_loss"], log["nll_loss"])
    assert torch.equal(log_on["loss_depth2"], expected)  # the full-depth loss: the plain criterion's
    assert torch.allclose(log_on["loss_depth1"], depth1) and torch.allclose(log_on["loss_depth2_1"], depth21)
    assert torch.allclose(loss, expected + 0.5 * depth1 + 0.25 * depth21)
    assert model.depth == (2, 2)

    with metrics.aggregate() as agg:
        MixedDepthLabelSmoothedCrossEntropy.reduce_metrics([log_on])
    values = agg.get_smoothed_values()
    assert {"loss", "nll_loss", "ppl", "loss_depth1", "loss_depth2", "loss_depth2_1"} <= set(values)
    assert values["loss_depth2"] == pytest.approx(float(expected) / size / 0.6931471805599453, abs=1e-3)


def test_each_depths_loss_reaches_the_shared_weights_and_not_the_skipped_nlls():
    torch.manual_seed(5)
    model, task = nmt((2, 2), dropout=0.0, encoder_partition="contiguous,strided", decoder_partition="strided")
    model.train()
    sample = make_sample(task)
    plain = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)

    def grads(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}

    with model.at_depth(1, 1):
        shallow = grads(plain(model, sample)[0])
    for side in ("encoder", "decoder"):
        block = f"{side}.layers.0.recursive.layer.ffn.fc1.weight"
        assert shallow[block] is not None and shallow[block].abs().sum() > 0
        assert shallow[f"{side}.layers.1.recursive.nlls.0.mlp.fc1.weight"].abs().sum() > 0
        skipped = [n for n in shallow if f"{side}.layers." in n and ".nlls.1." in n]
        assert skipped and all(shallow[n] is None for n in skipped)
    full = grads(plain(model, sample)[0])
    mixed = grads(criterion(task, "1:0.5")(model, sample)[0])
    for name, g in mixed.items():  # one backward: the sum of both depths' gradients
        expected = full[name] + 0.5 * (shallow[name] if shallow[name] is not None else 0)
        assert torch.allclose(g, expected, atol=1e-5), name


def test_parse_depth_warmup_forms_and_errors():
    assert parse_depth_warmup("") is None and parse_depth_warmup(None) is None
    assert parse_depth_warmup("1:400") == DepthWarmup((1,), 400)
    assert parse_depth_warmup("1/2:30", sides=2) == DepthWarmup((1, 2), 30)
    assert parse_depth_warmup("1:30", sides=2).active(29) and not parse_depth_warmup("1:30", sides=2).active(30)
    for value, message in {"1": "DEPTH:UPDATES", "1:2,2:3": "DEPTH:UPDATES", "1:x": "integer", "1:0": "at least 1",
                           "0:5": ">= 1", ":5": "DEPTH"}.items():
        with pytest.raises(ValueError, match="--depth-warmup.*" + message):
            parse_depth_warmup(value)


def test_depth_warmup_trains_the_shallow_model_until_its_update_then_the_full_one():
    torch.manual_seed(6)
    model, task = nmt((2, 2), dropout=0.0, encoder_partition="contiguous,strided", decoder_partition="strided")
    model.train()  # deterministic: no dropout, no random partition
    sample = make_sample(task)
    plain = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    with model.at_depth(1, 1):
        shallow = plain(model, sample)[0]
    full = plain(model, sample)[0]
    assert not torch.allclose(shallow, full)
    warm = criterion(task, depth_warmup="1:3")
    mixed = criterion(task, "1:0.5", depth_warmup="1:3")
    for updates, expected, expected_mixed in [(0, shallow, shallow), (2, shallow, shallow),
                                              (3, full, full + 0.5 * shallow), (10, full, full + 0.5 * shallow)]:
        model.set_num_updates(updates)  # what fairseq's task does before each training step
        assert torch.allclose(warm(model, sample)[0], expected), updates
        assert torch.allclose(mixed(model, sample)[0], expected_mixed), updates
        assert model.depth == (2, 2)
    model.set_num_updates(0)
    model.eval()  # validation: always the full depth
    with torch.no_grad():
        assert torch.allclose(warm(model, sample)[0], plain(model, sample)[0])
    with pytest.raises(ValueError, match="--depth-warmup.*full depth"):
        criterion(task, depth_warmup="2:3")(model, sample)


def test_mixed_depth_rejects_depths_the_model_does_not_have():
    model, task = nmt((2, 2))
    sample = make_sample(task)
    with pytest.raises(ValueError, match="larger than the 2 recursions the encoder was built with"):
        criterion(task, "3:0.5")(model, sample)
    with pytest.raises(ValueError, match="is the full depth"):
        criterion(task, "2:0.5")(model, sample)
    with pytest.raises(ValueError, match="--mixed-depth"):
        criterion(task, "1:")



# ----------------------------------------------------------------------- vision
def test_vision_shallow_loss_reaches_the_shared_blocks_and_head():
    torch.manual_seed(7)
    model = tiny_sret().train()
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 3])
    with model.at_depth(1):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    named = dict(model.named_parameters())
    for name in ("stages.0.blocks.0.layer.ffn.fc1.weight", "stages.1.blocks.1.layer.self_attn.qkv.weight",
                 "stages.0.blocks.0.nlls.0.mlp.fc1.weight", "head.weight", "stem.0.conv.weight"):
        assert named[name].grad is not None and named[name].grad.abs().sum() > 0, name
    skipped = [n for n in named if ".nlls.1." in n]
    assert skipped and all(named[n].grad is None for n in skipped)


def test_mixed_depth_loss_sums_the_weighted_depths_and_restores_the_depth():
    torch.manual_seed(8)
    model = tiny_sret(recursions=3).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        full = model(x).square().mean()
        total, losses = mixed_depth_loss(model, parse_mixed_depth("1:0.5,2"), full, lambda: model(x).square().mean())
        with model.at_depth(1):
            depth1 = model(x).square().mean()
        with model.at_depth(2):
            depth2 = model(x).square().mean()
    assert list(losses) == ["3", "1", "2"] and model.depth == 3
    assert torch.equal(losses["1"], depth1) and torch.equal(losses["2"], depth2)
    torch.testing.assert_close(total, full + 0.5 * depth1 + depth2)
    nmt_model, _ = nmt((3, 2))
    _, labels = mixed_depth_loss(nmt_model, parse_mixed_depth("1/2", sides=2), full, lambda: full)
    assert list(labels) == ["3_2", "1_2"]
