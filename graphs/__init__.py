"""Deployable Ray Serve graphs (``serve run graphs.balance_route:app``)."""
