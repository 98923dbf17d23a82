"""The Sliced Recursive Transformer for fairseq (``--arch sret_transformer_*``), laid out as
fairseq's ``models/transformer`` package: :mod:`.config` (options, defaults, checks, the
recursion schedules), :mod:`.hydra_config` (a YAML ``model:`` section read as the command
line), :mod:`.layers` (fairseq's layer interface over the core block), :mod:`.model` (the
encoder, decoder and model) and :mod:`.architectures` (the named architectures).
"""

from .config import (  # noqa: F401
    SReTOptions,
    check_checkpoint_recursions,
    check_sret_options,
    record_trained_recursions,
    recursion_schedule,
    sret_base_architecture,
)
from .layers import SReTDecoderLayer, SReTEncoderLayer, build_recursive_block  # noqa: F401
from .model import SReTTransformerDecoder, SReTTransformerEncoder, SReTTransformerModel  # noqa: F401
from .architectures import (  # noqa: F401  (registers the named architectures)
    sret_transformer,
    sret_transformer_iwslt_de_en,
    sret_transformer_tiny,
    sret_transformer_wmt_en_de,
    sret_transformer_wmt_en_de_big,
)
