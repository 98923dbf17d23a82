"""The user commands of fairseq-sret, installed as console entry points by ``setup.py``.

Each is also runnable as ``python -m fairseq_sret.cli.<module>``:

======================================  =========================================
command                                 module
======================================  =========================================
``sret-prepare multi30k|iwslt14|wmt14`` :mod:`fairseq_sret.cli.prepare`
``sret-evaluate``                       :mod:`fairseq_sret.cli.evaluate`
``sret-average-checkpoints``            :mod:`fairseq_sret.cli.average_checkpoints`
``sret-plot-lrc``                       :mod:`fairseq_sret.cli.plot_lrc`
``sret-train-vision``                   :mod:`fairseq_sret.cli.train_vision`
``sret-count vision|nmt``               :mod:`fairseq_sret.cli.count`
``sret-toy-data``                       :mod:`fairseq_sret.toy_data`
``sret-uptrain``                        :mod:`fairseq_sret.cli.uptrain`
======================================  =========================================
"""

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks (its examples)."""
