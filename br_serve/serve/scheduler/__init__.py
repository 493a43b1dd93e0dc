"""The scheduler room: the singleton actor (:mod:`.actor`), a thin shell over its pure
logic (:mod:`.core`: pool, policy, the mirror of the decode replicas, the barrier
group's membership, step counters) and its Ray I/O mixin (:mod:`.io`)."""
