"""fairseq's token positions for the transformers port: the numbering (the i-th real token of a
row at ``padding_idx + i``, whichever side the padding is on) and its embedding, sinusoidal or
learned, computed as fairseq computes them."""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def sinusoidal_table(rows: int, dim: int, padding_idx: int) -> Tensor:
    """fairseq's sinusoidal positions (tensor2tensor's layout: the sines of all frequencies, then
    the cosines), one row per position number; the row ``padding_idx`` (the number of padding
    tokens) is zero. (rows, dim), float32."""
    half = dim // 2
    log_step = math.log(10000) / (half - 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.float) * -log_step)
    angles = torch.arange(rows, dtype=torch.float).unsqueeze(1) * frequencies.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).view(rows, -1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    table[padding_idx] = 0
    return table


def position_numbers(padding: Tensor, padding_idx: int) -> Tensor:
    """fairseq's position numbers: the i-th real token (1-based) of a row is at ``padding_idx + i``,
    padding at ``padding_idx``, whichever side the padding is on. padding: (B, T) bool -> (B, T) long."""
    real = (~padding).long()
    return torch.cumsum(real, dim=1) * real + padding_idx


class PositionalEmbedding(nn.Module):
    """Embeddings of fairseq's position numbers (:func:`position_numbers`), a table of
    ``max_positions + padding_idx + 1`` rows: learned (``weight``, saved) or sinusoidal
    (``table``, computed, never saved; grown like fairseq's for longer inputs)."""

    def __init__(self, max_positions: int, dim: int, padding_idx: int, learned: bool):
        super().__init__()
        self.dim, self.padding_idx, self.learned = dim, padding_idx, learned
        rows = max_positions + padding_idx + 1
        if learned:
            self.weight = nn.Parameter(torch.empty(rows, dim))
            nn.init.normal_(self.weight, std=dim**-0.5)
            with torch.no_grad():
                self.weight[padding_idx].zero_()
        else:
            self.register_buffer("table", sinusoidal_table(rows, dim, padding_idx), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        """positions: (B, T) long -> (B, T, dim)"""
        if self.learned:
            return F.embedding(positions, self.weight, self.padding_idx)
        needed = int(positions.max()) + 1
        if needed > self.table.size(0):
            self.table = sinusoidal_table(needed, self.dim, self.padding_idx).to(self.table)
        return self.table.index_select(0, positions.reshape(-1)).view(*positions.shape, -1)
