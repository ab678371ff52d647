import pytest

from mor.model.tying import effective_depth, reduced_depth, tying_plan


@pytest.mark.parametrize(
    "scheme, depth, nr, order",
    [
        ("cycle", 6, 3, [0, 1, 0, 1, 0, 1]),
        ("cycle", 6, 2, [0, 1, 2, 0, 1, 2]),
        ("sequence", 6, 3, [0, 0, 0, 1, 1, 1]),
        ("sequence", 6, 2, [0, 0, 1, 1, 2, 2]),
        ("middle_cycle", 8, 3, [0, 1, 2, 1, 2, 1, 2, 3]),
        ("middle_sequence", 8, 3, [0, 1, 1, 1, 2, 2, 2, 3]),
        ("middle_cycle", 6, 2, [0, 1, 2, 1, 2, 3]),
        ("middle_sequence", 6, 4, [0, 1, 1, 1, 1, 2]),
    ],
)
def test_layer_order(scheme, depth, nr, order):
    plan = tying_plan(scheme, depth, nr)
    assert plan.order == order
    assert len(plan.recursions) == nr
    assert plan.num_unique == len(set(order))


def test_recursions_split_shared_part_evenly():
    plan = tying_plan("middle_cycle", 26, 3)  # 730M Middle-Cycle: 1 + 8x3 + 1
    assert plan.num_unique == 10 and len(plan.order) == 26
    assert all(len(r) == 8 for r in plan.recursions)
    assert plan.recursions[0] == plan.recursions[1] == plan.recursions[2]


@pytest.mark.parametrize(
    "scheme, layers, nr, depth",
    [
        # the authors' floor rule (issue 55, mor.depth): floor((L - unshared) / Nr) per recursion
        ("middle_cycle", 32, 4, 30),  # 1 + 7x4 + 1; the paper's 34 comes from model.layers: 34
        ("middle_cycle", 34, 4, 34),  # MoR-4 at 360M (App. E)
        ("middle_cycle", 30, 3, 29),  # 135M Middle-Cycle Nr 3: 1 + 9x3 + 1 (AUTHORS_RUNS.md)
        ("middle_cycle", 30, 2, 30),
        ("cycle", 30, 3, 30),
        ("cycle", 32, 3, 30),
        ("middle_sequence", 30, 3, 29),
        ("middle_cycle", 3, 4, 6),  # too shallow: one layer per recursion, as before
    ],
)
def test_effective_depth_floors(scheme, layers, nr, depth):
    assert effective_depth(scheme, layers, nr) == depth


def test_depth_moved_names_the_changed_models():
    from mor.depth import depth_moved, padded_depth
    assert padded_depth("middle_cycle", 30, 3) == 32
    assert depth_moved("mor", "middle_cycle", 30, 3)
    assert not depth_moved("mor", "middle_cycle", 32, 3)
    assert not depth_moved("vanilla", "middle_cycle", 32, 3)
    assert depth_moved("vanilla", "middle_cycle", 32, 3, reduced=True)  # 11 -> 10 layers


def test_reduced_depth_and_errors():
    assert reduced_depth(30, 3) == 10
    assert reduced_depth(32, 3) == 10  # floor (issue 55); 11 before
    with pytest.raises(ValueError, match="cannot form"):
        tying_plan("cycle", 7, 3)
    with pytest.raises(ValueError, match="unknown tying scheme"):
        tying_plan("zigzag", 6, 3)
