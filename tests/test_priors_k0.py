"""k0 of NIG priors against the paper's Table table_k0, derived from the posterior itself."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from beacon.priors import NIGPrior, nig_k0


def _k0_from_the_posterior(nu0: float, alpha0: float, beta0: float) -> int:
    """The fewest rewards k after which the predictive Student-t has a mean and a scale.

    2 alpha_k = 2 alpha0 + k > 1 (degrees of freedom above 1), nu_k = nu0 + k > 0 and
    beta_k > 0 almost surely: beta0 > 0, or one reward with nu0 > 0 (the shrinkage term), or
    two rewards (their spread).
    """
    for k in range(4):
        if 2 * alpha0 + k > 1 and nu0 + k > 0 and (beta0 > 0 or (k >= 1 and nu0 > 0) or k >= 2):
            return k
    raise AssertionError("unreachable for alpha0 >= -1/2")


halves = st.sampled_from([-0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 3.0])
# away from 0 by more than float rounding: 2 alpha0 + 1 > 1 must hold in floats too
alphas = halves | st.floats(-0.49, -0.01) | st.floats(0.01, 10.0)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([0.0, 1e-3, 1.0, 50.0]), alphas,
       st.sampled_from([0.0, 1e-9, 2.0]))
def test_k0_is_the_paper_table_and_the_posterior_agrees(
    nu0: float, alpha0: float, beta0: float
) -> None:
    assert nig_k0(nu0, alpha0, beta0) == _k0_from_the_posterior(nu0, alpha0, beta0)
    assert NIGPrior(0.0, nu0, alpha0, beta0).k0 == nig_k0(nu0, alpha0, beta0)


def test_table_rows() -> None:
    assert NIGPrior.jeffreys().k0 == 3  # 2 alpha0 = -1
    assert nig_k0(1.0, 1.0, 1.0) == 0  # 2 alpha0 > 1, nu0, beta0 > 0
    assert nig_k0(1.0, 0.5, 0.0) == 1  # 2 alpha0 in (0, 1], nu0 > 0, beta0 >= 0
    assert nig_k0(1.0, 1.0, 0.0) == 1  # 2 alpha0 > 1, nu0 > 0, beta0 = 0
    assert nig_k0(0.0, 0.1, 1.0) == 1  # alpha0, beta0 > 0, nu0 = 0
    assert nig_k0(0.0, 2.0, 0.0) == 2  # alpha0 > 0, nu0 = beta0 = 0
    assert nig_k0(5.0, -0.25, 3.0) == 2  # 2 alpha0 in (-1, 0]
    assert nig_k0(5.0, -0.5, 3.0) == 3  # 2 alpha0 = -1
