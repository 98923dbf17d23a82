"""``fairseq-train`` that also saves every rank's final parameters (for test_distributed).

Usage: ``python tests/fairseq_train_dump.py OUT_PATTERN <fairseq-train arguments>``;
``OUT_PATTERN`` contains ``{rank}``. fairseq saves checkpoints on rank 0 only, so this is
how the test sees what the other ranks hold after training.
"""

import sys

import torch
from fairseq import trainer as trainer_module

_trainers = []
_init = trainer_module.Trainer.__init__


def _recording_init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    _trainers.append(self)


def main():
    pattern = sys.argv.pop(1)
    trainer_module.Trainer.__init__ = _recording_init
    from fairseq_cli.train import cli_main

    cli_main()
    (trainer,) = _trainers
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    state = {k: v.detach().clone() for k, v in trainer.get_model().state_dict().items()}
    torch.save({"model": state, "num_updates": trainer.get_num_updates()}, pattern.format(rank=rank))


if __name__ == "__main__":
    main()
