"""Which decode replicas form the barrier group, and when a step is complete (pure).

The scheduler forms *generations* of the group: generation ``n`` is a set of members
(replica indices, ascending = rank order) connected by one store; a failed collective
ends a generation for good and the next one is formed among the survivors (or with a
replacement). :class:`Membership` keeps the numbers and the decisions; the scheduler
actor does the RPCs (ping, open_store, join).

Step completion: every member of a generation runs the same number of exchanges
(lock-step), reported as ``ReplicaReport.barrier_step``. Rank 0 reports every busy
step with the flags of the members that report it too (the others have nothing new);
the scheduler ticks when every flagged member's report for that step is in (a tick on
a partial view would favour whichever replica reported first).
"""

from __future__ import annotations

from collections.abc import Mapping

from br_serve.serve.wire.messages import ReplicaReport


class Membership:
    """Generation number, members and per-step report tracking of one group."""

    def __init__(self, replicas: int) -> None:
        if replicas < 1:
            raise ValueError("replicas: must be >= 1")
        self.g = replicas
        self.generation = 0
        self.members: tuple[int, ...] = ()
        self._reported: dict[int, int] = {}
        self._needed: dict[int, int] = {}

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
        self._reported, self._needed = {}, {}
        return True

    def begin(self, members: tuple[int, ...]) -> int:
        """Start forming a new generation among ``members``; returns its number."""
        self.generation += 1
        self.members = tuple(sorted(members))
        self._reported, self._needed = {}, {}
        return self.generation

    def at_least(self, generation: int) -> None:
        """Generations only go up: a restarted scheduler continues past what it saw."""
        self.generation = max(self.generation, generation)

    def step_complete(self, rep: ReplicaReport) -> bool:
        """Record ``rep``; True when every report the latest steps announced is in."""
        if rep.generation != self.generation or rep.replica not in self.members:
            return False
        g = rep.replica
        self._reported[g] = max(rep.barrier_step, self._reported.get(g, -1))
        if rep.barrier_flags and len(rep.barrier_flags) == len(rep.members):
            for m, flag in zip(rep.members, rep.barrier_flags, strict=True):
                if flag:
                    self._needed[m] = max(rep.barrier_step, self._needed.get(m, -1))
        return all(self._reported.get(m, -1) >= step for m, step in self._needed.items())
