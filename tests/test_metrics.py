"""metrics.py against answers computed by hand."""

import math
import re

import numpy as np
import pytest
import torch

import metrics


def test_feature_rank_of_rank_three_matrix_is_three():
    torch.manual_seed(0)
    features = torch.randn(200, 3) @ torch.randn(3, 64)  # rank 3 by construction
    assert metrics.feature_rank(features) == 3


def test_feature_rank_threshold_counts_squared_singular_values():
    # energies 100 and 1: the first holds 100/101 = 99.0099 % >= 99 %, so rank 1
    assert metrics.feature_rank(torch.diag(torch.tensor([10.0, 1.0]))) == 1
    # energies 100 and 4: 100/104 = 96.2 % < 99 %, so both are needed
    assert metrics.feature_rank(torch.diag(torch.tensor([10.0, 2.0]))) == 2
    assert metrics.feature_rank(torch.eye(5)) == 5
    assert metrics.feature_rank(torch.zeros(4, 3)) == 0


def test_feature_rank_of_an_all_zero_matrix_is_zero_and_of_a_rank_one_matrix_one_at_any_scale():
    """Rank 0 only when no entry is nonzero (no direction carries energy; numpy's matrix_rank says 0 too); any other
    matrix at least 1, whatever its scale: squares of 1e-200 underflowed to 0 (rank 0), of 1e200 overflowed (rank 1 by
    a NaN)."""
    for zeros in (torch.zeros(4, 3), -torch.zeros(64, 512), torch.zeros(1, 1, dtype=torch.float64), torch.zeros(0, 8)):
        assert metrics.feature_rank(zeros) == 0
    assert np.linalg.matrix_rank(np.zeros((4, 3))) == 0
    torch.manual_seed(0)
    rank_one = torch.rand(50, 1, dtype=torch.float64) @ torch.rand(1, 20, dtype=torch.float64)
    for scale in (1e-300, 1e-200, 1e-30, 1e-8, 1.0, 1e30, 1e200, 1e300):
        assert metrics.feature_rank(rank_one * scale) == 1, scale
        assert metrics.feature_rank(torch.eye(5, dtype=torch.float64) * scale) == 5, scale
    assert metrics.feature_rank(rank_one.float()) == 1
    assert metrics.feature_rank(torch.ones(3, 2) * 1e-30) == 1  # float32: squares of 1e-60 in float64
    one_entry = torch.zeros(100, 100)
    one_entry[3, 7] = 1e-38  # a single nonzero entry, near float32's smallest normal: a direction, rank 1
    assert metrics.feature_rank(one_entry) == 1


def test_feature_rank_is_uncentred():
    # identical rows: rank 1 uncentred (the mean is a direction), 0 energy once centred
    features = torch.ones(10, 4)
    assert metrics.feature_rank(features) == 1


def test_dormant_percentage_dense_and_conv_layers():
    # dense layer: per-neuron mean |h| = [1, 1, 1, 0]; layer mean 0.75; neuron 4 scores 0 -> dormant
    dense = torch.tensor([[1.0, 2.0, 0.5, 0.0], [1.0, 0.0, 1.5, 0.0]])
    assert metrics.dormant_percentage([dense]) == pytest.approx(25.0)
    # conv layer: channel = neuron, averaged over batch and space: means [1, 0.01],
    # layer mean 0.505, channel 2 scores 0.0198 <= 0.025 -> dormant
    conv = torch.stack([torch.ones(2, 2), torch.full((2, 2), 0.01)]).unsqueeze(0)
    assert metrics.dormant_percentage([conv]) == pytest.approx(50.0)
    # over both layers: 2 dormant neurons out of 6
    assert metrics.dormant_percentage([dense, conv]) == pytest.approx(100 * 2 / 6)
    # a larger tau makes channel 2 of a (1, 0.03) layer dormant, the default does not
    conv_b = torch.stack([torch.ones(1, 1), torch.full((1, 1), 0.03)]).unsqueeze(0)
    assert metrics.dormant_percentage([conv_b]) == 0.0
    assert metrics.dormant_percentage([conv_b], threshold=0.1) == pytest.approx(50.0)
    # a score exactly at tau is dormant (Sokar et al.: s <= tau): means (79, 1), layer mean 40, 1 / 40 = 0.025
    assert metrics.dormant_percentage([torch.tensor([[79.0, 1.0]])]) == pytest.approx(50.0)
    # tanh layers (ppo_isaacgym.py) output negative values: |h|, not h. Means of |h| (1, 1, 0.01): one dormant; signed
    # means (0, -1, 0.01) would make two of the three dormant
    tanh = torch.tensor([[1.0, -1.0, 0.01], [-1.0, -1.0, 0.01]])
    assert metrics.dormant_percentage([tanh]) == pytest.approx(100 / 3)


