"""fairseq's hub interface of sret_transformer (``SReTTransformerModel.from_pretrained``)
refuses a search it would run without a word otherwise."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("fairseq")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))

from test_modeling import make_data_bin  # noqa: E402

from fairseq_sret.models.sret_transformer import SReTTransformerModel  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    import torch
    from fairseq import options, tasks

    root = tmp_path_factory.mktemp("hub")
    data_bin = make_data_bin(root)
    # a checkpoint as fairseq-train saves it: the full training namespace (the hub reads all of it)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data_bin), "--arch", "sret_transformer",
        "--task", "translation", "-s", "de", "-t", "en", "--optimizer", "adam", "--lr", "0.001",
        "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "48",
        "--decoder-ffn-embed-dim", "48", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
        "--encoder-layers", "1", "--decoder-layers", "1", "--share-all-embeddings"])
    model = tasks.setup_task(args).build_model(args)
    torch.save({"args": args, "model": model.state_dict(), "extra_state": {},
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                       "lr_scheduler_state": {}, "num_updates": 0}]}, root / "checkpoint.pt")
    return SReTTransformerModel.from_pretrained(
        str(root), checkpoint_file="checkpoint.pt", data_name_or_path=str(data_bin), source_lang="de",
        target_lang="en", bpe="sentencepiece", sentencepiece_model=str(data_bin / "spm.model")).eval()


@pytest.mark.parametrize("beam", [0, -1, 2.5, True, "5"])
@pytest.mark.reliability("one-line-errors")
def test_the_hub_refuses_a_beam_it_cannot_search_with(hub, beam):
    for call in (lambda: hub.translate("Hund läuft.", beam=beam), lambda: hub.sample(["Hund läuft."], beam=beam)):
        with pytest.raises(ValueError) as error:
            call()
        assert str(error.value) == f"beam must be an integer >= 1 (1: greedy), got {beam!r}"


def test_the_hub_translates_with_a_beam_it_can_search_with(hub):
    from fairseq_sret.models.sret_transformer import SReTHubInterface

    assert isinstance(hub, SReTHubInterface)
    for beam in (1, 2):
        assert isinstance(hub.translate("Hund läuft.", beam=beam, max_len_b=5), str)
