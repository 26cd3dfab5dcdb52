"""Auto-scaling and batching configuration: the pipeline's autoscale block and
`serve --slo / --autoscale` options validated and applied, batching only on model stages.
The load steps against a live service are in tests/integration/runtime/scaling/test_autoscale.py."""

from __future__ import annotations

import pytest

from infscaler.base.config import load_pipeline
from infscaler.base.errors import ConfigError
from tests.integration.runtime.scaling.test_autoscale import step_pipeline

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")


def test_pipeline_autoscale_config_is_validated() -> None:
    d = step_pipeline()
    d.pop("slo")
    with pytest.raises(ConfigError, match="autoscale needs the pipeline's `slo`"):
        load_pipeline(d)
    d = step_pipeline()
    d["slo"] = "-5ms"
    with pytest.raises(ConfigError, match="slo"):
        load_pipeline(d)
    d = step_pipeline()
    d["stages"][1]["instances"] = 5
    with pytest.raises(ConfigError, match="max_instances"):
        load_pipeline(d)
    assert load_pipeline(step_pipeline()).slo_ms == 150.0
    assert load_pipeline({**step_pipeline(), "autoscale": True}).autoscale.hold_s == 15.0


def test_batching_applies_to_model_stages_only() -> None:
    d = step_pipeline()
    d["stages"][1]["batching"] = {"max_batch": 4}
    with pytest.raises(ConfigError, match="model stages only"):
        load_pipeline(d)


def test_serve_slo_and_autoscale_options_apply_to_a_pipeline() -> None:
    from infscaler.cli.client import pipeline_from_arg, with_slo

    cfg = with_slo(pipeline_from_arg("ocr"), "300ms", True)
    assert cfg.slo_ms == 300.0 and cfg.autoscale is not None and cfg.autoscale.hold_s == 15.0
    assert with_slo(cfg, None, False) is cfg
    with pytest.raises(ConfigError, match="cannot read SLO 'fast'"):
        with_slo(pipeline_from_arg("ocr"), "fast", False)


def test_serve_shapes_apply_to_models_only(tmp_path) -> None:
    from infscaler.cli.client import pipeline_from_arg
    from tests.helpers import residual_model, save

    path = save(residual_model(batch="N"), tmp_path / "dyn.onnx")
    cfg = pipeline_from_arg(str(path), None, "x:2x4x8x8")
    assert cfg.stages[0].shapes == "x:2x4x8x8"
    assert pipeline_from_arg(str(path)).stages[0].shapes is None  # the loader takes batch 1
    alias = pipeline_from_arg("ppocrv4-det", None, "x:1x3x320x320")
    assert alias.stages[0].shapes == "x:1x3x320x320"
    with pytest.raises(ConfigError, match="--shapes applies to .onnx models") as ei:
        pipeline_from_arg("ocr", None, "x:1x3x8x8")
    assert "shapes:" in (ei.value.hint or "")


def test_serve_understands_a_triton_model_repository(tmp_path) -> None:
    """``<repo>/<model>/<version>/model.onnx`` (+ config.pbtxt): each model served under
    its directory's name, from its highest version."""
    from infscaler.cli.client import pipeline_from_arg, pipelines_from_arg
    from tests.helpers import residual_model, save

    repo = tmp_path / "repo"
    for model, versions in (("resnet", [1]), ("block", [1, 3, 2])):
        for v in versions:
            (repo / model / str(v)).mkdir(parents=True)
            save(residual_model(), repo / model / str(v) / "model.onnx")
        (repo / model / "config.pbtxt").write_text(
            f'name: "{model}"\nplatform: "onnxruntime_onnx"\n'
        )
    cfgs = pipelines_from_arg(str(repo))
    assert [c.name for c in cfgs] == ["block", "resnet"]
    assert cfgs[0].stages[0].model == str(repo / "block" / "3" / "model.onnx")
    one = pipeline_from_arg(str(repo / "resnet"))
    assert one.name == "resnet" and one.stages[0].model.endswith("resnet/1/model.onnx")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="nor a Triton model directory") as ei:
        pipelines_from_arg(str(tmp_path / "empty"))
    assert "MODEL/1/model.onnx" in (ei.value.hint or "")
