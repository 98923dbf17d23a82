"""``pipeline("sret-translation", model=DIR)``: raw source text in, translations out.

transformers 5 removed its ``translation`` pipeline task (and refuses the name), so
``import fairseq_sret.hf`` registers this small pipeline under its own task name: the
tokenizer of the model folder encodes each text, ``generate()`` translates with the folder's
generation settings (fairseq-generate's beam search) and the target pieces are joined back
into text.
"""

import os
from typing import Any, Dict, List

from transformers import Pipeline

from .modeling import check_exported_files

TASK = "sret-translation"


class SReTTranslationPipeline(Pipeline):
    """``translate("Ein Hund läuft.")`` -> ``[{"translation_text": "A dog runs."}]``; a list of
    texts gives one such list per text. Keyword arguments are ``generate()``'s (``num_beams=1``,
    ``decoder_depth=1``, ...)."""

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _pipeline_calls_generate = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        folder = os.path.normpath(getattr(self.model, "name_or_path", "") or ".")
        if getattr(self.model, "name_or_path", "") and os.path.isdir(folder):  # the model's own check, which transformers' loader would bury
            check_exported_files(folder, self.model.config)

    def __call__(self, inputs, *args, **kwargs):
        """A list of texts is translated in order of length, as fairseq batches sentences, so
        that a batch (``batch_size=N``) pads little and ends together; the results come back
        in the order of ``inputs``; no texts, no translations."""
        if isinstance(inputs, (list, tuple)) and not inputs:
            return []
        if not isinstance(inputs, (list, tuple)) or len(inputs) < 2 or not all(isinstance(t, str) for t in inputs):
            return super().__call__(inputs, *args, **kwargs)
        lengths = [len(ids) for ids in self.tokenizer(list(inputs))["input_ids"]]
        order = sorted(range(len(inputs)), key=lengths.__getitem__)
        translated = super().__call__([inputs[i] for i in order], *args, **kwargs)
        results = [None] * len(inputs)
        for i, result in zip(order, translated):
            results[i] = result
        return results

    def _sanitize_parameters(self, **generate_kwargs):
        return {}, generate_kwargs, {}

    def preprocess(self, text: str) -> Dict[str, Any]:
        if not isinstance(text, str):
            raise TypeError(f"{TASK} translates text (str), got {type(text).__name__}")
        return self.tokenizer(text, return_tensors="pt")

    def _forward(self, inputs: Dict[str, Any], **generate_kwargs) -> Dict[str, Any]:
        return {"output_ids": self.model.generate(**inputs, **self._prepare_generate_kwargs(generate_kwargs))}

    def postprocess(self, outputs: Dict[str, Any]) -> List[Dict[str, str]]:
        return [{"translation_text": self.tokenizer.decode(ids, skip_special_tokens=True)} for ids in outputs["output_ids"]]
