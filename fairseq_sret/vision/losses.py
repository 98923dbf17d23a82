"""The paper's soft distillation loss (Appendix "Training Details", Distillation Strategy).

``L = -1/N sum_i P_T(z_i) . log P_S(z_i)``: cross-entropy between the teacher's softmax
probabilities and the student's log-probabilities; the one-hot label is not used. Same as
the official ``kd_loss.KDLoss``.
"""

import torch.nn.functional as F
from torch import Tensor, nn


def soft_distillation_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Mean over the batch of ``-sum_k softmax(t/T)_k * log_softmax(s/T)_k``, times ``T^2``.

    student_logits, teacher_logits: (N, K). ``temperature=1`` (the paper) is the plain
    soft cross-entropy; the ``T^2`` factor (Hinton et al.) keeps gradient magnitudes
    comparable for other temperatures. No gradient flows into the teacher.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits"
            f" {tuple(teacher_logits.shape)} differ in shape"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    target = F.softmax(teacher_logits.detach().float() / temperature, dim=-1)
    log_prob = F.log_softmax(student_logits.float() / temperature, dim=-1)
    return -(target * log_prob).sum(dim=-1).mean() * temperature**2


class SoftDistillationLoss(nn.Module):
    def __init__(self, temperature: float = 1.0):
        super().__init__()
        self.temperature = temperature

    def forward(self, student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
        return soft_distillation_loss(student_logits, teacher_logits, self.temperature)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"
