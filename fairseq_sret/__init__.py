"""fairseq-sret: the Sliced Recursive Transformer (SReT, Shen, Liu, Xing, ECCV 2022).

``fairseq_sret.core`` and ``fairseq_sret.vision`` are pure PyTorch; importing this package
imports neither fairseq nor anything that changes it. The translation models register with
fairseq when fairseq loads the plugin (``--user-dir fairseq_sret``) or on an explicit
``import fairseq_sret.models``. The commands, data preparation, evaluation and the
experiment runner live beside this package, in ``fairseq_sret_cli``, which imports it (never
the other way).
"""

from pathlib import Path

__version__ = "0.1.0"

#: this package's folder: what fairseq's ``--user-dir`` takes to load the plugin
USER_DIR = Path(__file__).resolve().parent
