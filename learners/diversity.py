"""DvD's diversity term (Parker-Holder et al. 2020, "Effective Diversity in Population Based
Reinforcement Learning"): the members' behaviours are embedded as their actions on one shared
batch of states, and the population's diversity is the determinant of their kernel matrix

    K_ij = exp(−d_ij / (2 l²)),   d_ij = ‖e_i − e_j‖² / M     (the squared-exponential kernel, eq. 5)

whose determinant is 1 for members far apart and 0 when two act alike. The squared distance is
averaged over the embedding's M entries, so that l is in action units whatever the number of
states: fastpbrl sums it, and over 256 states × 6 actions two policies that differ by 0.1 per
action are 15 apart, K is the identity to float precision, and the term has no gradient. Each member's policy loss gains
−λ log det K. fastpbrl computes it as it stands and its README warns that runs sometimes crash on
NaNs: K is singular when two members coincide, and a Gram-matrix distance can come out negative.
Here the distances are differences squared, K is formed and factorized in float64 with a jitter
δ on its diagonal, and log det comes from the Cholesky factor, so the term and its gradient stay
finite for identical members (where the gradient is zero: nothing says which way to part).
"""

from __future__ import annotations

import torch
from torch import Tensor

JITTER = 1e-6  # δ: K + δI is positive definite whatever the members do


def kernel(embeddings: Tensor, length_scale: float) -> Tensor:
    """K [P, P] in float64 for the members' embeddings [P, M]."""
    e = embeddings.double()
    squared = (e[:, None, :] - e[None, :, :]).square().mean(-1)
    return torch.exp(-squared / (2 * length_scale**2))


def diversity_loss(embeddings: Tensor, length_scale: float = 1.0, jitter: float = JITTER) -> Tensor:
    """−log det(K + δI) for the members' embeddings [P, M], in their dtype: the term DvD adds
    (times its weight λ) to the population's policy loss."""
    k = kernel(embeddings, length_scale)
    factor = torch.linalg.cholesky(k + jitter * torch.eye(len(k), dtype=k.dtype, device=k.device))
    return (-2 * torch.log(torch.diagonal(factor)).sum()).to(embeddings.dtype)


@torch.no_grad()
def behavioural_diversity(embeddings: Tensor, length_scale: float = 1.0) -> Tensor:
    """det K in [0, 1] (a 0-dim tensor on the embeddings' device: reading it waits for the device),
    the metric: 1 when every member acts unlike the others, 0 when two act alike."""
    return torch.linalg.det(kernel(embeddings, length_scale)).clamp(0.0, 1.0)


def shared_states(obs: Tensor) -> Tensor:
    """The states every member is embedded on, from their batches [P, B, F]: the first ⌈B/P⌉ of
    each member's, one set [P, S, F] with the same rows for every member."""
    population = len(obs)
    states = obs[:, : -(-obs.shape[1] // population)].reshape(1, -1, obs.shape[-1])
    return states.expand(population, -1, -1)


def embed(actions: Tensor) -> Tensor:
    """Each member's actions [P, S, A] on the shared states as one row [P, S·A]."""
    return actions.reshape(len(actions), -1)
