"""BalanceRoute: barrier-aware routing for data-parallel LLM decode replicas."""

__version__ = "0.1.0"
