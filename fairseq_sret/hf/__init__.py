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



def _hide_unimportable_torchaudio() -> None:
    """transformers judges torchaudio by its installed package and imports it with its pipelines
    and audio helpers. fairseq-fixed (the fairseq this project uses) requires torchaudio, whose
    PyPI wheels are built against a CUDA torch: beside a CPU-only torch it is installed but
    fails to import, and so would every transformers pipeline. When torchaudio cannot be
    imported, transformers is told it is absent (nothing here uses audio)."""
    import importlib.util

    if importlib.util.find_spec("torchaudio") is None:
        return
    try:
        import torchaudio  # noqa: F401
    except (ImportError, OSError):
        import transformers.utils
        import transformers.utils.import_utils

        def unavailable() -> bool:
            return False

        transformers.utils.is_torchaudio_available = unavailable
        transformers.utils.import_utils.is_torchaudio_available = unavailable


_hide_unimportable_torchaudio()

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
