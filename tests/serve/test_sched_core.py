"""SchedulerCore's answers to the ingress and its feedback to the predictor (no Ray)."""

from __future__ import annotations

from typing import Any

from br_serve.core import FinishedRequests, Prediction, build_policy
from br_serve.core.step import StepModel
from br_serve.engine.base import SamplingParams
from br_serve.serve.scheduler.core import SchedulerCore
from br_serve.serve.wire.messages import Admission, AdmitReply, ReplicaReport
from br_serve.transport.base import KVHandle


class RecordingPredictor:
    """A termination predictor that records what it is taught."""

    def __init__(self) -> None:
        self.seen: list[FinishedRequests] = []

    def observe(self, finished: FinishedRequests) -> None:
        self.seen.append(finished)

    def predict(self, running: Any, horizon: int) -> Prediction:  # pragma: no cover
        raise AssertionError("not used here")


def _admission(rid: str, prompt: int, prefix: int | None = None) -> Admission:
    return Admission(rid, "o", prompt, 0, SamplingParams(max_tokens=4),
                     KVHandle("fake", rid, prompt), prefix_hash=prefix)


def _report(rid_running: tuple[str, ...], finished: tuple[tuple[str, int], ...] = (),
            step: int = 1) -> ReplicaReport:
    return ReplicaReport(
        replica=0, generation=0, step=step, load_tokens=0, running_ids=rid_running,
        prompt_tokens=tuple(7 for _ in rid_running), decoded_tokens=(1,) * len(rid_running),
        finished_ids=tuple(f[0] for f in finished),
        finished_output_tokens=tuple(f[1] for f in finished), members=(),
        barrier_loads=(), barrier_running=(), compute_s=0.0, barrier_s=0.0,
        incarnation="i0")


def _core(predictor: Any = None) -> SchedulerCore:
    core = SchedulerCore(1, 2, 4, StepModel(0.0, 0.01, 0.0), build_policy("jsq"), detail=False,
                         predictor=predictor, clock=iter(range(10**6)).__next__)
    core.mark_alive(0, "i0")
    return core


def test_submit_locate_cancel() -> None:
    core = _core()
    assert core.submit(_admission("a", 7)) == "queued"
    assert core.submit(_admission("a", 7)) == "duplicate"  # resubmission is idempotent
    assert core.locate("a") == ("pool", -1)
    (d,) = core.tick()
    assert core.locate("a") == ("running", 0)  # in flight counts as running
    assert core.submit(_admission("a", 7)) == "duplicate"
    core.cancel("b")  # unknown: fine
    assert core.submit(_admission("b", 3)) == "queued"
    core.cancel("b")
    assert core.locate("b") == ("unknown", -1) and "b" not in core.admissions
    core.answered(d, AdmitReply("queued", 0, "i0"))
    assert core.admissions == {}  # the replica owns it now
    core.mark_dead(0)
    assert core.submit(_admission("c", 3)) == "no_replica"


def test_every_finished_request_teaches_the_predictor_its_prompt_and_output() -> None:
    pred = RecordingPredictor()
    core = _core(pred)
    core.submit(_admission("a", 7, prefix=42))
    (d,) = core.tick()
    core.answered(d, AdmitReply("queued", 0, "i0"))
    core.on_report(_report(("a",), step=1))
    core.on_report(_report((), finished=(("a", 4),), step=2))
    (fin,) = pred.seen
    assert fin.prompt_tokens.tolist() == [7] and fin.output_tokens.tolist() == [4]
    assert fin.prefix_hash.tolist() == [42]  # kept from the pool entry to the finish
    assert core.mirror.state.running_requests().tolist() == [0]
