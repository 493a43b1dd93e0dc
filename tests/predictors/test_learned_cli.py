"""The learned predictor end to end, model files, and the CLI's bad-input errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from br_serve.cli import main
from predictors import make_predictor
from predictors.evaluate import evaluate
from predictors.learned import LearnedModel
from predictors.train import FitOptions, train_on_trace
from tests.predictors.conftest import running
from tests.predictors.synth import SynthTrace, family_trace

H = 20


def _write_jsonl(path: Path, tr: SynthTrace, hash_ids: bool = True) -> Path:
    with path.open("w") as fh:
        for j in range(len(tr.arrival_s)):
            row: dict[str, object] = {"arrival_s": float(tr.arrival_s[j]),
                                      "input_tokens": int(tr.input_tokens[j]),
                                      "output_tokens": int(tr.output_tokens[j])}
            if hash_ids and tr.hash_ids is not None:
                row["hash_ids"] = list(tr.hash_ids[j])
            fh.write(json.dumps(row) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[SynthTrace, Path]:
    tr = family_trace(1500, families=40, seed=5)
    model, split = train_on_trace(tr, H, step_s=0.05, train_frac=0.7,
                                  opts=FitOptions(epochs=15, seed=1))
    assert split.n_train_requests == 1050
    path = tmp_path_factory.mktemp("model") / "m.safetensors"
    model.save(path)
    return tr, path


def test_learned_beats_survival_where_prefixes_predict(trained: tuple[SynthTrace, Path]
                                                       ) -> None:
    tr, path = trained
    rows = {r["predictor"]: r for r in evaluate(tr, ["survival", "exact", "learned"], H,
                                                 step_s=0.05, model_path=str(path))}
    assert rows["learned"]["auc"] > rows["survival"]["auc"] + 0.05
    assert rows["learned"]["brier"] < rows["survival"]["brier"]
    assert rows["learned"]["ece"] < 0.1  # calibrated on held-out training samples
    assert rows["exact"]["auc"] > rows["survival"]["auc"]


def test_model_file_roundtrip_is_exact_and_deterministic(trained: tuple[SynthTrace, Path],
                                                         tmp_path: Path) -> None:
    tr, path = trained
    a = LearnedModel.load(path)
    a.save(tmp_path / "copy.safetensors")
    b = LearnedModel.load(tmp_path / "copy.safetensors")
    x = np.random.default_rng(0).normal(size=(7, len(a.feature_names)))
    for u, v in zip(a.forward(x), b.forward(x), strict=True):
        np.testing.assert_array_equal(u, v)
    p, mu = a.forward(x)
    assert ((p >= 0) & (p <= 1)).all() and ((mu > 0) & (mu <= H)).all()
    # same seed, same data -> same weights
    again, _ = train_on_trace(tr, H, step_s=0.05, opts=FitOptions(epochs=15, seed=1))
    np.testing.assert_allclose(again.tensors["w1"], a.tensors["w1"], rtol=0, atol=1e-6)


def test_learned_predictor_contract(trained: tuple[SynthTrace, Path]) -> None:
    _, path = trained
    pred = make_predictor("learned", horizon=H, model_path=str(path))
    ans = pred.predict(running([100, 200, 300], [0, 5, 50],
                               hash_ids=[(0, 1001), (0, 1002), None]), H)
    assert ans.p_fin.shape == (3,) and ((ans.p_fin >= 0) & (ans.p_fin <= 1)).all()
    with pytest.raises(ValueError, match="horizon"):
        pred.predict(running([1], [0]), H + 1)
    with pytest.raises(ValueError, match="horizon 20"):
        make_predictor("learned", horizon=80, model_path=str(path))


def test_bad_model_files_are_named(tmp_path: Path, trained: tuple[SynthTrace, Path]) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.safetensors"):
        make_predictor("learned", horizon=H, model_path=str(tmp_path / "nope.safetensors"))
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match=r"junk\.safetensors"):
        make_predictor("learned", horizon=H, model_path=str(junk))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(trained[1].read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"cut\.safetensors"):
        make_predictor("learned", horizon=H, model_path=str(cut))
    from safetensors.numpy import save_file

    other = tmp_path / "other.safetensors"
    save_file({"w": np.zeros(2, np.float32)}, str(other))
    with pytest.raises(ValueError, match="not a learned-predictor file"):
        make_predictor("learned", horizon=H, model_path=str(other))


def test_cli_eval_and_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write_jsonl(tmp_path / "t.jsonl", family_trace(800, seed=7))
    model = tmp_path / "m.safetensors"
    assert main(["train-predictor", "--trace", str(trace), "--horizon", str(H),
                 "--step-s", "0.05", "--epochs", "3", "--out", str(model), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["train_requests"] == 560 and model.is_file()
    assert main(["eval-predictor", "--trace", str(trace), "--horizon", str(H),
                 "--step-s", "0.05", "--predictor", "survival,exact,learned",
                 "--predictor-model-path", str(model), "--json",
                 "--out", str(tmp_path / "e.json")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["predictor"] for r in doc["runs"]] == ["survival", "exact", "learned"]
    for r in doc["runs"]:
        assert {"auc", "brier", "ece", "mu_rem_mae", "n_samples"} <= set(r)
        assert 0.5 < r["auc"] <= 1.0
    assert json.loads((tmp_path / "e.json").read_text()) == doc


@pytest.mark.parametrize(("args", "message"), [
    (["--predictor", "magic"], "unknown predictor 'magic'"),
    (["--predictor", "learned"], "--predictor-model-path"),
    (["--predictor", "learned", "--predictor-model-path", "/nonexistent/m.st"],
     "/nonexistent/m.st"),
    (["--predictor", "learned", "--predictor-model-path", "JUNK"], "junk.st: not a readable"),
    (["--predictor", "exact", "--trace", "NOHASH"], "has no hash_ids"),
    (["--predictor", "survival", "--trace", "/nonexistent/t.jsonl"], "/nonexistent/t.jsonl"),
    (["--predictor", "survival", "--trace", "BAD"], "bad.jsonl:2"),
])
def test_cli_bad_input_is_one_named_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         args: list[str], message: str) -> None:
    good = _write_jsonl(tmp_path / "good.jsonl", family_trace(200, seed=3))
    nohash = _write_jsonl(tmp_path / "nohash.jsonl", family_trace(200, seed=3), False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 0, "input_tokens": 3, "output_tokens": 4}\n'
                   '{"arrival_s": 1, "input_tokens": 3}\n')
    junk = tmp_path / "junk.st"
    junk.write_bytes(b"not a model")
    subst = {"NOHASH": str(nohash), "BAD": str(bad), "JUNK": str(junk)}
    args = [subst.get(a, a) for a in args]
    base = ["eval-predictor", "--horizon", str(H)]
    if "--trace" not in args:
        base += ["--trace", str(good)]
    code = main(base + args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err.replace(str(tmp_path) + "/", "")
    assert err.count("\n") == 1
