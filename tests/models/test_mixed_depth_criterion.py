"""The mixed-depth fairseq criterion (sret_mixed_depth_label_smoothed_cross_entropy): the
full-depth loss is the plain label-smoothed criterion's; each shallower loss reaches the
shared weights and none of the NLLs its depth skips; one backward of the mixed loss gives the
weighted sum of the depths' gradients; depth warm-up; its metrics.
"""

import pytest
import torch

pytest.importorskip("fairseq")

from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion  # noqa: E402
from fairseq.logging import metrics  # noqa: E402
from fairseq_sret.core import mixed_depth_loss, parse_mixed_depth  # noqa: E402
from fairseq_sret.criterions.mixed_depth import MixedDepthLabelSmoothedCrossEntropy  # noqa: E402
from test_depth import nmt, sample_batch  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")


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



def test_mixed_depth_labels_name_each_sides_depth():
    nmt_model, _ = nmt((3, 2))
    full = torch.tensor(1.0)
    _, labels = mixed_depth_loss(nmt_model, parse_mixed_depth("1/2", sides=2), full, lambda: full)
    assert list(labels) == ["3_2", "1_2"]
