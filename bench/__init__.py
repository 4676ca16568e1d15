"""Benchmarks of BEACON against peer stopping rules on real logged rewards.

``python -m bench.quality`` regenerates every table and figure of ``docs/benchmarks.md``;
:mod:`bench.baselines` holds the peer stopping rules (fixed best-of-N, reward threshold,
vote-agreement rules) as vectorised numpy functions.
"""
