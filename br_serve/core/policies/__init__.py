"""Built-in policies. Importing this package registers every one of them."""

from br_serve.core.policies import baselines, br0, brh, peers

__all__ = ["baselines", "br0", "brh", "peers"]