def test_dormant_percentage_absolute_definition_tests_each_neurons_mean_magnitude():
    """The paper's B.2 formula: dormant when mean |a_i| over the batch (and space) < epsilon, default 1e-5, strictly."""
    # dense: per-neuron mean |h| = [1, 5e-6, 0, 1e-5]: two below 1e-5; the one at exactly 1e-5 is not (strict <).
    # Sokar's relative score would call all three small ones dormant (scores ~2e-5, 0, 4e-5 of the layer mean 0.25)
    dense = torch.tensor([[1.0, 1e-5, 0.0, 1e-5], [-1.0, 0.0, 0.0, -1e-5]])
    assert metrics.dormant_percentage([dense], definition="absolute") == pytest.approx(50.0)
    assert metrics.dormant_percentage([dense], definition="sokar") == pytest.approx(75.0)
    # conv: channel means over batch and space (2, 3e-6) -> one of the two; a threshold 1e-6 makes none dormant
    conv = torch.stack([torch.full((2, 2), 2.0), torch.tensor([[1.2e-5, 0.0], [0.0, 0.0]])]).unsqueeze(0)
    assert metrics.dormant_percentage([conv], definition="absolute") == pytest.approx(50.0)
    assert metrics.dormant_percentage([conv], 1e-6, "absolute") == 0.0
    # over both layers: 3 of 6 neurons
    assert metrics.dormant_percentage([dense, conv], definition="absolute") == pytest.approx(50.0)
    # scale matters to the absolute test only: a whole layer of small (but alive) units is dormant under it, not Sokar's
    small = torch.full((4, 3), 1e-6)
    assert metrics.dormant_percentage([small], definition="absolute") == 100.0
    assert metrics.dormant_percentage([small], definition="sokar") == 0.0
    with pytest.raises(ValueError, match="definition"):
        metrics.dormant_percentage([small], definition="relative")


