"""The Sliced Recursive Transformer for fairseq (``--arch sret_transformer_*``), laid out as
fairseq's ``models/transformer`` package: :mod:`.options` (the options and their defaults),
:mod:`.spec` (the options read into the core's typed spec, one side at a time, with every check),
:mod:`.trained_depth` (depth on demand across checkpoints), :mod:`.dictionaries` (the
trained dictionaries' fingerprints), :mod:`.hydra_config` (a YAML ``model:`` section read as
the command line), :mod:`.layers` (fairseq's layer interface over the core layer),
:mod:`.model` (the encoder, decoder and model) and :mod:`.architectures` (the named
architectures).
"""

from .options import SReTOptions, sret_base_architecture  # noqa: F401
from .spec import check_sret_options, read_side_spec, read_spec, recursion_schedule  # noqa: F401
from .trained_depth import check_checkpoint_recursions, upgrade_depth_options  # noqa: F401
from .layers import SReTDecoderLayer, SReTEncoderLayer  # noqa: F401
from .model import SReTHubInterface, SReTTransformerDecoder, SReTTransformerEncoder, SReTTransformerModel  # noqa: F401
from .architectures import (  # noqa: F401  (registers the named architectures)
    sret_transformer,
    sret_transformer_iwslt_de_en,
    sret_transformer_tiny,
    sret_transformer_wmt_en_de,
    sret_transformer_wmt_en_de_big,
)
