"""Decode/prefill engines behind one interface (:mod:`br_serve.engine.base`)."""