def test_hidden_activations_records_each_activation_output_inside_the_block_only():
    # weights set by hand: hidden pre-activations [x0 - x1, x1 - x0], the head reads the ReLU outputs
    network = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False), torch.nn.ReLU(), torch.nn.Linear(2, 1), torch.nn.Tanh())
    with torch.no_grad():
        network[0].weight.copy_(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))
    x = torch.tensor([[3.0, 1.0], [0.0, 2.0]])
    with metrics.hidden_activations(network) as outputs:
        network(x)
    assert len(outputs) == 1  # the ReLU; the Tanh is not a ReLU
    assert torch.equal(outputs[0], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    network(x)  # after the block the hooks are gone
    assert len(outputs) == 1
    with metrics.hidden_activations(network, torch.nn.Tanh) as outputs:
        network(x)
        network(x)
    assert len(outputs) == 2 and outputs[0].shape == (2, 1)


def test_weight_norm_is_l2_over_all_parameters():
    assert metrics.weight_norm([torch.tensor([3.0]), torch.tensor([[4.0, 0.0]])]) == pytest.approx(5.0)


def test_gradient_kurtosis_of_known_sample():
    # L = log|G| = [-2, -1, 0, 1, 2]: mean 0, E[L^2] = 2, E[L^4] = 6.8, K = 6.8 / 4 = 1.7
    gradients = [torch.exp(torch.tensor([-2.0, -1.0])), -torch.exp(torch.tensor([[0.0, 1.0, 2.0]]))]
    assert metrics.gradient_kurtosis(gradients) == pytest.approx(1.7, rel=1e-5)
    # a symmetric two-point distribution has kurtosis exactly 1
    assert metrics.gradient_kurtosis([torch.tensor([1.0, math.e**2])]) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("magnitude", [0.0, 1e-12, 1e-8, 1e-3, 0.1, 1.0, 3.7, 1e6])
@pytest.mark.parametrize("entries", [1, 7, 1000, 100003])
def test_gradient_kurtosis_of_constant_gradients_is_nan_whatever_the_rounding(magnitude, entries):
    """Constant |G| (signs do not count): L is constant, std(L) = 0, K undefined. The plain formula gave 0 or 1 depending
    on whether the mean of the equal entries rounded back to them (e.g. 0.0 for 1 or 100003 zeros, 1.0 for 7)."""
    for dtype in (torch.float32, torch.float64):
        gradients = [torch.full((entries,), magnitude, dtype=dtype), -torch.full((3, entries), magnitude, dtype=dtype)]
        assert math.isnan(metrics.gradient_kurtosis(gradients)), (magnitude, entries, dtype)


def test_gradient_kurtosis_of_no_entry_is_nan():
    assert math.isnan(metrics.gradient_kurtosis([]))
    assert math.isnan(metrics.gradient_kurtosis([torch.zeros(0), torch.zeros(2, 0)]))


def test_gradient_kurtosis_near_constant_is_nan_only_below_rounding():
    """std(L) at the level of float64 rounding (1e-15 relative) counts as constant; the smallest difference that float32
    gradients can make (one ulp, about 1.2e-7 in L) is a real distribution, whose K the formula gives."""
    torch.manual_seed(0)
    noise = torch.randn(10_000, dtype=torch.float64)
    for magnitude in (1e-6, 1e-3, 1.0, 1e3):
        assert math.isnan(metrics.gradient_kurtosis([magnitude * (1 + 1e-15 * noise)]))
        assert metrics.gradient_kurtosis([magnitude * (1 + 1e-6 * noise)]) == pytest.approx(3.0, abs=0.15)  # Gaussian L
        one = torch.tensor([magnitude], dtype=torch.float32)
        next_up = torch.nextafter(one, torch.tensor([math.inf]))
        # half and half: a symmetric two-point distribution, K = 1; one entry apart from 999: K = 998.001 (1 / p - 3 + 3p)
        assert metrics.gradient_kurtosis([one.repeat(500), next_up.repeat(500)]) == pytest.approx(1.0, rel=1e-6)
        assert metrics.gradient_kurtosis([one.repeat(999), next_up]) == pytest.approx(998.001, rel=1e-6)


def test_global_grad_norm():
    assert metrics.global_grad_norm([torch.tensor([3.0]), torch.tensor([4.0])]).item() == pytest.approx(5.0)


def test_ess_percentage():
    assert metrics.ess_percentage(torch.full((64,), 1.3)) == pytest.approx(100.0)
    # one ratio carries all the weight: ESS = 1 of 4 samples
    assert metrics.ess_percentage(torch.tensor([2.0, 0.0, 0.0, 0.0])) == pytest.approx(25.0)
    # r = [1, 3]: (4)^2 / (2 * 10) = 80 %
    assert metrics.ess_percentage(torch.tensor([1.0, 3.0])) == pytest.approx(80.0)


def test_categorical_kl_exact():
    p = torch.log(torch.tensor([[0.5, 0.5]]))
    q = torch.log(torch.tensor([[0.9, 0.1]]))
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert metrics.categorical_kl(p, q).item() == pytest.approx(expected, rel=1e-6)
    assert metrics.categorical_kl(q, q).item() == pytest.approx(0.0, abs=1e-7)


def test_gaussian_kl_exact():
    # KL(N(0,1) || N(1,2)) = log 2 + (1 + 1) / 8 - 1/2
    kl = metrics.gaussian_kl(torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), torch.full((1, 1), 2.0))
    assert kl.item() == pytest.approx(math.log(2) + 0.25 - 0.5, rel=1e-6)
    # summed over dimensions
    kl2 = metrics.gaussian_kl(torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), torch.full((1, 2), 2.0))
    assert kl2.item() == pytest.approx(2 * (math.log(2) - 0.25), rel=1e-6)


def test_policy_variance():
    # two deterministic, opposite states: each action's probability is 1 or 0 -> variance 1/4
    assert metrics.categorical_policy_variance(torch.tensor([[1.0, 0.0], [0.0, 1.0]])) == pytest.approx(0.25)
    assert metrics.categorical_policy_variance(torch.full((5, 3), 1 / 3)) == pytest.approx(0.0)
    # Gaussian: means [0, 2] have variance 1; a state-independent std is left out (it would halve the average)
    mean = torch.tensor([[0.0], [2.0]])
    assert metrics.gaussian_policy_variance(mean) == pytest.approx(1.0)
    # a std computed per state, [1, 3] (variance 1), and means [0, 4] (variance 4): average 2.5
    assert metrics.gaussian_policy_variance(torch.tensor([[0.0], [4.0]]), torch.tensor([[1.0], [3.0]])) == pytest.approx(2.5)


