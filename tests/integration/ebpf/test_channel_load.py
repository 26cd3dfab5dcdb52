"""Control channel under load, with real processes (both channels).

Producers and consumers are separate processes (``python -m tests.channelload``)
that inherit only their instance socket; on the eBPF channel they drop to uid 65534
with no capability before the first token. The test process is the manager: it turns
every FREE (acknowledgement) into a credit for the producer that owns the request id
(tokens are credits: at most ``CREDITS`` unacknowledged per producer, notes pitfall 3).

What is checked: no loss and no duplicate (each request id acknowledged exactly once,
and each consumer's own record of what it received), the configured balance, a consumer
killed mid-stream (its tokens reclaimed and re-routed, the producers finish), and that
every process ends by itself (all waits are bounded).
"""

from __future__ import annotations

import array
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infscaler.ebpf import open_channel
from infscaler.ebpf.channel import Channel
from tests.channelload import Pump, Worker, spawn

CREDITS = 1024
PRODUCERS = {100: 0, 101: 1 << 32}  # instance -> base request id
CONSUMERS = (1, 2, 3)
DEADLINE_S = 120.0  # a bound, not a performance assertion


@pytest.fixture
def fleet(
    kind: str, tmp_path: Path
) -> Iterator[Callable[..., tuple[Channel, list[Worker], list[Worker]]]]:
    """Start a channel with consumers (stage 1) and producers (stage 0); clean up after."""
    state: dict[str, object] = {}

    def start(
        policy: str, per_producer: int, delays_us: dict[int, float] | None = None
    ) -> tuple[Channel, list[Worker], list[Worker]]:
        ch = open_channel(kind, policy)
        drop = kind == "ebpf" and os.geteuid() == 0
        cons = [
            spawn(
                ch,
                "consumer",
                c,
                1,
                out=str(tmp_path / f"consumer{c}.u64"),
                drop_privileges=drop,
                delay_us=(delays_us or {}).get(c, 0),
                timeout=60,
            )
            for c in CONSUMERS
        ]
        prods = [
            spawn(
                ch,
                "producer",
                p,
                0,
                drop_privileges=drop,
                count=per_producer,
                base=base,
                credits=CREDITS,
                timeout=60,
            )
            for p, base in PRODUCERS.items()
        ]
        state.update(ch=ch, workers=cons + prods)
        return ch, cons, prods

    yield start
    for w in state.get("workers", []):  # type: ignore[union-attr]
        if w.proc.poll() is None:
            w.proc.kill()
        w.result(10)
    if "ch" in state:
        state["ch"].close()  # type: ignore[union-attr]


def finish(
    pump: Pump, cons: list[Worker], prods: list[Worker], alive: tuple[int, ...] = CONSUMERS
) -> dict:
    pump.stop_consumers(list(alive))
    results = {
        w.instance: w.result(30)
        for w in cons + prods
        if w.instance in alive or w.role == "producer"
    }
    for iid, r in results.items():
        assert r["returncode"] == 0, f"worker {iid}: {r}"
    return results


def check_privileges_dropped(kind: str, results: dict) -> None:
    if kind == "ebpf" and os.geteuid() == 0:
        for iid, r in results.items():
            assert r["uid"] == 65534 and r["cap_eff"] == 0, f"worker {iid} kept privileges: {r}"
            assert r["bpf_denied"], f"worker {iid} could still create a BPF map"
            assert r["bpf_fds"] == 0, f"worker {iid} holds a BPF map or program fd"


def received(w: Worker) -> array.array:
    return w.received()


def test_million_tokens_round_robin(kind: str, fleet: Callable[..., tuple]) -> None:
    per = 500_000
    total = per * len(PRODUCERS)
    ch, cons, prods = fleet("round-robin", per)
    producers = {p: (base, per) for p, base in PRODUCERS.items()}
    pump = Pump(ch, producers, CREDITS)
    t0 = time.monotonic()
    pump.run(lambda p: p.total >= total, DEADLINE_S, watch=cons + prods)
    elapsed = time.monotonic() - t0
    results = finish(pump, cons, prods)
    check_privileges_dropped(kind, results)

    # no loss, no duplicate: by the acknowledgements the manager saw ...
    assert pump.total == total
    assert pump.duplicates() == 0 and pump.missing() == 0
    assert not pump.undeliverable and not pump.other
    # ... and by what each consumer recorded, independently
    seen: Counter[int] = Counter()
    for w in cons:
        ids = received(w)
        assert len(ids) == results[w.instance]["received"]
        seen.update(ids)
    assert len(seen) == total and max(seen.values()) == 1
    assert set(seen) == {b + i for b in PRODUCERS.values() for i in range(per)}
    for p in prods:
        assert results[p.instance]["sent"] == per

    # balance: a cursor per producer -> each consumer gets per/3 (+-1) of each producer
    counts = [results[c]["received"] for c in CONSUMERS]
    assert max(counts) - min(counts) <= len(PRODUCERS), counts
    for base in PRODUCERS.values():
        per_consumer = [sum(1 for r in received(w) if base <= r < base + per) for w in cons]
        assert max(per_consumer) - min(per_consumer) <= 1, per_consumer

    st = ch.stats()
    assert st["delivered"] == total and st["acked"] == total
    assert st["rejected_total"] == 0 and st["no_instance"] == 0 and st["redirect_failed"] == 0
    assert all(st["instances"][c]["inflight"] == 0 for c in CONSUMERS)
    print(
        f"\n{kind}: {total} tokens, 2 producers -> 3 consumers, round-robin: {elapsed:.1f} s "
        f"({total / elapsed / 1e3:.0f} k tokens/s, acks and credits included); split {counts}"
    )


