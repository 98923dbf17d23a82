"""Data recipes for the NMT benchmarks: Multi30k (quick start), IWSLT'14 De-En, WMT'14 En-De.

Each recipe reads the official files (downloaded, or a local folder holding the same
files), reproduces the literature's preprocessing in Python (sacremoses for the Moses
scripts, SentencePiece for subwords) and writes a fairseq data-bin with a joined
dictionary, the text it was built from (``text/``) and ``sret_data.json``, which tells
``sret-evaluate`` how to score the model's output.

Nothing here imports fairseq at module import time; binarisation runs
``fairseq_cli.preprocess`` in a subprocess.
"""