def test_ddr_and_explained_variance():
    assert metrics.data_to_divergence_ratio(1024, 0.01) == pytest.approx(102400.0)
    assert metrics.data_to_divergence_ratio(1024, 0.0) == math.inf  # the policy did not move
    target = torch.tensor([1.0, 2.0, 3.0])
    assert metrics.explained_variance(target, target) == pytest.approx(1.0)
    assert metrics.explained_variance(torch.full((3,), 2.0), target) == pytest.approx(0.0)


def test_categorical_policy_change_by_hand():
    # behaviour (0.5, 0.5) in both states; updated (0.8, 0.2) and (0.2, 0.8); action 0 taken in both
    behavior_logits = torch.zeros(2, 2)
    logits = torch.log(torch.tensor([[0.8, 0.2], [0.2, 0.8]]))
    measured = metrics.categorical_policy_change(logits, behavior_logits, torch.tensor([0, 0]), batch_size=1024)
    # ratios 1.6 and 0.4: ESS = 100 * 2.0^2 / (2 * (2.56 + 0.16))
    assert measured["ess_pct"] == pytest.approx(100 * 4 / 5.44)
    # pi(a0|s) over the states is (0.8, 0.2): variance 0.09, and the same for a1
    assert measured["policy_variance"] == pytest.approx(0.09)
    # KL(behaviour || updated) = 0.5 ln(0.5 / 0.8) + 0.5 ln(0.5 / 0.2) = 0.5 ln 1.5625 in both states
    assert measured["kl_behavior"] == pytest.approx(0.5 * math.log(1.5625))
    assert measured["ddr"] == pytest.approx(1024 / (0.5 * math.log(1.5625)))


def test_multi_discrete_policy_change_of_one_head_is_categorical_policy_change():
    generator = torch.Generator().manual_seed(0)
    logits, behavior_logits = torch.randn(6, 4, generator=generator), torch.randn(6, 4, generator=generator)
    actions = torch.randint(0, 4, (6,), generator=generator)
    expected = metrics.categorical_policy_change(logits, behavior_logits, actions, batch_size=512)
    measured = metrics.multi_discrete_policy_change(logits, behavior_logits, actions[:, None], [4], batch_size=512)
    assert measured.keys() == expected.keys()
    for key, value in expected.items():
        assert measured[key] == pytest.approx(value, rel=1e-6), key


def two_head_case():
    """Heads of 2 and 3 actions in 2 states. Behaviour: uniform in both heads. Updated: head 1 (0.8, 0.2), then
    (0.2, 0.8); head 2 (0.5, 0.25, 0.25), then uniform. Actions (0, 0), then (0, 1)."""
    behavior_logits = torch.zeros(2, 5)
    probs = torch.tensor([[0.8, 0.2, 0.5, 0.25, 0.25], [0.2, 0.8, 1 / 3, 1 / 3, 1 / 3]])
    return torch.log(probs), behavior_logits, torch.tensor([[0, 0], [0, 1]])


def test_multi_discrete_policy_change_of_two_heads_by_hand():
    logits, behavior_logits, actions = two_head_case()
    measured = metrics.multi_discrete_policy_change(logits, behavior_logits, actions, [2, 3], batch_size=1000)
    # joint ratios: (0.8 / 0.5) (0.5 / (1/3)) = 2.4 and (0.2 / 0.5) ((1/3) / (1/3)) = 0.4
    assert measured["ess_pct"] == pytest.approx(100 * (2.4 + 0.4) ** 2 / (2 * (2.4**2 + 0.4**2)))
    # KL(behaviour || updated) of each head, summed: head 1 0.5 ln(0.5 / 0.8) + 0.5 ln(0.5 / 0.2) in both states;
    # head 2 (1/3) (ln((1/3) / 0.5) + 2 ln((1/3) / 0.25)) in state 1, 0 in state 2
    head_1 = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    head_2 = (math.log((1 / 3) / 0.5) + 2 * math.log((1 / 3) / 0.25)) / 3
    kl = ((head_1 + head_2) + (head_1 + 0.0)) / 2
    assert measured["kl_behavior"] == pytest.approx(kl)
    assert measured["ddr"] == pytest.approx(1000 / kl)
    # across the 2 states, the variance of two values is ((a - b) / 2)^2: head 1's actions (0.8, 0.2) and (0.2, 0.8):
    # 0.09 each; head 2's (0.5, 1/3): 1/144, (0.25, 1/3) twice: 1/576 each. Averaged over the 5 actions
    assert measured["policy_variance"] == pytest.approx((2 * 0.09 + 1 / 144 + 2 / 576) / 5)


