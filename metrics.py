"""Measurements shared by every script: plasticity / optimisation metrics and score tables.

Every function is pure (tensors or numbers in, numbers or tensors out) so that a test can check it on
hand-made inputs; the one exception, `hidden_activations`, records a network's hidden outputs
for `dormant_percentage`. Definitions follow Appendix B of Mayor et al., "The Impact of
On-Policy Parallelized Data Collection on Deep Reinforcement Learning Networks" (ICML 2025),
unless a docstring says otherwise (docs/metrics.md gives each definition and names the variants used here).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch
from torch import nn

# --------------------------------------------------------------------------------------
# Representation metrics
# --------------------------------------------------------------------------------------


def feature_rank(features: torch.Tensor, threshold: float = 0.99) -> int:
    """Approximate rank of an (N x D) feature matrix (paper B.1; Yang et al. 2019).

    The smallest k such that the top-k squared singular values hold at least `threshold`
    of the total. The matrix is used as is (uncentred), as in Moalla et al. 2024.

    An all-zero matrix (or one with no entry) has rank 0: no direction carries energy, k = 0 meets the definition
    (0 >= threshold * 0), and numpy's matrix_rank agrees. Any other matrix has rank >= 1, whatever its scale: the
    matrix is divided by its largest |entry| first, so that squares neither underflow to 0 (a matrix of 1e-200 is rank
    1, not 0) nor overflow; the rank does not depend on the scale, only on which entries are exactly 0.
    """
    features = features.detach().double()
    scale = features.abs().max() if features.numel() else features.new_zeros(())
    if scale == 0:  # every entry exactly 0 (ReLU features of a dead layer): one host sync, as the rank's .item()
        return 0
    energy = torch.linalg.svdvals(features / scale).square()
    cumulative = torch.cumsum(energy, dim=0) / energy.sum()
    # k - 1 shares fall short of the threshold (a tiny tolerance keeps an exact 99 % share from float rounding). A
    # comparison with a Python number: no tensor of another device (searchsorted would need one on cumulative's device).
    return int((cumulative < threshold - 1e-12).sum().item()) + 1


DORMANT_THRESHOLDS = {"sokar": 0.025, "absolute": 1e-5}  # Sokar et al.'s tau; the epsilon of the paper's B.2


def dormant_percentage(
    activations: Sequence[torch.Tensor], threshold: float | None = None, definition: Literal["sokar", "absolute"] = "sokar"
) -> float:
    """Percentage of dormant neurons over all given hidden layers (paper B.2).

    `activations` are post-activation outputs, one tensor per hidden layer, shaped (B, D) for
    dense layers or (B, C, H, W) for convolutions, where a channel counts as one neuron.
    Each neuron's value is its mean |activation| over the batch (and space). It is dormant
    - "sokar" (Sokar et al. 2023, which the paper says it follows): when that value divided
      by the mean of those values over its layer is <= threshold (tau, default 0.025);
    - "absolute" (the paper's B.2 formula, |a_i| < epsilon): when that value itself is
      < threshold (epsilon, default 1e-5). With ReLU this counts only the units that are
      (all but) dead on the whole batch; Sokar's score also counts units that are weak
      relative to their layer, and does not depend on the activations' scale.
    `threshold` None takes the definition's default (`DORMANT_THRESHOLDS`).
    """
    if definition not in DORMANT_THRESHOLDS:
        raise ValueError(f"definition must be one of {sorted(DORMANT_THRESHOLDS)}, got {definition!r}")
    threshold = DORMANT_THRESHOLDS[definition] if threshold is None else threshold
    dormant, total = 0, 0
    for layer_output in activations:
        per_neuron = layer_output.detach().abs().float()
        # Average over every axis but the neuron (channel) axis 1.
        reduce_dims = [d for d in range(per_neuron.dim()) if d != 1]
        per_neuron = per_neuron.mean(dim=reduce_dims)
        if definition == "sokar":
            dormant += int((per_neuron / (per_neuron.mean() + 1e-9) <= threshold).sum().item())
        else:
            dormant += int((per_neuron < threshold).sum().item())
        total += per_neuron.numel()
    return 100.0 * dormant / max(total, 1)


@contextmanager
def hidden_activations(network: nn.Module, activation: type[nn.Module] = nn.ReLU) -> Iterator[list[torch.Tensor]]:
    """The outputs of every `activation` module of `network` in the forward passes run inside the `with` block, in
    call order: the hidden layers that `dormant_percentage` reads (the output heads have no activation module)."""
    outputs: list[torch.Tensor] = []
    modules = [module for module in network.modules() if isinstance(module, activation)]
    hooks = [module.register_forward_hook(lambda _module, _input, output: outputs.append(output)) for module in modules]
    try:
        yield outputs
    finally:
        for hook in hooks:
            hook.remove()


def weight_norm(parameters: Iterable[torch.Tensor]) -> float:
    """L2 norm of all parameters taken together: sqrt(sum of squares) (B.3)."""
    squares = [p.detach().double().square().sum() for p in parameters]
    return float(torch.stack(squares).sum().sqrt().item()) if squares else 0.0


# --------------------------------------------------------------------------------------
# Optimisation metrics
# --------------------------------------------------------------------------------------


KURTOSIS_MIN_STD = 1e-12  # std(L) at or below this times (1 + max |L|): L is constant up to rounding, K undefined (NaN)


def gradient_kurtosis(gradients: Iterable[torch.Tensor], eps: float = 1e-8) -> float:
    """Kurtosis of log-absolute gradient entries (B.4; Garg et al. 2021).

    L_i = log(|G_i| + eps) over every entry; K = E[(L - mean L)^4] / std(L)^4, the plain
    (not excess) kurtosis, with the population standard deviation.

    K is undefined, NaN, when L is constant: every |G_i| the same (all-zero gradients, a single entry, or no entry).
    Whether rounding left std(L) at exactly 0 or at 1e-16 (which gave K = 0 or about 1) does not decide it: L is
    centred on one of its own entries first (so equal entries give exactly 0), and std(L) <= KURTOSIS_MIN_STD *
    (1 + max |L|), far below the smallest difference that distinct float32 gradients make in L (about 1e-7), counts as
    0. A NaN metric is logged as such (TensorBoard keeps it; sweeps/aggregate.py leaves it out of the curves with a note);
    it is no training failure: the scripts' stop_if_not_finite checks rewards, losses and gradients, not the metrics.
    """
    log_abs = torch.cat([torch.log(g.detach().double().abs().flatten() + eps) for g in gradients] or [torch.zeros(0)])
    if log_abs.numel() == 0:
        return float("nan")
    shifted = log_abs - log_abs[0]  # exact zeros where the entries equal the first one
    centred = shifted - shifted.mean()
    variance = centred.square().mean()
    if not variance.sqrt() > KURTOSIS_MIN_STD * (1 + log_abs.abs().max()):  # (one host sync, as the .item() below)
        return float("nan")
    return float((centred.pow(4).mean() / variance.square()).item())


def global_grad_norm(gradients: Iterable[torch.Tensor]) -> torch.Tensor:
    """L2 norm of all gradient entries together, as a 0-d tensor (no host sync)."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach()) for g in gradients]))


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var[target - predicted] / Var[target]; NaN when the target is constant."""
    target_variance = torch.var(target, unbiased=False)
    if target_variance <= 0:
        return float("nan")
    return float((1 - torch.var(target - predicted, unbiased=False) / target_variance).item())


# --------------------------------------------------------------------------------------
# Policy metrics
# --------------------------------------------------------------------------------------


def ess_percentage(ratios: torch.Tensor) -> float:
    """Effective sample size of importance ratios, as a percentage of N (B.5; Martino 2017).

    ESS% = 100 * (sum r)^2 / (N * sum r^2), which is 100 for uniform ratios.
    """
    r = ratios.detach().double().flatten()
    return float((100.0 * r.sum().square() / (r.numel() * r.square().sum())).item())


def categorical_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Exact KL(p || q) per state for categorical distributions given by logits (B, A), in float64: in float32 the KL
    of two near-identical policies is rounding noise, often negative, which a DDR (batch / KL) turns into nonsense."""
    p_log = torch.log_softmax(p_logits.double(), dim=-1)
    q_log = torch.log_softmax(q_logits.double(), dim=-1)
    return (p_log.exp() * (p_log - q_log)).sum(dim=-1).clamp(min=0.0)  # >= 0; float64 rounding can leave -1e-17


def gaussian_kl(p_mean: torch.Tensor, p_std: torch.Tensor, q_mean: torch.Tensor, q_std: torch.Tensor) -> torch.Tensor:
    """Exact KL(p || q) per state for diagonal Gaussians (B, D), summed over dimensions, in float64 (as categorical_kl)."""
    variance_ratio = (p_std.double() / q_std.double()).square()
    mean_term = ((p_mean.double() - q_mean.double()) / q_std.double()).square()
    return 0.5 * (variance_ratio + mean_term - 1 - torch.log(variance_ratio)).sum(dim=-1).clamp(min=0.0)


def categorical_policy_variance(probs: torch.Tensor) -> float:
    """Variance across states of pi(a|s) for each action, averaged over actions (B.6).

    `probs` is (B, A); the variance is the population variance (divides by B).
    """
    return float(probs.detach().double().var(dim=0, unbiased=False).mean().item())


def gaussian_policy_variance(mean: torch.Tensor, std: torch.Tensor | None = None) -> float:
    """B.6 for Gaussian policies: the across-state variance of each state-dependent output, averaged over them: the
    mean of every action dimension, (B, D), and the std too when the network computes it per state (pass it then).
    A state-independent std has zero variance by construction and would only halve the average."""
    outputs = mean if std is None else torch.cat([mean, std], dim=-1)
    return float(outputs.detach().double().var(dim=0, unbiased=False).mean().item())


def data_to_divergence_ratio(batch_size: int, kl_behavior: float) -> float:
    """Beukman et al. 2026: samples per unit of KL moved by one update (batch / KL); inf for a policy that did not
    move at all (KL 0)."""
    return float(batch_size / kl_behavior) if kl_behavior > 0 else float("inf")


def categorical_policy_change(
    logits: torch.Tensor, behavior_logits: torch.Tensor, actions: torch.Tensor, batch_size: int
) -> dict[str, float]:
    """The tags that compare the updated policy (logits, (B, A)) with the behaviour policy that chose `actions` in
    the same B states: ess_pct of pi_new(a|s) / pi_behavior(a|s), the updated policy's policy_variance, kl_behavior
    (the mean exact KL(pi_behavior || pi_new)) and the ddr of a training batch of `batch_size`."""
    log_probs, behavior_log_probs = torch.log_softmax(logits, dim=-1), torch.log_softmax(behavior_logits, dim=-1)
    log_ratio = (log_probs - behavior_log_probs).gather(-1, actions[:, None]).squeeze(-1)
    kl_behavior = categorical_kl(behavior_logits, logits).mean().item()
    return {
        "ess_pct": ess_percentage(log_ratio.exp()),
        "policy_variance": categorical_policy_variance(log_probs.exp()),
        "kl_behavior": kl_behavior,
        "ddr": data_to_divergence_ratio(batch_size, kl_behavior),
    }


def multi_discrete_kl(p_logits: torch.Tensor, q_logits: torch.Tensor, action_sizes: Sequence[int]) -> torch.Tensor:
    """Exact KL(p || q) per state of two MultiDiscrete policies, (B, sum(action_sizes)) logits each, the heads side by
    side: for independent heads, the sum of the heads' categorical KLs (float64, as categorical_kl)."""
    sizes = [int(size) for size in action_sizes]
    heads = zip(torch.split(p_logits, sizes, dim=-1), torch.split(q_logits, sizes, dim=-1), strict=True)
    return sum(categorical_kl(p_head, q_head) for p_head, q_head in heads)


def multi_discrete_policy_change(
    logits: torch.Tensor,
    behavior_logits: torch.Tensor,
    actions: torch.Tensor,
    action_sizes: Sequence[int],
    batch_size: int,
) -> dict[str, float]:
    """`categorical_policy_change` for a MultiDiscrete policy: independent categoricals, one per head (Kinetix's
    [3, 3, 3, 3, 2, 2]). `logits` and `behavior_logits` are (B, sum(action_sizes)), the heads' logits side by side in
    the order of `action_sizes`; `actions` is (B, heads), the index chosen in each head. log pi(a|s) is the sum over
    the heads, so ess_pct is of the joint ratio exp(sum over heads of log pi_new - log pi_behavior); kl_behavior is the
    mean over states of the exact joint KL(pi_behavior || pi_new), for independent heads the sum of the heads'
    categorical KLs (float64, as categorical_kl); policy_variance is the across-state variance of pi(a|s) of every
    action of every head, averaged over all sum(action_sizes) actions; ddr = batch_size / kl_behavior."""
    sizes = [int(size) for size in action_sizes]
    if logits.shape[-1] != sum(sizes) or behavior_logits.shape != logits.shape or actions.shape[-1] != len(sizes):
        raise ValueError(
            f"logits {tuple(logits.shape)} and {tuple(behavior_logits.shape)}, actions {tuple(actions.shape)}: expected "
            f"(B, {sum(sizes)}) logits and (B, {len(sizes)}) actions for the heads {sizes}"
        )
    heads = torch.split(logits, sizes, dim=-1)
    behavior_heads = torch.split(behavior_logits, sizes, dim=-1)
    log_probs = [torch.log_softmax(head, dim=-1) for head in heads]
    log_ratio = sum(
        (head_log_probs - torch.log_softmax(behavior_head, dim=-1)).gather(-1, actions[:, i, None].long()).squeeze(-1)
        for i, (head_log_probs, behavior_head) in enumerate(zip(log_probs, behavior_heads, strict=True))
    )
    kl_behavior = multi_discrete_kl(behavior_logits, logits, sizes).mean().item()
    return {
        "ess_pct": ess_percentage(log_ratio.exp()),
        "policy_variance": categorical_policy_variance(torch.cat(log_probs, dim=-1).exp()),
        "kl_behavior": kl_behavior,
        "ddr": data_to_divergence_ratio(batch_size, kl_behavior),
    }


def gaussian_policy_change(
    mean: torch.Tensor,
    std: torch.Tensor,
    behavior_mean: torch.Tensor,
    behavior_std: torch.Tensor,
    actions: torch.Tensor,
    batch_size: int,
    state_dependent_std: bool = False,
) -> dict[str, float]:
    """`categorical_policy_change` for diagonal Gaussian policies given by their means and stds, (B, D) each; the std
    counts in policy_variance only when the network computes it per state."""
    normal = lambda loc, scale: torch.distributions.Normal(loc, scale, validate_args=False)  # noqa: E731 - no host check
    log_ratio = (normal(mean, std).log_prob(actions) - normal(behavior_mean, behavior_std).log_prob(actions)).sum(-1)
    kl_behavior = gaussian_kl(behavior_mean, behavior_std, mean, std).mean().item()
    return {
        "ess_pct": ess_percentage(log_ratio.exp()),
        "policy_variance": gaussian_policy_variance(mean, std if state_dependent_std else None),
        "kl_behavior": kl_behavior,
        "ddr": data_to_divergence_ratio(batch_size, kl_behavior),
    }


# --------------------------------------------------------------------------------------
# State-space coverage (B.7)
# --------------------------------------------------------------------------------------


def rescale_to_unit_square(points: np.ndarray) -> np.ndarray:
    """Min-max rescale each column of (N, 2) points to [0, 1] (a constant column maps to 0)."""
    low, high = points.min(axis=0), points.max(axis=0)
    span = np.where(high > low, high - low, 1.0)
    return (points - low) / span


def grid_coverage(points: np.ndarray, grid: int = 50) -> float:
    """Fraction of the cells of a grid x grid partition of [0,1]^2 that hold a point (B.7)."""
    cells = np.minimum(np.floor(np.asarray(points) * grid).astype(np.int64), grid - 1)
    occupied = np.unique(cells[:, 0] * grid + cells[:, 1]).size
    return occupied / grid**2


# --------------------------------------------------------------------------------------
# Score normalisation
# --------------------------------------------------------------------------------------

# (random, human) scores of the 57 Atari games: the standard constants of DQN Zoo's atari_data.py
# (Mnih et al. 2015; Badia et al. 2020), keyed by EnvPool task name without "-v5".
ATARI_RANDOM_HUMAN: dict[str, tuple[float, float]] = {
    # Atari-10 (Aitchison et al. 2023), the paper's games
    "Amidar": (5.8, 1719.5),
    "Bowling": (23.1, 160.7),
    "Frostbite": (65.2, 4334.7),
    "KungFuMaster": (258.5, 22736.3),
    "Riverraid": (1338.5, 17118.0),
    "BattleZone": (2360.0, 37187.5),
    "DoubleDunk": (-18.6, -16.4),
    "NameThisGame": (2292.3, 8049.0),
    "Phoenix": (761.4, 7242.6),
    "Qbert": (163.9, 13455.0),
    # hard exploration (paper Sec. 6.3)
    "MontezumaRevenge": (0.0, 4753.3),
    "Venture": (0.0, 1187.5),
    "PrivateEye": (24.9, 69571.3),
    "Gravitar": (173.0, 3351.4),
    "Solaris": (1236.3, 12326.7),
    "Pitfall": (-229.4, 6463.7),
    # common sanity-check games
    "Breakout": (1.7, 30.5),
    "Pong": (-20.7, 14.6),
    "BeamRider": (363.9, 16926.5),
    # the rest of Atari-57: any EnvPool Atari game is human-normalised
    "Alien": (227.8, 7127.7),
    "Assault": (222.4, 742.0),
    "Asterix": (210.0, 8503.3),
    "Asteroids": (719.1, 47388.7),
    "Atlantis": (12850.0, 29028.1),
    "BankHeist": (14.2, 753.1),
    "Berzerk": (123.7, 2630.4),
    "Boxing": (0.1, 12.1),
    "Centipede": (2090.9, 12017.0),
    "ChopperCommand": (811.0, 7387.8),
    "CrazyClimber": (10780.5, 35829.4),
    "Defender": (2874.5, 18688.9),
    "DemonAttack": (152.1, 1971.0),
    "Enduro": (0.0, 860.5),
    "FishingDerby": (-91.7, -38.7),
    "Freeway": (0.0, 29.6),
    "Gopher": (257.6, 2412.5),
    "Hero": (1027.0, 30826.4),
    "IceHockey": (-11.2, 0.9),
    "Jamesbond": (29.0, 302.8),
    "Kangaroo": (52.0, 3035.0),
    "Krull": (1598.0, 2665.5),
    "MsPacman": (307.3, 6951.6),
    "RoadRunner": (11.5, 7845.0),
    "Robotank": (2.2, 11.9),
    "Seaquest": (68.4, 42054.7),
    "Skiing": (-17098.1, -4336.9),
    "SpaceInvaders": (148.0, 1668.7),
    "StarGunner": (664.0, 10250.0),
    "Surround": (-10.0, 6.5),
    "Tennis": (-23.8, -8.3),
    "TimePilot": (3568.0, 5229.2),
    "Tutankham": (11.4, 167.6),
    "UpNDown": (533.4, 11693.2),
    "VideoPinball": (16256.9, 17667.9),
    "WizardOfWor": (563.5, 4756.5),
    "YarsRevenge": (3092.9, 54576.9),
    "Zaxxon": (32.5, 9173.3),
}
ATARI_10 = "Amidar Bowling Frostbite KungFuMaster Riverraid BattleZone DoubleDunk NameThisGame Phoenix Qbert".split()
HARD_EXPLORATION = ["MontezumaRevenge", "Venture", "PrivateEye", "Gravitar", "Solaris", "Pitfall"]

# Procgen easy-mode (R_min, R_max) from Cobbe et al. 2020 (Appendix C), keyed by lower-case
# game name. Hard mode uses other constants, which are not listed here.
PROCGEN_RETURN_RANGE: dict[str, tuple[float, float]] = {
    "bigfish": (1.0, 40.0),
    "bossfight": (0.5, 13.0),
    "caveflyer": (3.5, 12.0),
    "chaser": (0.5, 13.0),
    "climber": (2.0, 12.6),
    "coinrun": (5.0, 10.0),
    "dodgeball": (1.5, 19.0),
    "fruitbot": (-1.5, 32.4),
    "heist": (3.5, 10.0),
    "jumper": (3.0, 10.0),
    "leaper": (3.0, 10.0),
    "maze": (5.0, 10.0),
    "miner": (1.5, 13.0),
    "ninja": (3.5, 10.0),
    "plunder": (4.5, 30.0),
    "starpilot": (2.5, 64.0),
}


def _game_name(env_id: str) -> str:
    return env_id.rsplit("/", maxsplit=1)[-1].split("-", maxsplit=1)[0]


def human_normalized_score(env_id: str, score: float | np.ndarray) -> float | np.ndarray:
    """(score - random) / (human - random) for an Atari task ("Breakout-v5" or "Breakout")."""
    game = _game_name(env_id)
    if game not in ATARI_RANDOM_HUMAN:
        raise KeyError(f"no random/human scores for {game!r}; known: {sorted(ATARI_RANDOM_HUMAN)}")
    random_score, human_score = ATARI_RANDOM_HUMAN[game]
    return (score - random_score) / (human_score - random_score)


def procgen_normalized_score(env_id: str, score: float | np.ndarray) -> float | np.ndarray:
    """(score - R_min) / (R_max - R_min) for a Procgen easy-mode task ("BigfishEasy-v0" or "bigfish")."""
    name = _game_name(env_id).lower()
    if name.endswith("hard"):
        raise KeyError(f"no Procgen return range for hard mode ({env_id!r}); the table holds easy mode")
    game = name.removesuffix("easy")
    if game not in PROCGEN_RETURN_RANGE:
        raise KeyError(f"no Procgen return range for {game!r}; known: {sorted(PROCGEN_RETURN_RANGE)}")
    low, high = PROCGEN_RETURN_RANGE[game]
    return (score - low) / (high - low)
