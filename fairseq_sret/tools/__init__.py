"""Tools around the fairseq models that fairseq does not register: building models without
data (:mod:`.toy`), weight conversion from fairseq's transformer (:mod:`.convert`) and
uptraining a trained transformer checkpoint into an SReT one (:mod:`.uptrain`). Importing
them registers the models (they import :mod:`fairseq_sret.models`)."""
