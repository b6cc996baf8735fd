"""ST-BoN: consistency of each path's tapped hidden states with its prompt's other paths."""
import math

import pytest
import torch

from stopexp.signals.methods import BASELINES
from stopexp.signals.st_bon import prompt_groups, st_bon


def _batch(rows, **extra):
    return {"hidden": torch.tensor(rows, dtype=torch.float32)[:, None, :], **extra}


def test_the_path_closest_to_the_others_scores_highest():
    # one prompt: a=(1,0), b~(1,0.1), c=(0,1); b sits between a and c
    b = _batch([[1, 0], [1, 0.1], [0, 1]], group=torch.tensor([0, 0, 0]))
    s = st_bon(b)
    bn = (1 / math.hypot(1, 0.1), 0.1 / math.hypot(1, 0.1))
    d_ab, d_ac = math.hypot(1 - bn[0], bn[1]), math.sqrt(2)
    d_bc = math.hypot(bn[0], 1 - bn[1])
    assert s.tolist() == pytest.approx([-(d_ab + d_ac) / 2, -(d_ab + d_bc) / 2, -(d_ac + d_bc) / 2])
    assert s.argmax() == 1 and s.argmin() == 2
    # the scale of a state does not count, only its direction
    assert st_bon(_batch([[10, 0], [1, 0.1], [0, 3]], group=torch.tensor([0, 0, 0]))).tolist() \
        == pytest.approx(s.tolist())


def test_peers_are_the_live_paths_of_the_same_prompt():
    rows = [[1, 0], [0, 1], [1, 1], [5, 5], [-1, 0]]
    by_group = st_bon(_batch(rows, group=torch.tensor([0, 0, 1, 1, 0])))
    by_key = st_bon(_batch(rows, seed_key=["p/0", "p/1", "q/0", "q/1", "p/2"]))
    assert by_group.tolist() == pytest.approx(by_key.tolist())
    assert by_group[2] == pytest.approx(0) and by_group[3] == pytest.approx(0)  # identical directions
    # path 4 ended before the check: it is nobody's peer, so 0 and 1 only see each other
    s = st_bon(_batch(rows, group=torch.tensor([0, 0, 1, 1, 0]), alive=torch.tensor([1, 1, 1, 1, 0])))
    assert s[0] == pytest.approx(-math.sqrt(2)) and s[1] == pytest.approx(-math.sqrt(2))
    # a path alone in its prompt has no one to agree with
    assert st_bon(_batch([[1, 0], [0, 1]], group=torch.tensor([0, 1]))).tolist() == [0.0, 0.0]


def test_layers_are_averaged_and_beams_are_one_prompt():
    h = torch.tensor([[[1.0, 0], [0, 1]], [[0, 1.0], [0, 1]]])  # 2 paths x 2 layers
    s = st_bon({"hidden": h})
    assert s.tolist() == pytest.approx([-math.sqrt(2) / 2] * 2)
    assert prompt_groups({"hidden": h}).tolist() == [0, 0]
    assert BASELINES["st_bon"] is st_bon
