"""Draft tree shapes: which children each strategy keeps, and the settings it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from specbeam.search.draft import DraftShape, children

# One source, two parents, a 4-token vocabulary; parent 0 is sure of token 2, parent 1 not.
LPROBS = torch.tensor([[[0.03, 0.02, 0.93, 0.02], [0.4, 0.3, 0.2, 0.1]]]).log()
CUM = torch.tensor([[0.0, -1.0]])[..., None] + LPROBS  # (1, 2, 4)


def as_set(score, parent, token) -> set[tuple[int, int]]:
    keep = score[0] > -math.inf
    return set(zip(parent[0][keep].tolist(), token[0][keep].tolist(), strict=True))


def test_linear_extends_every_parent_greedily() -> None:
    shape = DraftShape(strategy="linear")
    assert as_set(*children(shape, CUM, 2, 0)) == {(0, 2), (1, 0)}


def test_beam_keeps_the_best_over_all_parents() -> None:
    shape = DraftShape(strategy="beam", width=3, beam_size=1)
    score, parent, token = children(shape, CUM, 3, 0)
    assert as_set(score, parent, token) == {(0, 2), (1, 0), (1, 1)}
    assert torch.all(score[0, :-1] >= score[0, 1:])


def test_topm_branches_only_where_the_draft_is_unsure() -> None:
    always = DraftShape(strategy="topm", branch=2, width=4)
    assert as_set(*children(always, CUM, 4, 0)) == {(0, 2), (0, 0), (1, 0), (1, 1)}
    unsure = DraftShape(strategy="topm", branch=2, width=4, branch_below=0.9)
    score, parent, token = children(unsure, CUM, 4, 0)
    assert as_set(score, parent, token) == {(0, 2), (1, 0), (1, 1)}
    assert score.shape == (1, 4)  # padded with one invalid node to the grid's width


def test_topm_continues_greedily_below_its_branching_levels() -> None:
    shape = DraftShape(strategy="topm", branch=3, branch_depth=1, width=4)
    assert as_set(*children(shape, CUM, 4, 1)) == {(0, 2), (1, 0)}


def test_topm_width_keeps_the_best_by_cumulative_score() -> None:
    shape = DraftShape(strategy="topm", branch=2, width=2)
    assert as_set(*children(shape, CUM, 2, 0)) == {(0, 2), (1, 0)}


@pytest.mark.parametrize(
    ("setting", "value", "keyword"),
    [
        ("strategy", "wide", "draft_strategy"),
        ("depth", 0, "gamma"),
        ("width", 2, "draft_width"),
        ("branch", 0, "draft_branch"),
        ("branch_depth", -1, "draft_branch_depth"),
        ("branch_below", 0.0, "draft_branch_below"),
        ("prune_margin", -1.0, "draft_prune_margin"),
        ("max_nodes", 0, "max_draft_nodes"),
    ],
)
def test_bad_shapes_are_refused_by_keyword(setting: str, value: object, keyword: str) -> None:
    shape = DraftShape(**{"beam_size": 4, "width": 4, setting: value})
    assert [(name, found) for name, found, _ in shape.problems()] == [(keyword, value)]
