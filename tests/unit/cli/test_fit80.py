"""The CLI at 80 columns: every command's --help and the main tables cut no value a user
copies (no ``…``, each value whole on its line); flags show no ``<bool>``; inspect prints
the model's inputs and outputs first; the dtype hint and --cast; both shape syntaxes."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import infscaler.cli as cli
from infscaler.base.errors import InfScalerError
from infscaler.base.models import MODELS
from infscaler.partitioner.loader import parse_shapes

RUNNER = CliRunner()
ENV = {"COLUMNS": "80", "TERMINAL_WIDTH": "80", "NO_COLOR": "1"}


@pytest.fixture()
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.out, "_width", 80)
    monkeypatch.setattr(cli.out, "_color_system", None)


def _run(*args: str) -> str:
    res = RUNNER.invoke(cli.app, list(args), env=ENV)
    assert res.exit_code == 0, res.output
    return res.output


def _commands() -> list[list[str]]:
    cmds = [[name] for name in cli.COMMANDS]
    cmds += [["variants", "register"], ["variants", "list"]]
    return cmds


@pytest.mark.parametrize("cmd", _commands(), ids=" ".join)
def test_help_fits_80_columns(cmd: list[str]) -> None:
    text = _run(*cmd, "--help")
    assert "…" not in text, text
    assert "<bool>" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    command = cli.load_command(cmd[0])
    command = getattr(command, "commands", {}).get(cmd[-1], command)
    for param in command.params:  # every option name whole on a line
        for name in param.opts:
            if name.startswith("--"):
                assert name in text, (name, text)


def test_models_table_whole_at_80(narrow: None) -> None:
    text = _run("models")
    assert "…" not in text
    for m in MODELS.values():
        assert m.alias in text.split()
        if m.shapes:
            assert m.shapes in text, m.shapes


def test_devices_table_whole_at_80(narrow: None) -> None:
    from infscaler.base.device import bundled_profiles

    text = _run("devices")
    assert "…" not in text
    for name in bundled_profiles():
        assert name in text


def test_inspect_prints_inputs_and_outputs_first(narrow: None) -> None:
    text = _run("inspect", "ppocrv4-det", "--top", "3")
    lines = text.splitlines()
    assert lines[0].startswith("input  x  FP32  [")
    assert "3," in lines[0]  # the channel dim is static
    assert lines[1].startswith("output ") and "FP32" in lines[1]
    assert "…" not in text
    assert any("1x24x160x160" in line for line in lines[2:])


def test_model_io_names_dynamic_dims() -> None:
    from infscaler.base.models import resolve_model
    from infscaler.cli.models import model_io

    io = model_io(resolve_model("minilm-int8"))
    assert [i["name"] for i in io["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert io["inputs"][0]["datatype"] == "INT64"
    assert io["inputs"][0]["shape"] == ["batch", "sequence"]
    assert io["outputs"][0]["shape"][-1] == 384


META = {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]}


def test_wrong_dtype_gets_astype_hint() -> None:
    from infscaler.cli.client import check_feeds

    with pytest.raises(InfScalerError) as exc:
        check_feeds({"x": np.zeros((1, 3))}, META)
    assert "float64" in exc.value.message
    assert "astype(np.float32)" in exc.value.hint and "--cast" in exc.value.hint


def test_cast_converts_numeric_dtype() -> None:
    from infscaler.cli.client import check_feeds

    feeds = {"x": np.array([[0.5, 1.25, 2.0]])}
    check_feeds(feeds, META, cast=True)
    assert feeds["x"].dtype == np.float32
    assert feeds["x"].tolist() == [[0.5, 1.25, 2.0]]


def test_missing_inputs_listed_with_datatype_and_shape() -> None:
    from infscaler.cli.client import missing_inputs_error

    err = missing_inputs_error(
        "model m", META["inputs"] + [{"name": "y", "datatype": "INT64", "shape": [4]}]
    )
    assert "\n  x  FP32  [-1, 3]" in err.message
    assert "\n  y  INT64  [4]" in err.message
    assert "--random" in err.hint


@pytest.mark.parametrize(
    "spec",
    ["x:1x3x224x224,y:1x4", "x:[1,3,224,224] y:[1,4]", "x:[1,3,224,224],y:[1,4]"],
)
def test_both_shape_syntaxes(spec: str) -> None:
    assert parse_shapes(spec) == {"x": (1, 3, 224, 224), "y": (1, 4)}


def test_status_table_whole_at_80(narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    from infscaler.cli.client import print_status

    inst = {"engine": "cpu", "pid": 123456, "cores": [0, 1], "pss_mb": 41.0, "state": "ready"}
    unit = {
        "unit": "ppocrv6-small-det.part_0-of-ppocrv6-small-det",
        "partition": "part_0.onnx",
        "bottleneck": 12.5,
        "engine": "cpu",
        "instances": [inst],
        "queue": 0,
        "compute_p50_ms": 3.25,
        "compute_p99_ms": 4.5,
    }
    st = {
        "control_path": {"kind": "userspace", "policy": "auto", "reason": "no CAP_BPF"},
        "pool": {"mapped_mb": 8.0, "cap_mb": 512.0, "slots_in_use": 0, "slots_free": 8},
        "pipelines": [
            {
                "name": "ocr",
                "ready": True,
                "requests": {"success": 3, "fail": {}, "latency": {"p50_ms": 5, "p99_ms": 6}},
                "units": [unit],
            }
        ],
    }
    print_status(st)
    text = capsys.readouterr().out
    assert "…" not in text
    assert unit["unit"] in text and "cpu 123456 [0,1] 41" in text


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines()]


def test_plan_table_whole_at_80(narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from infscaler.cli.plan import print_plan

    row = {
        "unit": "ppocrv6-small-det.part_0-of-ppocrv6-small-det",
        "kind": "model",
        "items_per_request": 12.0,
        "engine": "cpu",
        "instances": 2,
        "batch": 4,
        "service_ms": 12.345,
        "utilisation": 0.71,
        "memory_mb": 311.0,
    }
    res = SimpleNamespace(
        prediction=None,
        feasible=True,
        rate=20.0,
        arrivals="poisson",
        slo_ms=200.0,
        rows=lambda: [row],
        memory_cap_mb=4096.0,
        memory_mb=700.0,
        pool_mb=64.0,
        simulations=17,
        steps=[],
        notes=[],
    )
    print_plan(res, "ocr", SimpleNamespace(name="jetson-orin-nx-16gb"), 30.0)
    text = capsys.readouterr().out
    assert "…" not in text
    assert f"{row['unit']} (x12 items)" in text  # the unit whole on its line
    assert "utilisation: 71%" in text or "71%" in text.split()


def test_plan_explain_readable_at_80(narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from infscaler.cli.plan import print_search

    why = "P99 over the SLO at the offered rate; the partition's engine is saturated"
    cand = SimpleNamespace(
        label=lambda: "det[K=3 cuts 41,97] gpu x2 b4 + rec[K=1] cpu x1 b8",
        goodput_rps=18.5,
        goodput_lo=17.0,
        interval=lambda: (17.0, 19.9),
        max_rate_rps=22.0,
        p99_ms=180.0,
        memory_mb=900.0,
        share=[0.41, 0.33],
        why=why,
    )
    res = SimpleNamespace(
        explain=["plans searched for ocr at 20 requests/s, SLO 200 ms"],
        candidates=[cand],
        best=None,
    )
    print_search(res, [], {})
    text = capsys.readouterr().out
    assert "…" not in text
    assert cand.label() in text  # the plan a user copies, whole
    assert why in " ".join(_lines(text))  # the reason whole, not a word per line
    words_alone = [ln for ln in _lines(text) if ln and " " not in ln and ln in why.split()]
    assert len(words_alone) <= 1, text


def test_variants_list_whole_at_80(narrow: None, capsys: pytest.CaptureFixture[str]) -> None:
    from infscaler.cli.variants import variants_table

    rows = [
        {
            "task": task,
            "variant": f"{task}-ppocrv5-mobile-det-fp16-trt-b8-k3",
            "model": "ppocrv5",
            "generated": True,
            "accuracy_source": "measured on 200 images",
            "load_ms": 1234.0,
            "p50_ms": 12.3,
            "p99_ms": 20.1,
            "throughput_qps": 81.0,
            "peak_mb": 412.0,
            "accuracy": 0.912,
        }
        for task in ("ocr-det", "embed")
    ]
    variants_table(rows, "/var/lib/infscaler/variants/a-rather-long-directory-name/variants.json")
    text = capsys.readouterr().out
    assert "…" not in text
    for r in rows:  # each task's table, each variant name whole
        assert r["variant"] in text and r["task"] in text
    assert "/var/lib/infscaler/variants/a-rather-long-directory-name/variants.json" in text


def test_serve_startup_lines_whole_at_80(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infscaler.cli import service

    monkeypatch.setattr(cli.err, "_width", 80)
    path = "/run/infscaler/a-socket-directory-with-a-long-name/infscaler.sock"
    service._say(f"infscaler: listening on {path} (control path: userspace, pool 256 MB)")
    service._say("  [stage] det: 3 instances")  # not read as rich markup
    err = capsys.readouterr().err
    assert "…" not in err
    assert err.splitlines()[0].endswith("pool 256 MB)") and path in err.splitlines()[0]
    assert "[stage] det" in err


def test_status_says_the_refusals_by_code_and_the_configurations(
    narrow: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from infscaler.cli.client import print_status

    req = {
        "success": 40,
        "fail": {},
        "latency": {"p50_ms": 5, "p99_ms": 6},
        "refused": {"slo": 2, "queue_full": 7},
        "configurations": 2,
    }
    st = {
        "control_path": {"kind": "userspace", "policy": "auto", "reason": "no CAP_BPF"},
        "pool": {"mapped_mb": 8.0, "cap_mb": 512.0, "slots_in_use": 0, "slots_free": 8},
        "pipelines": [{"name": "ocr", "ready": True, "requests": req, "units": []}],
    }
    print_status(st)
    text = capsys.readouterr().out
    assert "refused: queue_full 7, slo 2; counted over 2 configuration(s)" in text
