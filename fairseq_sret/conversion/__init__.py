"""Converting fairseq models that fairseq does not register: weights of fairseq's transformer
as an SReT model (:mod:`.convert`) and uptraining a trained transformer checkpoint into an
SReT one (:mod:`.uptraining`). Importing them registers the models (they import
:mod:`fairseq_sret.models`). :mod:`.ctranslate2_spec` writes SReT models as CTranslate2
Transformer specifications (``sret-export-ct2``); it imports neither fairseq nor the models."""
