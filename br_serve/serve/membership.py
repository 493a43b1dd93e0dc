"""Which decode replicas form the barrier group, and when a step is complete (pure).

The scheduler forms *generations* of the group: generation ``n`` is a set of members
(replica indices, ascending = rank order) connected by one store; a failed collective
ends a generation for good and the next one is formed among the survivors (or with a
replacement). :class:`Membership` keeps the numbers and the decisions; the scheduler
actor does the RPCs (ping, open_store, join).

Step completion: every member of a generation runs the same number of exchanges
(lock-step), reported as ``ReplicaReport.barrier_step``; the scheduler ticks once per
step, when every member has reported it (a tick on a partial view would favour
whichever replica reported first).
"""

from __future__ import annotations

from collections.abc import Mapping

from br_serve.serve.messages import ReplicaReport


class Membership:
    """Generation number, members and per-step report tracking of one group."""

    def __init__(self, replicas: int) -> None:
        if replicas < 1:
            raise ValueError("replicas: must be >= 1")
        self.g = replicas
        self.generation = 0
        self.members: tuple[int, ...] = ()
        self._reported: dict[int, int] = {}

    def adopt(self, pings: Mapping[int, int],
              reports: Mapping[int, ReplicaReport | None]) -> bool:
        """After a scheduler restart: keep the running generation if every alive replica
        (``pings``: replica -> its generation) is in the same one, with exactly these
        members (their latest ``reports`` say so). False: a new one must be formed."""
        gens = set(pings.values())
        if len(gens) != 1 or min(gens) <= 0:
            return False
        gen = gens.pop()
        members = tuple(sorted(pings))
        for g in members:
            rep = reports.get(g)
            if rep is None or rep.generation != gen or rep.members != members:
                return False
        self.generation, self.members = gen, members
        self._reported = {}
        return True

    def begin(self, members: tuple[int, ...]) -> int:
        """Start forming a new generation among ``members``; returns its number."""
        self.generation += 1
        self.members = tuple(sorted(members))
        self._reported = {}
        return self.generation

    def at_least(self, generation: int) -> None:
        """Generations only go up: a restarted scheduler continues past what it saw."""
        self.generation = max(self.generation, generation)

    def step_complete(self, rep: ReplicaReport) -> bool:
        """Record ``rep``; True when every member has reported its barrier step."""
        if rep.generation != self.generation or rep.replica not in self.members:
            return False
        g = rep.replica
        self._reported[g] = max(rep.barrier_step, self._reported.get(g, -1))
        return all(self._reported.get(m, -1) >= rep.barrier_step for m in self.members)
