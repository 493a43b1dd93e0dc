"""The Ray Serve graph: ingress, prefill, scheduler actor, lock-step decode replicas.

Nothing here is imported by ``br_serve.core``; Ray is imported inside functions and
actor constructors only, so importing this package stays cheap.
"""