def test_multi_discrete_policy_change_reads_the_heads_in_order():
    """The heads given in the other order (logits, sizes and actions alike) are the same policy; the sizes swapped
    alone split the logits into other heads: another answer."""
    logits, behavior_logits, actions = two_head_case()
    measured = metrics.multi_discrete_policy_change(logits, behavior_logits, actions, [2, 3], batch_size=1000)
    reordered = metrics.multi_discrete_policy_change(
        torch.cat([logits[:, 2:], logits[:, :2]], dim=-1), behavior_logits, actions.flip(-1), [3, 2], batch_size=1000
    )
    assert reordered == pytest.approx(measured)
    swapped = metrics.multi_discrete_policy_change(logits, behavior_logits, actions, [3, 2], batch_size=1000)
    for key in ("ess_pct", "kl_behavior", "policy_variance", "ddr"):
        assert swapped[key] != pytest.approx(measured[key]), key
    with pytest.raises(ValueError, match=r"\(B, 6\) logits and \(B, 2\) actions"):
        metrics.multi_discrete_policy_change(logits, behavior_logits, actions, [3, 3], batch_size=1000)


def test_gaussian_policy_change_by_hand():
    # one action dimension; behaviour N(0, 1) in both states; updated N(1, 1) and N(0, 1); action 0 in both
    mean, std = torch.tensor([[1.0], [0.0]]), torch.ones(2, 1)
    measured = metrics.gaussian_policy_change(
        mean, std, torch.zeros(2, 1), torch.ones(2, 1), torch.zeros(2, 1), batch_size=100
    )
    # log ratios -0.5 and 0
    ratios = [math.exp(-0.5), 1.0]
    assert measured["ess_pct"] == pytest.approx(100 * sum(ratios) ** 2 / (2 * sum(r * r for r in ratios)))
    # the means (1, 0) vary by 0.25; the std is not a per-state output here
    assert measured["policy_variance"] == pytest.approx(0.25)
    # KL(N(0, 1) || N(1, 1)) = 0.5 and 0 -> mean 0.25
    assert measured["kl_behavior"] == pytest.approx(0.25)
    assert measured["ddr"] == pytest.approx(400.0)


def test_gaussian_policy_change_with_unequal_stds_and_a_per_state_std():
    # behaviour N(0, 1), updated N(0, 2) in one state: KL(behaviour || updated) = log 2 + 1/8 - 1/2, the other way round
    # KL(N(0, 2) || N(0, 1)) = -log 2 + 2 - 1/2: the direction counts
    measured = metrics.gaussian_policy_change(
        torch.zeros(1, 1), torch.full((1, 1), 2.0), torch.zeros(1, 1), torch.ones(1, 1), torch.zeros(1, 1), batch_size=10
    )
    assert measured["kl_behavior"] == pytest.approx(math.log(2) - 0.375, rel=1e-6)
    # a std the network computes per state counts in policy_variance: means (0, 4) vary by 4, stds (1, 3) by 1 -> 2.5
    mean, std = torch.tensor([[0.0], [4.0]]), torch.tensor([[1.0], [3.0]])
    per_state = metrics.gaussian_policy_change(mean, std, mean, std, torch.zeros(2, 1), 10, state_dependent_std=True)
    assert per_state["policy_variance"] == pytest.approx(2.5)
    assert metrics.gaussian_policy_change(mean, std, mean, std, torch.zeros(2, 1), 10)["policy_variance"] == pytest.approx(4.0)


def test_grid_coverage_counts_occupied_cells():
    points = np.array([[0.0, 0.0], [0.1, 0.1], [0.5, 0.5], [1.0, 1.0]])
    # G = 4: cells (0,0), (0,0), (2,2), (3,3) (the edge 1.0 is clamped into the last cell)
    assert metrics.grid_coverage(points, grid=4) == pytest.approx(3 / 16)
    # the edge 1.0 shares the last cell with 0.9 (unclamped it would be a cell of its own, past the grid)
    assert metrics.grid_coverage(np.array([[0.9, 0.9], [1.0, 1.0]]), grid=4) == pytest.approx(1 / 16)
    unit = metrics.rescale_to_unit_square(np.array([[2.0, -1.0], [4.0, 1.0], [3.0, 0.0]]))
    np.testing.assert_allclose(unit, [[0.0, 0.0], [1.0, 1.0], [0.5, 0.5]])


