"""The one training loop of the vision commands (fairseq_sret_cli.vision_trainer)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_sret_cli.vision_trainer import Diverged, Objective, Trainer, check_finite
from fairseq_sret_cli.vision_trainer.schedules import WarmupCosine, cosine_lr

pytestmark = pytest.mark.usefixtures("single_thread")


class StepSchedule:
    """A scheduler of timm's interface whose rate is a function of the update number."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step_update(self, num_updates):
        for group in self.optimizer.param_groups:
            group["lr"] = 0.1 / (1 + num_updates)


class Ema:
    """timm's EMA interface: ``update(model, step=...)``; a running mean of the weights."""

    def __init__(self, model, decay=0.5):
        self.weights, self.decay, self.steps = [p.detach().clone() for p in model.parameters()], decay, []

    def update(self, model, step):
        self.steps.append(step)
        for mean, p in zip(self.weights, model.parameters()):
            mean.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)


def batches(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 5, generator=g), torch.randint(0, 3, (4,), generator=g), None) for _ in range(n)]


def test_an_epoch_is_the_hand_written_loop_bit_for_bit():
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    reference = nn.Linear(5, 3)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    ema = Ema(model)
    trainer = Trainer(model, optimizer, StepSchedule(optimizer), Objective(model, smoothing=0.1), 2, ema=ema,
                      clip_grad=0.5)
    totals = trainer.train_epoch(1, batches())

    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=0.1)
    ref_ema = Ema(reference)
    losses, lrs = [], []
    for step, (x, target, _) in enumerate(batches()[:2]):  # steps_per_epoch stops the epoch after 2
        loss = F.cross_entropy(reference(x), target, label_smoothing=0.1)
        lrs.append(ref_optimizer.param_groups[0]["lr"])
        ref_optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        ref_optimizer.step()
        for group in ref_optimizer.param_groups:
            group["lr"] = 0.1 / (1 + 2 + step + 1)  # the rate of the next update, set after this one
        ref_ema.update(reference, step=2 + step)
        losses.append(loss.item() * 4)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
    assert all(torch.equal(a, b) for a, b in zip(ema.weights, ref_ema.weights)) and ema.steps == [2, 3]
    assert totals.sums == {"loss": losses[0] + losses[1]} and totals.seen == 8
    assert totals.lr_last == lrs[-1] and totals.lr_next == 0.1 / 5


def test_a_loss_that_is_not_finite_stops_the_epoch_before_any_update():
    model = nn.Linear(5, 3)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    nan = [(torch.full((4, 5), math.nan), torch.zeros(4, dtype=torch.long), None)]
    trainer = Trainer(model, optimizer, StepSchedule(optimizer), Objective(model), 5)
    with pytest.raises(Diverged, match="the loss is nan at epoch 3 step 0"):
        trainer.train_epoch(3, nan)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    with torch.no_grad():
        model.weight[0, 0] = math.inf
    with pytest.raises(Diverged, match="the weight weight is not finite after epoch 1"):
        check_finite(model, {}, "epoch 1")
    with pytest.raises(Diverged, match="val_loss is inf after epoch 2"):
        check_finite(nn.Linear(1, 1), {"val_loss": math.inf, "val_acc1": 50.0}, "epoch 2")


def test_soft_targets_and_distillation_replace_the_label():
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    x, target = torch.randn(4, 5), torch.randint(0, 3, (4,))
    mixed = F.one_hot(target, 3).float() * 0.7 + 0.1
    soft = Objective(model, soft_target_loss=lambda logits, t: -(t * logits.log_softmax(-1)).sum(-1).mean())
    assert torch.equal(soft(x, mixed)["loss"], -(mixed * model(x).log_softmax(-1)).sum(-1).mean())
    teacher_logits = torch.randn(10, 3)
    index = torch.tensor([7, 1, 3, 0])
    distilled = Objective(model, teacher_logits=teacher_logits, temperature=2.0)(x, target, index)["loss"]
    t = 2.0
    expected = -(F.softmax(teacher_logits[index] / t, 1) * F.log_softmax(model(x) / t, 1)).sum(1).mean() * t * t
    assert torch.allclose(distilled, expected, atol=1e-6)


def test_warmup_cosine_steps_like_a_timm_scheduler():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-3)
    schedule = WarmupCosine(optimizer, epochs=4, steps_per_epoch=5, lr=1e-3, min_lr=1e-5, warmup_lr=1e-6,
                            warmup_epochs=1.5)
    assert optimizer.param_groups[0]["lr"] == 1e-6  # the first update's, set when it is made
    for n in range(21):
        schedule.step_update(n)
        assert optimizer.param_groups[0]["lr"] == cosine_lr(n, 20, 1e-3, 8, 1e-5, 1e-6)
