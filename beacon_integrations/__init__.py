"""Optional integrations of BEACON with other libraries.

Sub-modules import their framework on use only: ``beacon_integrations.scorers`` (reward scorers:
an aiohttp client for reward-model HTTP endpoints, a math-verify answer checker and the paper's
correctness-adjusted reward), and the LangChain / LlamaIndex adapters. Importing this package
imports nothing heavy.
"""
