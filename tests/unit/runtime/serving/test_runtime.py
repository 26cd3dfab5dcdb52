"""The runtime without instances: pipeline config validation (errors name the YAML path),
the unit layout of carried tensors, model stage mappings, and deploy's partition plan
cache. The service on both control channels is in tests/integration/runtime/serving/test_runtime.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from infscaler.base.config import load_pipeline, pipeline_for_model
from infscaler.base.errors import ConfigError
from infscaler.runtime.serving.pipeline import compile_pipeline
from tests.helpers import chain_pipeline
from tests.integration.runtime.serving.test_runtime import fan_pipeline

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mutate, where, what",
    [
        (lambda d: d["stages"][2].pop("function"), "stages[2] (sum)", "exactly one of"),
        (lambda d: d["stages"][1].update(fan_out="maybe"), "stages[1] (split).fan_out", "boolean"),
        (lambda d: d["stages"][0].update(engine="tpu"), "stages[0] (scale).engine", "cpu"),
        (lambda d: d["stages"][0].update(inputs=["nope"]), "stages[0] (scale).inputs", "nope"),
        (lambda d: d["stages"][3].update(fan_in=False), "fans out but no later stage fans in", ""),
        (lambda d: d.update(outputs=["row"]), "outputs ['row']", "fan_in"),
        (lambda d: d["stages"][0].update(instances=0), "stages[0] (scale)", "instances"),
        (
            lambda d: d["stages"][0].update(function="no colon"),
            "stages[0] (scale)",
            "module:callable",
        ),
        (lambda d: d["stages"][1].update(name="scale"), "unique", "scale"),
        (lambda d: d.update(name="bad name!"), "name", "pattern"),
    ],
)
def test_bad_pipelines_name_the_yaml_path(mutate, where: str, what: str) -> None:
    d = fan_pipeline()
    mutate(d)
    with pytest.raises(ConfigError) as exc:
        load_pipeline(d)
    text = str(exc.value)
    assert where in text and what in text, text


def test_pipeline_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_pipeline(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_pipeline(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_pipeline(bad)


def test_unknown_function_refused_at_compile(tmp_path: Path) -> None:
    d = chain_pipeline(instances=2)
    d["stages"][1]["function"] = "stagefuncs:no_such_function"
    with pytest.raises(ConfigError, match="no callable 'no_such_function'"):
        compile_pipeline(load_pipeline(d), state_dir=tmp_path)
    d["stages"][1]["function"] = "no_such_module_xyz:f"
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_xyz'"):
        compile_pipeline(load_pipeline(d), state_dir=tmp_path)


def test_layout_carries_what_later_units_need(tmp_path: Path) -> None:
    cp = compile_pipeline(load_pipeline(fan_pipeline()), state_dir=tmp_path)
    units = {u.name: u for u in cp.units}
    # y is a response tensor: every unit until the end passes it on, items included
    assert units["scale"].carry == []
    assert units["split"].carry == ["y"]
    assert units["sum"].carry == ["y"] and units["sum"].per_item
    assert units["gather"].fan_in and units["gather"].carry == ["y"]
    assert cp.front_inputs == ["x"]
    assert [cp.next_unit(i) for i in range(4)] == [1, 2, None, None]


def test_model_stage_mapping_checked_against_the_model(tmp_path: Path, residual_path: Path) -> None:
    cfg = pipeline_for_model(residual_path)
    cp = compile_pipeline(cfg, state_dir=tmp_path)
    assert [i.name for i in cp.inputs] == ["x"] and cp.output_names == ["y"]
    assert cp.inputs[0].datatype == "FP32" and cp.inputs[0].shape == [1, 4, 8, 8]
    bad = load_pipeline(
        {
            "name": "r",
            "stages": [{"name": "m", "model": str(residual_path), "inputs": {"nope": "x"}}],
        }
    )
    with pytest.raises(ConfigError, match=r"\['nope'\] are not inputs of the model"):
        compile_pipeline(bad, state_dir=tmp_path)


def test_deploy_partitions_a_model_and_caches_the_plan(tmp_path: Path, residual_path: Path) -> None:
    cfg = pipeline_for_model(residual_path, partitions=2)
    cp = compile_pipeline(cfg, state_dir=tmp_path)
    assert [u.name for u in cp.units] == ["model/0", "model/1"]
    assert all(u.bottleneck is not None for u in cp.units)
    # internal tensors are namespaced; the model's own names are the pipeline's
    crossing = set(cp.units[0].outputs)
    assert all(n.startswith("model/") or n == "x" for n in crossing)
    plan_dir = Path(cp.plans["model"])
    mtime = (plan_dir / "plan.yaml").stat().st_mtime_ns
    lines: list[str] = []
    cp2 = compile_pipeline(cfg, state_dir=tmp_path, progress=lines.append)
    assert (plan_dir / "plan.yaml").stat().st_mtime_ns == mtime
    assert any("reusing plan" in line for line in lines) and cp2.plans == cp.plans
