"""runtime.scaling.wakesetting: the service's CPU wake-up setting and what the wake
policy's decisions do to it, as pure functions (hand-computed cases)."""

from __future__ import annotations

import pytest

from infscaler.base.errors import InfScalerError
from infscaler.runtime.scaling.wakesetting import (
    WakeChange,
    WakeSetting,
    checked_wake_latency,
    in_force_us,
    planned_us,
    policy_change,
    wake_setting,
)


@pytest.mark.parametrize("good", [None, "auto", 0, 50, 2**31 - 1])
def test_checked_wake_latency_takes_none_auto_and_a_pm_qos_limit(good):
    assert checked_wake_latency(good) == good


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True, "Auto", 2**31])
def test_checked_wake_latency_refuses_anything_else_saying_what_to_give(bad):
    with pytest.raises(InfScalerError) as info:
        checked_wake_latency(bad)
    assert str(info.value).startswith(
        f"cpu_wake_latency_us must be an int >= 0 (microseconds), 'auto' or None, got {bad!r}"
    )
    assert info.value.hint == (
        "0 keeps idle CPUs polling; auto holds them awake once an SLO is missed; "
        "None lets them sleep"
    )


def test_a_setting_starts_from_no_request_and_no_reasons():
    assert wake_setting("auto") == WakeSetting(auto=True, requested_us=None)
    assert wake_setting(0) == WakeSetting(auto=False, requested_us=0)
    assert wake_setting(20) == WakeSetting(auto=False, requested_us=20)
    assert wake_setting(None) == WakeSetting()
    assert wake_setting(0).auto_reason == wake_setting(0).unavailable_reason == ""


def test_the_policy_applies_under_auto_only():
    for fixed in (wake_setting(0), wake_setting(None)):
        assert policy_change(fixed, True, "x", holding=False) is None
        assert policy_change(fixed, False, "x", holding=True) is None


def test_a_decision_from_an_earlier_epoch_is_void():
    auto = wake_setting("auto")
    assert policy_change(auto, True, "stale", holding=False, epoch=1, current_epoch=2) is None
    # the same epoch, or either unknown: applied
    for epoch, current in ((2, 2), (None, 2), (1, None)):
        change = policy_change(auto, True, "m", holding=False, epoch=epoch, current_epoch=current)
        assert change is not None and change.take


def test_holding_takes_zero_us_and_forgets_why_it_could_not_before():
    was = WakeSetting(auto=True, requested_us=None, auto_reason="old", unavailable_reason="denied")
    assert policy_change(was, True, "m missed its SLO", holding=False) == WakeChange(
        WakeSetting(auto=True, requested_us=0, auto_reason="m missed its SLO"), take=True
    )


def test_holding_while_held_changes_only_the_reason():
    held = WakeSetting(auto=True, requested_us=0, auto_reason="a")
    assert policy_change(held, True, "b", holding=True) == WakeChange(
        WakeSetting(auto=True, requested_us=0, auto_reason="b")
    )


def test_releasing_drops_the_request_and_keeps_why_it_could_not_be_made():
    held = WakeSetting(auto=True, requested_us=0, auto_reason="a", unavailable_reason="denied")
    for holding in (True, False):
        assert policy_change(held, False, "dropped", holding=holding) == WakeChange(
            WakeSetting(auto=True, auto_reason="dropped", unavailable_reason="denied"), drop=True
        )


def test_in_force_is_the_requested_limit_while_held():
    assert in_force_us(WakeSetting(requested_us=5), held=True) == 5
    assert in_force_us(WakeSetting(requested_us=5), held=False) is None
    assert in_force_us(WakeSetting(), held=False) is None


def test_auto_plans_for_zero_us_wherever_the_request_can_be_made():
    auto = wake_setting("auto")
    holding = WakeSetting(auto=True, requested_us=0)
    # whether the policy holds the CPUs awake now does not matter
    assert planned_us(auto, held=False, may_request=True) == 0
    assert planned_us(holding, held=True, may_request=True) == 0
    assert planned_us(holding, held=True, may_request=False) is None
    assert planned_us(auto, held=False, may_request=False) is None


def test_a_fixed_setting_plans_for_what_is_in_force():
    assert planned_us(wake_setting(30), held=True, may_request=False) == 30
    assert planned_us(wake_setting(30), held=False, may_request=True) is None
    assert planned_us(wake_setting(None), held=False, may_request=True) is None
