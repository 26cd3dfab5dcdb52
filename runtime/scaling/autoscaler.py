"""The autoscaler loop: observe -> one pure policy -> act, per pipeline every ``interval_s``.

:meth:`Autoscaler.step` reads a monitor snapshot, calls :func:`~.policy.look` and applies
its decisions through the service (``scale_out`` / ``scale_in``, ``scale_up`` /
``scale_down``, ``shed``); each tick then runs :func:`~.arbitration.arbitrate` between
pipelines and the CPU-wake policy. ``INFSCALER_ARBITRATION=off`` and
``INFSCALER_THREADS=off`` turn those policies off. In full: docs/scaling.md, "The
autoscaler's loop in full"."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
from dataclasses import replace
from typing import Any

from infscaler.base.errors import ServiceError
from infscaler.base.threads import NamedThread
from infscaler.runtime.planning.autoplan import keep_live
from infscaler.runtime.planning.livecheck import LiveState, Observed, Verdict, check
from infscaler.runtime.planning.planner import HANDOVER_MS
from infscaler.runtime.scaling import coreact
from infscaler.runtime.scaling import threads as thread_merge
from infscaler.runtime.scaling.arbitration import (
    ArbitrationConfig,
    ArbitrationState,
    Move,
    PipelineView,
    arbitrate,
    needs_look,
)
from infscaler.runtime.scaling.control import ScaledService
from infscaler.runtime.scaling.idlecurve import LEARN_INTERVAL_S, learn
from infscaler.runtime.scaling.monitor import Monitor
from infscaler.runtime.scaling.placement import pinnable_cores
from infscaler.runtime.scaling.policy import (
    TUNER_LOOKBACK_S,
    Observation,
    Outcome,
    look,
    window_s,
)
from infscaler.runtime.scaling.scaler import is_violated, pipeline_capacity_rps
from infscaler.runtime.scaling.types import Decision, ScalerConfig, ScalerState
from infscaler.runtime.scaling.wakepolicy import WakeEvidence, WakeState, decide_wake, idle_cost
from infscaler.runtime.serving.batching import (
    BOTTLENECK_WITHIN,
    BatchDecision,
    bottlenecks,
    choose_batch,
    decide_batching,
    live_batch_ms,
)

log = logging.getLogger("infscaler.autoscaler")


#: How the cpu cap counts: ``demand`` (default) or ``threads`` (:attr:`ScalerConfig.core_cap`).
CORE_CAP_ENV = "INFSCALER_CORE_CAP"


def core_cap() -> str:
    """The cpu cap's counting from :data:`CORE_CAP_ENV` (``demand`` when unset).

    Raises:
        ValueError: any other value."""
    v = os.environ.get(CORE_CAP_ENV, "demand").strip().lower() or "demand"
    if v not in ("demand", "threads"):
        raise ValueError(f"{CORE_CAP_ENV}={v!r}: use 'demand' (the default) or 'threads'")
    return v


def scaler_config(autoscale: Any) -> ScalerConfig:
    """:class:`ScalerConfig` from a pipeline's ``AutoscaleConfig`` and :func:`core_cap`."""
    return ScalerConfig(
        violation_ratio=autoscale.violation_ratio,
        cooldown_s=autoscale.cooldown_s,
        hold_s=autoscale.hold_s,
        rate_horizon_s=autoscale.rate_horizon_s,
        scale_in_utilisation=autoscale.scale_in_utilisation,
        shed=autoscale.shed,
        settle_s=autoscale.settle_s,
        sustain_s=autoscale.sustain_s,
        oversubscribe=autoscale.oversubscribe,
        core_cap=core_cap(),
    )