def test_least_loaded_avoids_a_slow_consumer(kind: str, fleet: Callable[..., tuple]) -> None:
    """Least-loaded equalises in-flight tokens, so each consumer's share follows its
    speed: consumer 3 sleeps 200 us per token (many times slower than the others; 50 us
    left it at 20 % of the tokens once when the whole suite loaded both vCPUs).
    Round-robin would give it 1/3; least-loaded must move most of that to 1 and 2.
    Bounds: slow < 20 %, and each fast one more than twice the slow one (measured on 2
    shared vCPUs: 3-7 % and 43-51 % each). How the fast two split what
    the slow one leaves is the CPU each gets, not the policy: under CI's CPU hog one
    took 0.62 and the other 0.35 with the slow one at 0.03."""
    per = 100_000
    total = per * len(PRODUCERS)
    ch, cons, prods = fleet("least-loaded", per, delays_us={3: 200})
    pump = Pump(ch, {p: (base, per) for p, base in PRODUCERS.items()}, CREDITS)
    pump.run(lambda p: p.total >= total, DEADLINE_S, watch=cons + prods)
    results = finish(pump, cons, prods)
    assert pump.duplicates() == 0 and pump.missing() == 0
    seen: Counter[int] = Counter()
    for w in cons:
        seen.update(received(w))
    assert len(seen) == total and max(seen.values()) == 1
    share = {c: results[c]["received"] / total for c in CONSUMERS}
    assert share[3] < 0.20, share
    assert min(share[1], share[2]) > 2 * share[3], share
    print(f"\n{kind}: least-loaded shares with consumer 3 slow: {share}")


@pytest.mark.parametrize("policy", ["round-robin", "least-loaded"])
def test_consumer_killed_midstream(kind: str, policy: str, fleet: Callable[..., tuple]) -> None:
    per = 50_000
    total = per * len(PRODUCERS)
    victim = 3
    ch, cons, prods = fleet(policy, per, delays_us={victim: 100})
    pump = Pump(ch, {p: (base, per) for p, base in PRODUCERS.items()}, CREDITS)
    state: dict[str, object] = {}

    def kill_when_busy(p: Pump) -> None:
        if "reclaimed" in state or p.acked_by[victim] < 1000:
            return
        w = next(w for w in cons if w.instance == victim)
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait(10)
        state["acked_before"] = p.acked_by[victim]
        reclaimed = ch.remove_instance(victim)  # stop routing to it, take its tokens back
        state["reclaimed"] = reclaimed
        ch.route_many(reclaimed)

    pump.run(lambda p: p.total >= total, DEADLINE_S, on_batch=kill_when_busy, watch=prods)
    alive = tuple(c for c in CONSUMERS if c != victim)
    results = finish(pump, cons, prods, alive)
    reclaimed = state["reclaimed"]
    assert isinstance(reclaimed, list) and len(reclaimed) > 0, "the victim held tokens when killed"
    # (acknowledgements the victim sent just before dying may still arrive after the kill)
    assert pump.acked_by[victim] >= state["acked_before"]

    # every request acknowledged exactly once, the reclaimed ones by the survivors
    assert pump.duplicates() == 0 and pump.missing() == 0
    survivors: Counter[int] = Counter()
    for w in cons:
        if w.instance != victim:
            survivors.update(received(w))
    assert max(survivors.values()) == 1, "no token delivered twice to the survivors"
    assert len(survivors) == total - pump.acked_by[victim]
    assert {t.request for t in reclaimed} <= set(survivors)
    for p in prods:
        assert results[p.instance]["sent"] == per, "the producers kept working"
    st = ch.stats()
    assert st["instances"][victim]["live"] is False
    assert st["instances"][victim]["reclaimed"] == len(reclaimed)
    assert all(st["instances"][c]["inflight"] == 0 for c in alive)
    assert st["rejected_total"] == 0
    # at least once: tokens the victim recorded but had not acknowledged were re-processed
    victim_w = next(w for w in cons if w.instance == victim)
    redone = len(set(received(victim_w)) & {t.request for t in reclaimed})
    print(
        f"\n{kind}/{policy}: killed consumer {victim} after {state['acked_before']} acks; "
        f"{len(reclaimed)} tokens reclaimed and re-routed ({redone} it had started on)"
    )