# DQN Zoo's atari_data.py (google-deepmind/dqn_zoo), transcribed from there, not from metrics.py: (random, human)
DQN_ZOO_RANDOM_HUMAN = {
    "amidar": (5.8, 1719.5),
    "bowling": (23.1, 160.7),
    "frostbite": (65.2, 4334.7),
    "kung_fu_master": (258.5, 22736.3),
    "riverraid": (1338.5, 17118.0),
    "battle_zone": (2360.0, 37187.5),
    "double_dunk": (-18.6, -16.4),
    "name_this_game": (2292.3, 8049.0),
    "phoenix": (761.4, 7242.6),
    "qbert": (163.9, 13455.0),
    "montezuma_revenge": (0.0, 4753.3),
    "venture": (0.0, 1187.5),
    "private_eye": (24.9, 69571.3),
    "gravitar": (173.0, 3351.4),
    "solaris": (1236.3, 12326.7),
    "pitfall": (-229.4, 6463.7),
    "breakout": (1.7, 30.5),
    "pong": (-20.7, 14.6),
    "beam_rider": (363.9, 16926.5),
    "alien": (227.8, 7127.7),
    "assault": (222.4, 742.0),
    "asterix": (210.0, 8503.3),
    "asteroids": (719.1, 47388.7),
    "atlantis": (12850.0, 29028.1),
    "bank_heist": (14.2, 753.1),
    "berzerk": (123.7, 2630.4),
    "boxing": (0.1, 12.1),
    "centipede": (2090.9, 12017.0),
    "chopper_command": (811.0, 7387.8),
    "crazy_climber": (10780.5, 35829.4),
    "defender": (2874.5, 18688.9),
    "demon_attack": (152.1, 1971.0),
    "enduro": (0.0, 860.5),
    "fishing_derby": (-91.7, -38.7),
    "freeway": (0.0, 29.6),
    "gopher": (257.6, 2412.5),
    "hero": (1027.0, 30826.4),
    "ice_hockey": (-11.2, 0.9),
    "jamesbond": (29.0, 302.8),
    "kangaroo": (52.0, 3035.0),
    "krull": (1598.0, 2665.5),
    "ms_pacman": (307.3, 6951.6),
    "road_runner": (11.5, 7845.0),
    "robotank": (2.2, 11.9),
    "seaquest": (68.4, 42054.7),
    "skiing": (-17098.1, -4336.9),
    "space_invaders": (148.0, 1668.7),
    "star_gunner": (664.0, 10250.0),
    "surround": (-10.0, 6.5),
    "tennis": (-23.8, -8.3),
    "time_pilot": (3568.0, 5229.2),
    "tutankham": (11.4, 167.6),
    "up_n_down": (533.4, 11693.2),
    "video_pinball": (16256.9, 17667.9),
    "wizard_of_wor": (563.5, 4756.5),
    "yars_revenge": (3092.9, 54576.9),
    "zaxxon": (32.5, 9173.3),
}


def test_atari_constants_are_dqn_zoos():
    """All 57 games, each under its EnvPool task name."""
    import envpool

    snake_case = {
        re.sub(r"(?<!^)([A-Z])", r"_\1", game).lower(): scores for game, scores in metrics.ATARI_RANDOM_HUMAN.items()
    }
    assert snake_case == DQN_ZOO_RANDOM_HUMAN and len(snake_case) == 57
    assert {f"{game}-v5" for game in metrics.ATARI_RANDOM_HUMAN} <= set(envpool.list_all_envs())


# Cobbe et al. 2020 (Procgen), easy mode: (R_min, R_max) of each game, transcribed separately from metrics.py
PROCGEN_EASY_RANGES = {
    "coinrun": (5, 10),
    "starpilot": (2.5, 64),
    "caveflyer": (3.5, 12),
    "dodgeball": (1.5, 19),
    "fruitbot": (-1.5, 32.4),
    "chaser": (0.5, 13),
    "miner": (1.5, 13),
    "jumper": (3, 10),
    "leaper": (3, 10),
    "maze": (5, 10),
    "bigfish": (1, 40),
    "heist": (3.5, 10),
    "climber": (2, 12.6),
    "plunder": (4.5, 30),
    "ninja": (3.5, 10),
    "bossfight": (0.5, 13),
}