class Autoscaler:
    """Runs the scaler for every auto-scaled pipeline of ``service`` in a thread that wakes
    every ``tick_s`` s (each pipeline looked at every its ``autoscale.interval_s``)."""

    def __init__(self, service: ScaledService, tick_s: float = 0.25) -> None:
        self.service = service
        self.tick_s = tick_s
        self._states: dict[str, ScalerState] = {}
        self._threads: dict[str, thread_merge.ThreadsState] = {}  # merges at low concurrency
        self._next: dict[str, float] = {}
        self._learn_next: dict[str, float] = {}
        #: seconds between two :func:`~infscaler.runtime.scaling.idlecurve.learn` per pipeline
        self.learn_interval_s = LEARN_INTERVAL_S
        self._monitors: dict[str, Monitor] = {}
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=200)
        #: decisions applied since the start, (pipeline, action) -> count (``/metrics``)
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._stop = threading.Event()
        self._busy: set[tuple[str, int]] = set()
        self._sent: dict[tuple[int, int], int] = {}
        #: per ``(pipeline, unit index)``: the last batching decision (:meth:`tune_batches`)
        self.batch_decisions: dict[tuple[str, int], BatchDecision] = {}
        #: ``cpu_wake_latency_us: auto``: the wake policy's state and evidence since its look
        self._wake_state = WakeState()
        self._wake_evidence: dict[str, WakeEvidence] = {}
        #: bumped by :meth:`reset_wake`: a decision taken before a reset is not applied
        self.wake_epoch = 0
        #: the live check per pipeline: (the LivePlan judged, its state); a switch
        #: under way for the names in ``_switching``
        self._live: dict[str, tuple[Any, LiveState]] = {}
        self._switching: set[str] = set()
        #: the arbitration: ``INFSCALER_ARBITRATION`` ``off`` or ``lend-only`` (no spares)
        arb_mode = os.environ.get("INFSCALER_ARBITRATION", "on").lower()
        self.arbitration_config = ArbitrationConfig(spare=arb_mode != "lend-only")
        self.arbitration_on = arb_mode != "off"
        self._views: dict[str, PipelineView] = {}
        self._arb = ArbitrationState()
        self._arb_busy = False
        self.moves: collections.Counter[tuple[str, str]] = collections.Counter()
        #: core sets by priority (``INFSCALER_CPU_PRIORITY=cores``; :meth:`keep_cores`)
        self.core_sets = coreact.CoreSetKeeper(coreact.enabled(os.environ))
        self._lock = threading.Lock()
        self._thread = NamedThread(target=self._run, name="isc-autoscaler", daemon=True)

    def start(self) -> Autoscaler:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def pause(self, name: str, seconds: float) -> None:
        """Make no decision for pipeline ``name`` for ``seconds``."""
        with self._lock:
            self._next[name] = max(self._next.get(name, 0.0), time.monotonic() + seconds)

    def resume(self, name: str) -> None:
        """End a :meth:`pause`: the next tick looks at ``name`` again."""
        with self._lock:
            self._next[name] = time.monotonic()

    def forget(self, name: str) -> None:
        """Drop the state of an undeployed pipeline."""
        with self._lock:
            self._states.pop(name, None)
            self._threads.pop(name, None)
            self._next.pop(name, None)
            self._learn_next.pop(name, None)
            self._monitors.pop(name, None)
            self._views.pop(name, None)

    def state(self, name: str) -> ScalerState | None:
        """What the scaler carries for pipeline ``name`` (None: not looked at yet)."""
        with self._lock:
            return self._states.get(name)

    def decisions(self, name: str | None = None) -> list[dict[str, Any]]:
        """The recent decisions (newest last), of one pipeline or all."""
        with self._lock:
            return [d for d in self.history if name is None or d["pipeline"] == name]

    def decision_counts(self) -> dict[tuple[str, str], int]:
        """Decisions applied since the start: (pipeline, action) -> count."""
        with self._lock:
            return dict(self.counts)

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            for dep in self.service.deployments():
                self._learn(dep)
                cfg = dep.pipeline.config
                mark = [
                    u for u in dep.pipeline.units if u.max_batch > 1 and u.batch_policy == "mark"
                ]
                if (cfg.autoscale is None and not mark) or not dep.route.accepting:
                    continue
                now = time.monotonic()
                with self._lock:
                    if now < self._next.get(dep.name, 0.0):
                        continue
                    interval = cfg.autoscale.interval_s if cfg.autoscale else 1.0
                    self._next[dep.name] = now + interval
                try:
                    if cfg.autoscale is not None:
                        self.step(dep)
                    if mark:
                        self.tune_batches(dep)
                except ServiceError as exc:
                    if exc.status != 404:
                        log.exception("autoscaler step for %s failed", dep.name)
                    else:  # undeployed (or replaced) between the look and the action
                        log.info("%s: %s; its decision is dropped", dep.name, exc)
                except Exception:  # noqa: BLE001 - the loop must survive a bad reading
                    log.exception("autoscaler step for %s failed", dep.name)
            try:
                self.arbitrate()
            except Exception:  # noqa: BLE001 - the loop must survive a bad reading
                log.exception("the arbitration between pipelines failed")
            try:
                self.keep_cores()
            except Exception:  # noqa: BLE001
                log.exception("the core sets by priority failed")
            try:
                self.wake()
            except Exception:  # noqa: BLE001
                log.exception("the CPU wake-up decision failed")

    # -- the live check of a planned configuration ------------------------------------------
    def live_state(self, name: str) -> LiveState | None:
        """The live check's state of pipeline ``name`` (None: not checked)."""
        with self._lock:
            got = self._live.get(name)
        return None if got is None else got[1]

    def check_live(self, dep: Any, snap: Any, state: ScalerState) -> Verdict | None:
        """Judge ``dep``'s planned configuration on ``snap``
        (:func:`~infscaler.runtime.planning.livecheck.check`) and apply the verdict: ``switch``
        deploys the other configuration in a thread (make-before-break); once settled after a
        switch, the kept decision is rewritten. Returns the verdict (None: nothing to check, or
        a switch under way)."""
        plan = dep.live
        with self._lock:
            if dep.name in self._switching:
                return None
            got = self._live.get(dep.name)
            live = got[1] if got is not None and got[0] is plan else LiveState()
        since = 0.0 if state.last_change is None else time.monotonic() - state.last_change
        obs = Observed(
            since_change_s=since,
            answered=int(snap.answered or 0),
            capacity_rps=pipeline_capacity_rps(snap),
            p99_ms=snap.p99_ms,
            offered_rps=snap.offered,
            slo_ms=snap.slo_ms,
            instances=tuple(u.total_instances for u in snap.units),
        )
        verdict, new = check(obs, live, plan.serving, plan.other)
        with self._lock:
            self._live[dep.name] = (plan, new)
        if verdict.action == "wait" or (verdict.action == "keep" and live.phase == "settled"):
            return verdict
        self._record(dep.name, {"action": f"live_{verdict.action}", "reason": verdict.reason})
        if verdict.action == "keep":
            if new.switches:
                data = dep.pipeline.config.model_dump(exclude_none=True)
                with contextlib.suppress(Exception):
                    keep_live(plan, data, verdict.reason)
            return verdict
        swapped = plan.swapped(dep.pipeline.config.model_dump(exclude_none=True))
        with self._lock:
            self._switching.add(dep.name)
            self._live[dep.name] = (swapped, new)

        def work() -> None:
            try:
                self.service.switch_configuration(dep, swapped)
            except Exception as exc:  # noqa: BLE001 - the configuration serving stays
                log.exception("%s: the live check's switch failed", dep.name)
                settled = LiveState("settled", new.measured, new.switches, f"switch failed: {exc}")
                with self._lock:
                    self._live[dep.name] = (plan, settled)
            finally:
                with self._lock:
                    self._switching.discard(dep.name)

        NamedThread(target=work, name="isc-live-switch", daemon=True).start()
        return verdict

    def _record(self, name: str, entry: dict[str, Any]) -> None:
        """Keep a decision for ``status`` and ``/metrics``, and log it."""
        with self._lock:
            self.history.append({"pipeline": name, "time": time.time(), **entry})
            self.counts[(name, entry["action"])] += 1
        log.info("%s: %s %s", name, entry["action"], entry.get("reason", ""))

    # -- cpu_wake_latency_us: auto ---------------------------------------------------------
    def wake_state(self) -> WakeState:
        """The wake policy's current state (``hold``, ``reason``, ``since``)."""
        with self._lock:
            return self._wake_state

    def reset_wake(self) -> None:
        """Forget the wake policy's state: a decision :meth:`wake` took before is not applied."""
        with self._lock:
            self._wake_state = WakeState()
            self._wake_evidence.clear()
            self.wake_epoch += 1

    def _note_wake(self, dep: Any, snap: Any, auto: Any) -> None:
        """Keep a violated look at ``dep`` as wake evidence, with its model units' idle cost."""
        with self._lock:
            if self._wake_state.hold:
                return
        if not is_violated(snap, scaler_config(auto)):
            return
        summaries = dep.route.stats.idle_summaries()
        costs = tuple(
            idle_cost(summ) if u.kind == "model" else None
            for u, summ in zip(dep.pipeline.units, summaries, strict=False)
        )
        with self._lock:
            self._wake_evidence[dep.name] = WakeEvidence(dep.name, True, costs)

    def wake(self, now: float | None = None) -> WakeState:
        """One look of the wake policy (:func:`~.wakepolicy.decide_wake`) where the service leaves
        CPU wake-up to it; a change is applied with the epoch it was taken in (ignored by the
        service after a :meth:`reset_wake`), logged and kept."""
        if not getattr(self.service, "cpu_wake_auto", False):
            return self.wake_state()
        slo = sum(1 for d in self.service.deployments() if d.pipeline.config.slo_ms is not None)
        now = time.monotonic() if now is None else now
        with self._lock:
            evidence = list(self._wake_evidence.values())
            self._wake_evidence.clear()
            old = self._wake_state
            new = self._wake_state = decide_wake(now, slo, evidence, old)
            epoch = self.wake_epoch
        if new.hold != old.hold:
            if not self.service.hold_cpus_awake(new.hold, new.reason, epoch=epoch):
                return self.wake_state()  # reset meanwhile: the decision is void
            action = "hold_cpus_awake" if new.hold else "release_cpus_awake"
            self._record("", {"action": action, "reason": new.reason})
        return new

    def _learn(self, dep: Any) -> None:
        """Every :attr:`learn_interval_s` per pipeline, keep the idle slowdown its units served
        (:func:`~.idlecurve.learn`)."""
        now = time.monotonic()
        with self._lock:
            due = self._learn_next.setdefault(dep.name, now + self.learn_interval_s)
            if now < due:
                return
            self._learn_next[dep.name] = now + self.learn_interval_s
        wake = getattr(self.service, "cpu_wake_latency_in_force_us", None)
        try:
            learn(dep, self.service.supervisor.handles(), wake, HANDOVER_MS)
        except Exception:  # noqa: BLE001 - learning must never stop the loop
            log.debug("keeping the idle slowdown of %s failed", dep.name, exc_info=True)

    def tune_batches(self, dep: Any) -> dict[int, int]:
        """Batching by measurement for every ``policy: mark`` unit of ``dep``: on only at a
        bottleneck and where it pays within the unit's SLO share
        (:func:`~infscaler.runtime.serving.batching.decide_batching`), b by MArk §4; sizes sent
        to the instances running another, changes kept (docs/scaling.md, "Dynamic batching").
        Returns ``{instance id: batch}``."""
        slo = dep.pipeline.config.slo_ms
        mon = self._monitor(dep)
        m = mon.pipeline(dep)
        served = [um for um in m.units if dep.route.stage_ids[um.index]]
        measured = [um.compute_p50_ms for um in served if um.compute_p50_ms]
        total = sum(measured) if len(measured) == len(served) else None
        sent: dict[int, int] = {}
        handles = self.service.supervisor.handles()
        loads = {
            um.index: None
            if um.compute_p50_ms is None
            else um.compute_p50_ms * mon.items_per_request(m, um) / max(1, um.ready)
            for um in served
        }
        top = bottlenecks(loads)
        for um in served:
            u = dep.pipeline.units[um.index]
            if u.max_batch <= 1 or u.batch_policy != "mark":
                continue
            share = um.compute_p50_ms / total if total and um.compute_p50_ms else 1 / len(served)
            budget = None if slo is None else slo * share
            mine = [h for h in handles if h.key == (dep.name, u.index) and h.state == "ready"]
            rate = m.arrival_rate * mon.items_per_request(m, um) / max(1, len(mine))
            totals = getattr(self.service.supervisor, "exec_totals", None)
            live = live_batch_ms(totals.get((dep.name, u.index))) if totals is not None else {}
            for h in mine:
                loaded = {int(k): float(v) for k, v in (h.info.get("batch_ms") or {}).items()}
                if 1 not in loaded:
                    continue
                profile = {**loaded, **live}  # what ran, where it ran often enough
                size, delay = self._batch_for(
                    dep.name, u, profile, budget, rate, None if um.index in top else loads
                )
                if self._sent.get((h.iid, h.pid)) != size and self.service.supervisor.command(
                    h, {"cmd": "batch", "size": size, "delay_ms": delay}
                ):
                    self._sent[(h.iid, h.pid)] = size
                    sent[h.iid] = size
        return sent

    def _batch_for(
        self,
        name: str,
        u: Any,
        profile: dict[int, float],
        budget: float | None,
        rate: float,
        elsewhere: dict[int, float | None] | None = None,
    ) -> tuple[int, float]:
        """``(batch size, delay ms)`` for one instance of ``u``, the decision recorded when it
        changed; ``elsewhere``: the units' loads when another unit is the bottleneck (batch 1)."""
        dec = decide_batching(profile, budget, max_batch=u.max_batch)
        if elsewhere is not None and dec.on:
            mine, top = elsewhere[u.index] or 0.0, max(v or 0.0 for v in elsewhere.values())
            dec = dataclasses.replace(
                dec,
                on=False,
                batch_size=1,
                delay_ms=0.0,
                reason=f"off: not the bottleneck (load {mine:.3g} < {BOTTLENECK_WITHIN:g} x "
                f"{top:.3g} ms per request per instance); {dec.reason}",
            )
        old = self.batch_decisions.get((name, u.index))
        self.batch_decisions[(name, u.index)] = dec
        if old is None or (old.on, old.batch_size) != (dec.on, dec.batch_size):
            self._record(
                name,
                {
                    "action": "batch_on" if dec.on else "batch_off",
                    "reason": f"{u.name}: {dec.reason}",
                },
            )
        if not dec.on:
            return 1, 0.0
        if budget is None:
            return dec.batch_size, min(dec.delay_ms, u.batch_delay_ms)
        choice = choose_batch(profile, max(rate, 1e-6), budget, max_batch=u.max_batch)
        return choice.batch_size, min(float(choice.wait_ms), u.batch_delay_ms)

    def _monitor(self, dep: Any) -> Monitor:
        auto = dep.pipeline.config.autoscale
        window = auto.window_s if auto else 10.0
        with self._lock:
            mon = self._monitors.get(dep.name)
            if mon is None or mon.window_s != window:
                mon = self._monitors[dep.name] = Monitor(self.service, window)
            return mon

    def step(self, dep: Any) -> list[Decision]:
        """One look at ``dep``: observe, :func:`~.policy.look`, act; returns the decisions."""
        obs = self._observe(dep)
        out = look(obs)
        self._act(dep, obs, out)
        return out.decisions

    def _observe(self, dep: Any) -> Observation:
        """The :class:`~.policy.Observation` of ``dep``: the monitor's snapshot over
        :func:`~.policy.window_s`, the last look's states (the first look's ``last_change`` is
        the deploy), the threads merge's settings, the offered times (``autoscale.tuner``) and
        whether it is a party to a loan."""
        auto = dep.pipeline.config.autoscale
        mon = self._monitor(dep)
        with self._lock:
            state = self._states.get(dep.name)
            threads = self._threads.get(dep.name, thread_merge.ThreadsState())
            on_loan = any(dep.name in (ln.donor, ln.taker) for ln in self._arb.loans)
        if state is None:
            since = max(0.0, time.time() - getattr(dep, "deployed_at", time.time()))
            state = ScalerState(last_change=time.monotonic() - since)
        window = window_s(auto.window_s, auto.settle_s, state.last_change, time.monotonic())
        snap = mon.snapshot(dep, mon.pipeline(dep, window))
        merge = thread_merge.config_for(auto) if thread_merge.enabled(os.environ) else None
        models = frozenset(i for i, u in enumerate(dep.pipeline.units) if u.kind == "model")
        tuner = getattr(auto, "tuner", False)
        times = dep.route.stats.offered_times(snap.now - TUNER_LOOKBACK_S) if tuner else None
        return Observation(snap, state, scaler_config(auto), threads, merge, models, times, on_loan)

    def _act(self, dep: Any, obs: Observation, out: Outcome) -> None:
        """Keep ``out``'s states and view, run the live check (no decision), note wake evidence,
        then apply and record :attr:`~.policy.Outcome.acts` in order."""
        snap, auto = obs.snapshot, dep.pipeline.config.autoscale
        priority = int(getattr(dep.pipeline.config, "priority", 1) or 1)
        with self._lock:
            self._states[dep.name] = out.state
            if out.threads is not None:
                self._threads[dep.name] = out.threads
            self._views[dep.name] = PipelineView(
                dep.name, priority, snap, out.violated, out.blocked
            )
        if getattr(dep, "live", None) is not None and not out.decisions:
            self.check_live(dep, snap, out.state)
        if out.state.waiting is not None:  # a violation not acted on yet: logged once per run
            level = logging.DEBUG if obs.state.waiting is not None else logging.INFO
            log.log(level, "%s: waiting: %s", dep.name, out.state.waiting)
        if out.tuned is not None and out.tuned.decision is None:
            log.debug("%s: tuner: %s", dep.name, out.tuned.reason)
        held = out.threads.held if out.threads is not None else None
        if held is not None and (obs.threads.held or ("",))[0] != held[0]:
            log.info("%s: threads: no move: %s", dep.name, held[1])
        if getattr(self.service, "cpu_wake_auto", False):
            self._note_wake(dep, snap, auto)
        for actions, entry in out.acts:
            for d in actions:
                self._apply(dep, d)
            if entry is not None:
                self._record(dep.name, entry)

    def _apply(self, dep: Any, d: Decision) -> None:
        """Apply one decision: ``scale_out`` at once; ``scale_in`` and thread steps in a thread,
        one per (pipeline, unit) at a time; ``shed`` sets or lifts the queue bound."""
        if d.action == "scale_out":
            assert d.unit is not None and d.engine is not None
            self.service.scale_out(dep, d.unit, d.engine)
        elif d.action == "scale_in":
            assert d.unit is not None and d.engine is not None
            work = functools.partial(self.service.scale_in, dep, d.unit, d.engine)
            self._one_at_a_time((dep.name, d.unit), work, "isc-scale-in")
        elif d.action in ("scale_up", "scale_down"):
            assert d.unit is not None and d.threads is not None

            def swap() -> None:
                try:
                    self.service.scale_threads(dep, d.unit, d.threads, d.from_threads)
                except Exception:  # noqa: BLE001 - the old instance keeps serving
                    log.exception("%s: %s of unit %s failed", dep.name, d.action, d.unit)

            self._one_at_a_time((dep.name, d.unit), swap, "isc-scale-thr")
        elif d.action == "shed":
            with contextlib.suppress(Exception):
                self.service.set_queue_limit(dep, d.queue_limit, d.reason)

    def _one_at_a_time(self, key: tuple[str, int], work: Any, name: str) -> None:
        """Run ``work()`` in a thread unless one for ``key`` still runs (then nothing)."""
        with self._lock:
            if key in self._busy:
                return
            self._busy.add(key)

        def run() -> None:
            try:
                work()
            finally:
                with self._lock:
                    self._busy.discard(key)

        NamedThread(target=run, name=name, daemon=True).start()

    # -- arbitration between pipelines ------------------------------------------------------
    def arbitration_state(self) -> ArbitrationState:
        """The loans in force between pipelines."""
        with self._lock:
            return self._arb

    def move_counts(self) -> dict[tuple[str, str], int]:
        """Arbitration moves applied since the start: (giver, taker) -> count."""
        with self._lock:
            return dict(self.moves)

    def arbitrate(self) -> list[Move]:
        """One arbitration look over the pipelines' last views when :func:`~.arbitration.needs_look`
        and no move is under way; a move is applied in a thread (:meth:`_move`). Returns the
        moves (none while :attr:`arbitration_on` is False)."""
        if not self.arbitration_on:
            return []
        deps = {
            d.name: d
            for d in self.service.deployments()
            if d.pipeline.config.autoscale is not None and d.route.accepting
        }
        with self._lock:
            if self._arb_busy:
                return []
            views = [v for n, v in self._views.items() if n in deps]
            if not needs_look(views, self._arb, self.arbitration_config):
                return []
            moves, new = arbitrate(views, self._arb, self.arbitration_config)
            self._arb = new
            if moves:
                self._arb_busy = True
                for m in moves:  # both are looked at anew before the next move
                    self._views.pop(m.giver, None)
                    self._views.pop(m.taker, None)
        for m in moves:
            NamedThread(
                target=self._move, args=(m, deps), name="isc-arbitrate", daemon=True
            ).start()
        return moves

    def keep_cores(self) -> None:
        """One look of the core sets by priority (:class:`~.coreact.CoreSetKeeper`, on
        with ``INFSCALER_CPU_PRIORITY=cores``): every deployed pipeline's level, the risk of
        each auto-scaled one from its last view (:func:`~.coreact.risk_of`), the
        instances; its changes are kept with the decisions."""
        if not self.core_sets.on:
            return
        deps = self.service.deployments()
        levels = {d.name: int(getattr(d.pipeline.config, "priority", 1) or 1) for d in deps}
        with self._lock:
            views = dict(self._views)
        calm = self.arbitration_config.release_ratio
        risk = {n: coreact.risk_of(views.get(n), calm) for n in levels}
        device = getattr(self.service, "device", None)
        cores = pinnable_cores(sorted(os.sched_getaffinity(0)), device)
        handles = self.service.supervisor.handles()
        for name, entry in self.core_sets.step(time.monotonic(), cores, levels, risk, handles):
            self._record(name, entry)

    def _move(self, m: Move, deps: dict[str, Any]) -> None:
        """Apply one move: the giver's scale-in (until its instance exited), then the taker's
        scale-out, each recorded and counted as a change for both; a failed half ends the loan."""
        ok = False
        try:
            giver, taker = deps[m.giver], deps[m.taker]
            what = {"kind": m.kind, "giver": m.giver, "taker": m.taker, "reason": m.reason}
            if m.give:
                if not self.service.scale_in(giver, m.give_unit, m.give_engine):
                    log.info("%s: arbitration: no instance to give; move dropped", m.giver)
                    return
                entry = {"action": "arbitrate_give", "unit": m.give_unit, "engine": m.give_engine}
                self._record(m.giver, {**entry, **what})
            self.service.scale_out(taker, m.take_unit, m.take_engine)
            entry = {"action": "arbitrate_take", "unit": m.take_unit, "engine": m.take_engine}
            self._record(m.taker, {**entry, **what})
            ok = True
        except Exception:  # noqa: BLE001 - the loop must survive a failed move
            log.exception("arbitration move %s -> %s failed", m.giver, m.taker)
        finally:
            now = time.monotonic()
            with self._lock:
                if ok:
                    self.moves[(m.giver, m.taker)] += 1
                elif m.kind == "lend":  # nothing was lent: no loan to give back
                    loans = tuple(
                        ln for ln in self._arb.loans if (ln.donor, ln.taker) != (m.giver, m.taker)
                    )
                    self._arb = ArbitrationState(loans)
                for name in (m.giver, m.taker):
                    st = self._states.get(name)
                    if st is not None:
                        self._states[name] = replace(st, last_change=now, violating_since=None)
                self._arb_busy = False
