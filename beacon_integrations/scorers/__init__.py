"""Reward scorers for :class:`beacon.BeaconSampler`.

* :class:`HttpRewardScorer` -- a reward model behind an HTTP JSON endpoint (aiohttp, imported
  on first request), with presets for OpenAI-compatible and vLLM score endpoints.
* :class:`MathAnswerVerifier` -- 0/1 correctness of the last ``\\boxed{}`` answer (math-verify,
  imported on first check), for ``family="bernoulli"``.
* :class:`CorrectnessAdjusted` -- the paper's correctness-adjusted reward.
"""

from __future__ import annotations

from beacon_integrations.scorers.errors import (
    RewardConnectionError,
    RewardHTTPError,
    RewardRequestError,
    RewardResponseError,
    RewardTimeoutError,
    ScorerError,
)
from beacon_integrations.scorers.http import HttpRewardScorer, UsageWarning, extract_path
from beacon_integrations.scorers.verify import (
    CorrectnessAdjusted,
    MathAnswerVerifier,
    adjust_reward,
    last_boxed,
)

__all__ = [
    "CorrectnessAdjusted",
    "HttpRewardScorer",
    "MathAnswerVerifier",
    "RewardConnectionError",
    "RewardHTTPError",
    "RewardRequestError",
    "RewardResponseError",
    "RewardTimeoutError",
    "ScorerError",
    "UsageWarning",
    "adjust_reward",
    "extract_path",
    "last_boxed",
]
