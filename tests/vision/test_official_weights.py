"""Official SReT checkpoints: key mapping and logit equivalence.

Uses ../shared/fixtures/sret_official (official-format SReT-T checkpoint with random
weights, the official implementation's eval logits for it, and the official key lists).
"""

import json

import pytest
import torch

from fairseq_sret.vision import convert_official_state_dict, create_model, load_checkpoint, save_checkpoint
from fairseq_sret.vision.sret import resize_pos_embed


pytestmark = pytest.mark.usefixtures("single_thread")


FIXTURE = "fixtures/sret_official"
# First application: contiguous groups [8, 4, 1]; second application: one group.
CONTIGUOUS_THEN_GLOBAL = ((8, 1), (4, 1), (1, 1))
GLOBAL = ((1, 1), (1, 1), (1, 1))


@pytest.fixture
def official(shared_dir):
    folder = shared_dir / FIXTURE
    if not folder.is_dir():
        pytest.skip(f"{folder} not present")
    return folder


@pytest.fixture
def official_io(official):
    return torch.load(official / "SReT_T_io.pt", map_location="cpu", weights_only=False)


@pytest.mark.parametrize("groups,key", [(GLOBAL, "logits_noslice"), (CONTIGUOUS_THEN_GLOBAL, "logits_contiguous")])
def test_reproduces_official_logits(official, official_io, groups, key):
    model = create_model("sret_t", groups=groups).eval()
    load_checkpoint(model, official / "SReT_T_random.pth")
    with torch.no_grad():
        logits = model(official_io["input"])
    assert (logits - official_io[key]).abs().max().item() <= 1e-6


def test_loaded_lrc_coefficients_are_in_the_right_places(official):
    raw = torch.load(official / "SReT_T_random.pth", map_location="cpu", weights_only=True)["model"]
    model = load_checkpoint(create_model("sret_t"), official / "SReT_T_random.pth")
    rec = model.stages[1].blocks[2]  # official entries 8..11 of stage 1
    block = "transformers.1.blocks.8."
    assert rec.layer.self_attn_residual.skip_scale.item() == raw[block + "coefficient1.bias"].item()
    assert rec.layer.self_attn_residual.branch_scale.item() == raw[block + "coefficient2.bias"].item()
    assert rec.layer.ffn_residual.skip_scale.item() == raw[block + "coefficient3.bias"].item()
    assert rec.layer.ffn_residual.branch_scale.item() == raw[block + "coefficient4.bias"].item()
    assert rec.nlls[1].residual.skip_scale.item() == raw["transformers.1.blocks.11.coefficient1.bias"].item()
    assert rec.nlls[1].residual.branch_scale.item() == raw["transformers.1.blocks.11.coefficient2.bias"].item()
    # the randomised coefficients really differ, so a swapped mapping would show
    assert raw[block + "coefficient1.bias"].item() != raw[block + "coefficient2.bias"].item()
    assert torch.equal(model.stages[0].blocks[1].layer.self_attn.out_proj.weight, raw["transformers.0.blocks.6.attn.proj.weight"])
    assert torch.equal(model.stem[1].norm.running_var, raw["patch_embed.bn2.running_var"])


@pytest.mark.parametrize("official_name,ours", [("T", "sret_t"), ("LT", "sret_tl"), ("S", "sret_s")])
def test_official_key_lists_map_completely(official, official_name, ours):
    shapes = json.loads((official / f"keys_SReT_{official_name}.json").read_text())
    model = create_model(ours)
    # zeros: the copies of a shared block are equal, as in a real checkpoint
    converted = convert_official_state_dict({k: torch.zeros(s) for k, s in shapes.items()}, model)
    own = model.state_dict()
    assert set(converted) == set(own)
    assert all(tuple(converted[k].shape) == tuple(own[k].shape) for k in own)


def test_inconsistent_shared_block_copies_are_rejected(official):
    raw = torch.load(official / "SReT_T_random.pth", map_location="cpu", weights_only=True)
    raw["model"]["transformers.0.blocks.2.attn.qkv.weight"] = raw["model"]["transformers.0.blocks.2.attn.qkv.weight"] + 1
    with pytest.raises(ValueError, match="shared block"):
        load_checkpoint(create_model("sret_t"), raw)


def test_unexpected_official_keys_are_rejected(official):
    raw = torch.load(official / "SReT_T_random.pth", map_location="cpu", weights_only=True)["model"]
    extra = dict(raw, **{"transformers.0.blocks.8.norm1.weight": torch.zeros(64)})
    with pytest.raises(KeyError, match="shared blocks"):
        convert_official_state_dict(extra, create_model("sret_t"))
    with pytest.raises(KeyError, match="unexpected official key"):
        convert_official_state_dict(dict(raw, **{"transformers.0.blocks.0.gamma": torch.zeros(1)}), create_model("sret_t"))


def test_loading_at_384_interpolates_position_embedding(official):
    raw = torch.load(official / "SReT_T_random.pth", map_location="cpu", weights_only=True)["model"]
    model = load_checkpoint(create_model("sret_t", img_size=384).eval(), official / "SReT_T_random.pth")
    assert model.pos_embed.shape == (1, 64, 48, 48)
    assert torch.allclose(model.pos_embed, resize_pos_embed(raw["pos_embed"], (48, 48)))
    assert torch.equal(model.head.weight, raw["head.weight"])
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 384, 384))).all()


def test_our_checkpoints_round_trip(tmp_path, official, official_io):
    model = load_checkpoint(create_model("sret_t", groups=GLOBAL).eval(), official / "SReT_T_random.pth")
    save_checkpoint(model, tmp_path / "ours.pt")
    again = load_checkpoint(create_model("sret_t", groups=GLOBAL).eval(), tmp_path / "ours.pt")
    with torch.no_grad():
        assert torch.equal(again(official_io["input"][:1]), model(official_io["input"][:1]))
    # fine-tuning to another number of classes: non-strict load skips the head
    with pytest.warns(UserWarning, match="head.weight"):
        tuned = load_checkpoint(create_model("sret_t", num_classes=10), tmp_path / "ours.pt", strict=False)
    assert torch.equal(tuned.pos_embed, model.pos_embed)
    with pytest.raises(ValueError, match="do not fit this SReT: 2 of another shape .e.g. head.weight"):
        load_checkpoint(create_model("sret_t", num_classes=10), tmp_path / "ours.pt")
