"""Arrival processes (runtime/planning/arrivals.py): Poisson and gamma processes against their
definition, and the Azure traces read from the files the package ships (gzip), checked
against the uncompressed originals in ../shared/data/traces where those are beside the
repository."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from infscaler.runtime.planning import arrivals as A
from tests import REPO_ROOT

TRACES = A.trace_dir()


def test_the_package_ships_the_traces_unchanged() -> None:
    import gzip

    shared = REPO_ROOT.parent / "shared" / "data" / "traces"
    for name in (A.AZURE_FUNCTIONS_FILE, A.AZURE_LLM_FILE):
        shipped = TRACES / (name + ".gz")
        assert shipped.is_file(), name  # a missing file is a packaging defect
        if (shared / name).is_file():  # CI and developers have the originals beside
            assert gzip.decompress(shipped.read_bytes()) == (shared / name).read_bytes()


def test_poisson_rate_range_and_cv2() -> None:
    a = A.poisson(50.0, 400.0, seed=1)
    assert np.all(np.diff(a) >= 0) and a[0] >= 0 and a[-1] < 400.0
    n = 50 * 400
    assert abs(a.size - n) < 4 * np.sqrt(n)
    assert A.cv2_of(a) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv2", [1.0, 4.0])
def test_gamma_cv2_matches_request(cv2: float) -> None:
    a = A.gamma(100.0, cv2, 2000.0, seed=3)
    assert a.size / 2000.0 == pytest.approx(100.0, rel=0.03)
    assert A.cv2_of(a) == pytest.approx(cv2, rel=0.08)


def test_seeded_and_deterministic() -> None:
    assert np.array_equal(A.gamma(10, 4, 30, seed=5), A.gamma(10, 4, 30, seed=5))
    assert not np.array_equal(A.gamma(10, 4, 30, seed=5), A.gamma(10, 4, 30, seed=6))


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: A.poisson(0, 10), "rate"),
        (lambda: A.poisson(-1, 10), "rate"),
        (lambda: A.poisson(5, 0), "duration_s"),
        (lambda: A.gamma(5, 0, 10), "cv2"),
        (lambda: A.gamma("x", 1, 10), "rate must be a number"),
        (lambda: A.gamma(5, float("nan"), 10), "cv2"),
        (lambda: A.from_spec("gamma:x", 5, 10), "gamma:CV2"),
        (lambda: A.from_spec("uniform", 5, 10), "unknown arrivals"),
    ],
)
def test_bad_arguments_say_what_is_wrong(call, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        call()


def test_missing_trace_names_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFSCALER_TRACES", str(tmp_path))
    assert A.trace_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        A.azure_functions()
    with pytest.raises(FileNotFoundError, match="INFSCALER_TRACES"):
        A.azure_llm()


def _counts(function: str | None = None) -> np.ndarray:
    with A._open_text(A._trace_file(None, A.AZURE_FUNCTIONS_FILE)) as f:
        rows = list(csv.reader(f))[1:]
    per = {r[2]: np.array(r[4:], dtype=np.int64) for r in rows}
    if function is None:
        return np.sum(list(per.values()), axis=0)
    return per[function]


def test_azure_functions_reads_the_real_file() -> None:
    counts = _counts()
    assert counts.size == 480 and counts.sum() == 3_037_902  # the README's figures
    a = A.azure_functions(start_min=10, minutes=2, seed=0)
    assert a.size == counts[10:12].sum()  # scale 1: every invocation, none invented
    assert a.min() >= 0 and a.max() < 120
    assert np.sum(a < 60) == counts[10]  # each minute's requests stay in their minute
    busiest = A.azure_functions(function="busiest", minutes=1)
    assert busiest.size / counts[0] == pytest.approx(0.63, abs=0.15)
    half = A.azure_functions(start_min=10, minutes=2, scale=0.5, seed=0)
    assert half.size == pytest.approx(counts[10:12].sum() / 2, abs=2)


def test_azure_functions_pick_and_window_errors() -> None:
    with A._open_text(A._trace_file(None, A.AZURE_FUNCTIONS_FILE)) as f:
        first = next(iter(list(csv.reader(f))[1:]))[2]
    a = A.azure_functions(function=first[:12])
    assert a.size == _counts(first).sum()
    with pytest.raises(ValueError, match="not in"):
        A.azure_functions(function="ffffffffffffffffffff")
    with pytest.raises(ValueError, match="at least 6"):
        A.azure_functions(function="ab")
    with pytest.raises(ValueError, match="exceeds"):
        A.azure_functions(start_min=470, minutes=20)
    with pytest.raises(ValueError, match="start_min"):
        A.azure_functions(start_min=-1)
    with pytest.raises(ValueError, match="scale"):
        A.azure_functions(scale=0)


def test_azure_llm_replays_real_timestamps() -> None:
    a = A.azure_llm()
    assert a.size == 19_366
    assert a[0] == 0 and np.all(np.diff(a) >= 0)
    assert a[-1] / 60 == pytest.approx(58.4, abs=0.2)
    fast = A.azure_llm(time_scale=0.5)
    assert fast[-1] == pytest.approx(a[-1] / 2)
    window = A.azure_llm(start_s=60, duration_s=60)
    assert window.min() >= 0 and window.max() < 60
    assert window.size == np.sum((a >= 60) & (a < 120))
    with pytest.raises(ValueError, match="no requests"):
        A.azure_llm(start_s=10_000)


@pytest.mark.parametrize("spec", ["azure", "azure-llm"])
def test_from_spec_scales_traces_to_the_rate(spec: str) -> None:
    a = A.from_spec(spec, 20.0, 120.0, seed=0)
    assert a.max() < 120.0
    assert a.size / 120.0 == pytest.approx(20.0, rel=0.1)
