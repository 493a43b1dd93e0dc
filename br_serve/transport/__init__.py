"""KV-cache transports behind one interface (:mod:`br_serve.transport.base`)."""
