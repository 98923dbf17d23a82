"""SReT translation models for Hugging Face transformers (``pip install 'fairseq-sret[hf]'``).

``import fairseq_sret.hf`` registers the model type ``sret_transformer`` with transformers'
Auto classes and the pipeline task ``sret-translation``, so a folder written by
``sret-export-hf`` loads without fairseq::

    import fairseq_sret.hf
    from transformers import pipeline
    translate = pipeline("sret-translation", model="exported/")
    translate("Ein Mann fährt Fahrrad.")   # [{"translation_text": "A man rides a bicycle."}]

or with ``AutoModelForSeq2SeqLM.from_pretrained(dir)`` / ``AutoTokenizer.from_pretrained(dir)``
and ``model.generate()``. Nothing here imports fairseq; :mod:`fairseq_sret.hf.convert` reads
fairseq checkpoints with :mod:`fairseq_sret.checkpoints`.
"""

try:
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        f"fairseq_sret.hf needs Hugging Face transformers ({exc}); install it with: pip install 'fairseq-sret[hf]'"
    ) from exc

from .transformers_patches import apply_patches  # noqa: E402

apply_patches()  # before transformers' pipelines are imported

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: E402
from transformers.pipelines import PIPELINE_REGISTRY  # noqa: E402

from .configuration import SReTConfig  # noqa: E402
from .modeling import SReTCache, SReTForConditionalGeneration, SReTModel, SReTPreTrainedModel  # noqa: E402
from .pipeline import TASK, SReTTranslationPipeline  # noqa: E402
from .tokenization import SReTTokenizer  # noqa: E402

AutoConfig.register(SReTConfig.model_type, SReTConfig, exist_ok=True)
AutoModel.register(SReTConfig, SReTModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(SReTConfig, SReTForConditionalGeneration, exist_ok=True)
AutoTokenizer.register(SReTConfig, tokenizer_class=SReTTokenizer, exist_ok=True)
PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=SReTTranslationPipeline, pt_model=AutoModelForSeq2SeqLM)

__all__ = [
    "SReTCache",
    "SReTConfig",
    "SReTForConditionalGeneration",
    "SReTModel",
    "SReTPreTrainedModel",
    "SReTTokenizer",
    "SReTTranslationPipeline",
]
