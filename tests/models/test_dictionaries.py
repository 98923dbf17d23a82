"""The weights of an sret_transformer carry the fingerprints of the dictionaries they were
trained with (the state dict's metadata), so that loading them into a model built for another
data-bin fails - a resumed or fine-tuned training, as generation already does when it builds
the model from the checkpoint (``check_dictionaries``: one check). fairseq-train itself:
``tests/bad_input_cases.py`` (``train-resume-other-dictionary``, ``finetune-other-dictionary``).
"""

import collections

import pytest
import torch

pytest.importorskip("fairseq")

from fairseq_sret.checkpoints import average_checkpoints, load_checkpoint, save_checkpoint
from fairseq_sret_cli.toy import ToyTask, build_model

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = dict(encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_layers=1, decoder_layers=1,
            share_all_embeddings=True)


def other_words(size: int = 12) -> ToyTask:
    """A dictionary of the same size as ``ToyTask(size)``'s, other words."""
    task = ToyTask(0)
    for i in range(size):
        task.source_dictionary.add_symbol(f"x{i}")
    return task


@pytest.mark.reliability("metadata-survives")
def test_weights_refuse_a_model_built_for_another_dictionary(tmp_path):
    trained = build_model("sret_transformer", 12, **TINY)
    path = save_checkpoint({"model": trained.state_dict()}, tmp_path / "checkpoint.pt")
    state = load_checkpoint(path)["model"]  # the fingerprints survive torch.save and the safe load
    assert state._metadata[""]["source_dictionary_fingerprint"] == trained.args.source_dictionary_fingerprint

    same = build_model("sret_transformer", 12, **TINY)
    same.load_state_dict(state)  # the same dictionary: resumes
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), trained.state_dict().values()))
    other = build_model("sret_transformer", task=other_words(12), **TINY)
    assert other.encoder.embed_tokens.weight.shape == trained.encoder.embed_tokens.weight.shape
    with pytest.raises(ValueError, match=r"the data-bin's source dictionary \(16 symbols, fingerprint \w+\) is not the"
                                         r" one the model was trained with .*use the data-bin the model was trained on"):
        other.load_state_dict(state)


def test_weights_without_fingerprints_load_as_before(tmp_path):
    """Checkpoints saved before the fingerprints were recorded and conversions (plain dicts of
    tensors) carry none: nothing to check, averaged or not."""
    trained = build_model("sret_transformer", 12, **TINY)
    other = build_model("sret_transformer", task=other_words(12), **TINY)
    other.load_state_dict(collections.OrderedDict(trained.state_dict()))  # a copy drops the metadata
    paths = [save_checkpoint({"model": collections.OrderedDict(trained.state_dict()),
                              "optimizer_history": [{"num_updates": i}]}, tmp_path / f"checkpoint{i}.pt")
             for i in (1, 2)]
    other.load_state_dict(average_checkpoints(paths)["model"])


@pytest.mark.reliability("metadata-survives")
def test_an_average_keeps_the_fingerprints_and_refuses_other_dictionaries(tmp_path):
    trained = build_model("sret_transformer", 12, **TINY)
    paths = [save_checkpoint({"model": trained.state_dict(), "optimizer_history": [{"num_updates": i}]},
                             tmp_path / f"checkpoint{i}.pt") for i in (1, 2)]
    averaged = average_checkpoints(paths)["model"]
    build_model("sret_transformer", 12, **TINY).load_state_dict(averaged)  # the same dictionary: fine-tunes
    with pytest.raises(ValueError, match="is not the one the model was trained with"):
        build_model("sret_transformer", task=other_words(12), **TINY).load_state_dict(averaged)

    foreign = build_model("sret_transformer", task=other_words(12), **TINY)
    paths.append(save_checkpoint({"model": foreign.state_dict(), "optimizer_history": [{"num_updates": 3}]},
                                 tmp_path / "checkpoint3.pt"))
    with pytest.raises(ValueError, match=r"checkpoint3.pt was trained with other dictionaries than .*checkpoint1.pt"
                                         r" \(source \w+, target \w+ against source \w+, target \w+\)"):
        average_checkpoints(paths)
    with pytest.raises(ValueError, match="checkpoint1.pt: given twice"):
        average_checkpoints([paths[0], paths[1], tmp_path / "." / "checkpoint1.pt"])
