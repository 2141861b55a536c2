"""M/G/1 waiting time: the mean (Pollaczek-Khinchine) and an exponential tail for SLO attainment.

    rho      = lam x E[S]                                   (utilisation; the queue is stable only below 1)
    E[Wq]    = lam x E[S^2] / (2 x (1 - rho))               (Pollaczek-Khinchine mean wait)
    P(Wq>t) ~= rho x exp(-rho x t / E[Wq])                  (t >= 0)

The tail: a request waits at all with probability rho (PASTA: it finds the server busy), and the wait
of one that does is taken as exponential with the mean that makes E[Wq] right (E[Wq] / rho). That is
exact for M/M/1 and the usual approximation for M/G/1 (Kingman's heavy-traffic limit is exponential
too); it is what an SLO attainment needs, a probability, where the mean alone would not do.
"""

from __future__ import annotations

import math


def utilisation(lam: float, mean_s: float) -> float:
    return lam * mean_s


def mg1_mean_wait(lam: float, mean_s: float, second_moment_s2: float) -> float:
    """Pollaczek-Khinchine; inf when the queue is not stable (rho >= 1)."""
    rho = utilisation(lam, mean_s)
    if rho >= 1:
        return math.inf
    return lam * second_moment_s2 / (2 * (1 - rho))


def mg1_wait_at_most(t: float, lam: float, mean_s: float, second_moment_s2: float) -> float:
    """P(Wq <= t): 0 for t < 0 or an unstable queue, 1 with no load."""
    if t < 0:
        return 0.0
    rho = utilisation(lam, mean_s)
    if rho >= 1:
        return 0.0
    mean_wait = mg1_mean_wait(lam, mean_s, second_moment_s2)
    if rho == 0 or mean_wait == 0:
        return 1.0
    return 1.0 - rho * math.exp(-rho * t / mean_wait)