def test_procgen_constants_are_cobbe_et_al_easy_mode():
    assert metrics.PROCGEN_RETURN_RANGE == PROCGEN_EASY_RANGES
    assert metrics.procgen_normalized_score("CoinrunEasy-v0", 7.5) == pytest.approx(0.5)


def test_score_normalisation():
    assert metrics.human_normalized_score("Breakout-v5", 30.5) == pytest.approx(1.0)
    assert metrics.human_normalized_score("Breakout", 1.7) == pytest.approx(0.0)
    assert metrics.human_normalized_score("Pong-v5", np.array([-20.7, 14.6])) == pytest.approx([0.0, 1.0])
    for game in metrics.ATARI_10 + metrics.HARD_EXPLORATION:
        assert game in metrics.ATARI_RANDOM_HUMAN
    assert metrics.procgen_normalized_score("BigfishEasy-v0", 40.0) == pytest.approx(1.0)
    assert metrics.procgen_normalized_score("StarpilotEasy-v0", 2.5) == pytest.approx(0.0)
    assert metrics.procgen_normalized_score("BigfishEasy-v0", 20.5) == pytest.approx(0.5)  # (20.5 - 1) / 39
    assert metrics.procgen_normalized_score("FruitbotEasy-v0", -1.5) == pytest.approx(0.0)
    with pytest.raises(KeyError, match="hard mode"):
        metrics.procgen_normalized_score("BigfishHard-v0", 10.0)
    with pytest.raises(KeyError):
        metrics.human_normalized_score("NoSuchGame-v5", 1.0)


def test_kl_and_ddr_of_near_identical_float32_policies_are_those_of_float64():
    """In float32 the KL of two policies one rounding step apart is noise (often negative: it was clamped to 1e-12, a
    DDR of batch x 1e12). Computed in float64 it is the exact KL of the float32 inputs; identical policies give 0
    and a DDR of inf."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(512, 6, generator=generator) * 3
    nudged = torch.nextafter(logits, torch.full_like(logits, math.inf))  # every logit one float32 step up
    nudged[:, 0] = torch.nextafter(nudged[:, 0], torch.full_like(logits[:, 0], -math.inf))
    nudged[:, 0] = torch.nextafter(nudged[:, 0], torch.full_like(logits[:, 0], -math.inf))  # the first one step down
    kl = lambda p, q: (p.softmax(-1) * (p.log_softmax(-1) - q.log_softmax(-1))).sum(-1).mean().item()  # noqa: E731
    exact, in_float32 = kl(logits.double(), nudged.double()), kl(logits, nudged)
    assert 0 < exact < 1e-13 and abs(in_float32 - exact) > 100 * exact  # float32 arithmetic: noise, not the KL
    measured = metrics.categorical_policy_change(nudged, logits, torch.zeros(512, dtype=torch.long), batch_size=1024)
    # float64's own rounding (1e-17 a state, clamped at 0) is left: a relative error far under the seeds' spread
    assert measured["kl_behavior"] == pytest.approx(exact, rel=1e-3)
    assert measured["ddr"] == pytest.approx(1024 / exact, rel=1e-3)
    same = metrics.categorical_policy_change(logits, logits, torch.zeros(512, dtype=torch.long), batch_size=1024)
    assert same["kl_behavior"] == 0.0 and same["ddr"] == math.inf
    mean = torch.randn(512, 3, generator=generator)
    std = torch.rand(512, 3, generator=generator) + 0.5
    gaussian = metrics.gaussian_policy_change(mean, std, mean, std, mean, batch_size=1024)
    assert gaussian["kl_behavior"] == 0.0 and gaussian["ddr"] == math.inf
    shifted = metrics.gaussian_policy_change(torch.nextafter(mean, mean + 1), std, mean, std, mean, batch_size=1024)
    exact_gaussian = ((torch.nextafter(mean, mean + 1).double() - mean.double()) / std.double()).square().sum(-1).mean() / 2
    assert shifted["kl_behavior"] == pytest.approx(exact_gaussian.item(), rel=1e-6)
