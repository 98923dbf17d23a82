"""fairseq-sret: the Sliced Recursive Transformer (SReT, Shen, Liu, Xing, ECCV 2022).

``fairseq_sret.core`` and ``fairseq_sret.vision`` are pure PyTorch; importing this package
imports neither fairseq nor anything that changes it. The translation models register with
fairseq when fairseq loads the plugin (``--user-dir fairseq_sret``) or on an explicit
``import fairseq_sret.models``.
"""

__version__ = "0.1.0"
