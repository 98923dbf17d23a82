"""What the transformers port adds to ``generate()``: the checks of its settings, and fairseq's
end of a hypothesis at the length limit (:class:`EndAtLengthLimit`)."""

import math
from numbers import Integral, Real
from typing import Optional

import torch
from transformers import LogitsProcessor


#: generate()'s integer settings and the least value each takes
GENERATION_COUNTS = {"num_beams": 1, "num_return_sequences": 1, "max_new_tokens": 1, "max_length": 1,
                     "min_new_tokens": 0, "min_length": 0, "top_k": 0, "no_repeat_ngram_size": 0,
                     "encoder_no_repeat_ngram_size": 0, "num_beam_groups": 1}
#: generate()'s real settings: (least, whether the least is excluded, most or None)
GENERATION_NUMBERS = {"length_penalty": (-math.inf, True, None), "temperature": (0.0, True, None),
                      "top_p": (0.0, True, 1.0), "repetition_penalty": (0.0, True, None)}


def check_generation_values(kwargs: dict, config) -> None:
    """One line naming the setting, not an error from inside the search, for a generate() setting
    (given, or in the generation configuration) of the wrong type or out of range
    (``num_beams=0``, ``max_new_tokens=2.5``, ``length_penalty=nan``)."""
    for name, least in GENERATION_COUNTS.items():
        value = kwargs.get(name, getattr(config, name, None))
        if value is not None and (isinstance(value, bool) or not isinstance(value, Integral) or value < least):
            raise ValueError(f"generate(): {name} must be an integer >= {least}, got {value!r}")
    for name, (least, open_least, most) in GENERATION_NUMBERS.items():
        value = kwargs.get(name, getattr(config, name, None))
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value)
                or value < least or (open_least and value == least) or (most is not None and value > most)):
            bounds = f" {'>' if open_least else '>='} {least}" if math.isfinite(least) else ""
            raise ValueError(f"generate(): {name} must be a finite number{bounds}{f' and <= {most}' if most else ''},"
                             f" got {value!r}")


class EndAtLengthLimit(LogitsProcessor):
    """fairseq's end of a hypothesis at the length limit: the last token the limit allows
    (``max_new_tokens``, else ``max_length`` counted with the decoder prompt) can only be ``</s>``,
    which keeps its log-probability (transformers' ``forced_eos_token_id`` sets it to 0, which
    changes the scores and the ranking of the hypotheses that reach the limit).

    One instance per ``generate()`` call: the first call sees the prompt and fixes the step."""

    def __init__(self, eos_token_id: int, max_new_tokens: Optional[int], max_length: Optional[int]):
        self.eos_token_id, self.max_new_tokens, self.max_length = eos_token_id, max_new_tokens, max_length
        self.last_length: Optional[int] = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.last_length is None:
            prompt = input_ids.shape[-1]
            self.last_length = prompt + self.max_new_tokens - 1 if self.max_new_tokens is not None else self.max_length - 1
        if input_ids.shape[-1] < self.last_length:
            return scores
        eos = scores[:, self.eos_token_id].clone()
        scores = torch.full_like(scores, -math.inf)
        scores[:, self.eos_token_id] = eos
        return scores
