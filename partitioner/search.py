"""Bottleneck-aware partition search (InfScaler §IV-A, Eq. 1); pure policy code, no ONNX, no I/O.

Given operator complexities ``c_0 .. c_{N-1}`` in topological order and the valid cut
positions, :func:`search_partitions` solves Eq. 1 exactly::

    argmin_{P_1..P_K}  sum_k sigma(P_k)
    s.t.  T_o + (K - 1) T_p <= SLO
          P_k = {c_n | n in [p_{k-1} + 1, p_k], c_n > mean(C_N)}
          P_1 u ... u P_K = C_N

More: docs/architecture.md, "`partitioner/search.py`".
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import operator
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from infscaler.base.errors import PartitionError

__all__ = [
    "SearchResult",
    "evaluate_cuts",
    "max_partitions_for_slo",
    "OBJECTIVES",
    "representative_mask",
    "search_minmax",
    "search_partitions",
]

#: Partition objectives: Eq. 1 (the paper's), the balanced one (least largest partition
#: cost) and the weights-aware balanced one (:func:`search_minmax`).
OBJECTIVES = ("eq1", "minmax", "weights")

#: Bytes crossing each valid cut: a mapping cut -> bytes, or a sequence indexed by cut.
CutBytes = Mapping[int, float] | Sequence[float]

#: Relative tolerance under which two objectives count as equal (choosing K, and plans).
TIE_REL_TOL = 1e-9
#: Absolute tie tolerance, as a fraction of the largest operator cost.
TIE_ABS_TOL_SCALE = 1e-12


@dataclass(frozen=True)
class SearchResult:
    """A partition plan (InfScaler §IV-A); costs in the unit of the input (ms or FLOPs).

    Attributes:
        cuts: ``p_1 < ... < p_{K-1}`` (cut p = between operators p and p+1).
        num_partitions: K.
        objective: ``sum_k sigma(P_k)``.
        sigmas: population std of the representative costs per partition.
        bottleneck: ``B_k = sum P_k`` per partition (Algorithm 1).
        bounds: ``(first, last)`` operator index per partition, inclusive.
        representative: per operator, ``c_n > mean`` (all when costs are equal).
        crossing_bytes: bytes crossing the cuts (the tie-break; 0 without ``cut_bytes``).
    """

    cuts: tuple[int, ...]
    num_partitions: int
    objective: float
    sigmas: tuple[float, ...]
    bottleneck: tuple[float, ...]
    bounds: tuple[tuple[int, int], ...]
    representative: tuple[bool, ...]
    crossing_bytes: float = 0.0
    objective_name: str = "eq1"
    partition_costs: tuple[float, ...] = ()
    partition_weights: tuple[float, ...] = ()


# --------------------------------------------------------------------------- helpers


def _as_costs(costs: Sequence[float]) -> np.ndarray:
    try:
        arr = np.asarray(costs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise PartitionError(
            f"operator costs must be numbers: {exc}",
            hint="check the cost / profiling step that produced them",
        ) from exc
    if arr.ndim != 1:
        raise PartitionError(
            f"operator costs must be a flat list, got an array of shape {arr.shape}",
            hint="pass one cost per operator, in topological order",
        )
    if arr.size == 0:
        raise PartitionError(
            "the model has no operators to partition (empty cost list)",
            hint="check that the model graph has nodes and that costing ran",
        )
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if bad.size:
        i = int(bad[0])
        raise PartitionError(
            f"operator {i} has cost {arr[i]!r}; operator complexities must be finite and >= 0",
            hint="re-run costing / profiling; a negative or NaN time usually means a failed "
            "measurement",
        )
    return arr


def _as_cuts(valid_cuts: Iterable[int], n: int) -> list[int]:
    cuts = set()
    for c in valid_cuts:
        p = operator.index(c)
        if not 0 <= p <= n - 2:
            raise ValueError(f"valid cut {p} is outside 0..N-2 = 0..{n - 2} (N = {n} operators)")
        cuts.add(p)
    return sorted(cuts)


def _as_cut_bytes(cut_bytes: CutBytes | None, cuts: Sequence[int]) -> dict[int, float]:
    """Bytes crossing each valid cut (0 for every cut when ``cut_bytes`` is None)."""
    if cut_bytes is None:
        return dict.fromkeys(cuts, 0.0)
    out: dict[int, float] = {}
    for c in cuts:
        try:
            v = float(cut_bytes[c])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PartitionError(
                f"no crossing byte count for valid cut {c}: {exc!r}",
                hint="pass cut_bytes for every valid cut (OperatorGraph.crossing_bytes)",
            ) from exc
        if not math.isfinite(v) or v < 0:
            raise PartitionError(
                f"cut {c} has crossing bytes {v!r}; they must be finite and >= 0",
                hint="pass OperatorGraph.crossing_bytes(cut) for each valid cut",
            )
        out[c] = v
    return out


def _tie_abs_tol(arr: np.ndarray) -> float:
    return TIE_ABS_TOL_SCALE * float(arr.max())


def _check_time(name: str, value: float | None, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not math.isfinite(value) or value < 0:
        raise PartitionError(
            f"{name} must be a finite number of ms >= 0, got {value!r}",
            hint="re-run profiling, or check the --slo value",
        )


def _latency_ms(t_o_ms: float, t_p_ms: float, k: int) -> float:
    """Predicted end-to-end latency of a K-partition plan: T_o + (K-1) T_p (ms; Eq. 1)."""
    return t_o_ms + (k - 1) * t_p_ms


def _pstdev(values: Sequence[float]) -> float:
    """Population standard deviation (ddof=0); 0 for fewer than two values."""
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def _max_feasible_partitions(rep: np.ndarray, cuts: Sequence[int]) -> int:
    """Largest K such that K partitions, each holding a representative, fit the cuts (greedy)."""
    rep_idx = np.flatnonzero(rep)
    if rep_idx.size == 0:
        return 0
    last_rep = int(rep_idx[-1])
    k, pos = 1, 0  # pos: first operator of the current (last) partition
    while True:
        r = int(rep_idx[np.searchsorted(rep_idx, pos)])  # first representative >= pos
        i = bisect.bisect_left(cuts, r)
        if i == len(cuts) or cuts[i] >= last_rep:
            return k
        pos = cuts[i] + 1
        k += 1


def _pick_k(objectives: dict[int, float], scale: float) -> int:
    """Fewest partitions whose objective ties the best one (rel 1e-9, abs 1e-12 x scale)."""
    best = min(objectives.values())
    abs_tol = TIE_ABS_TOL_SCALE * scale
    for k in sorted(objectives):
        if math.isclose(objectives[k], best, rel_tol=TIE_REL_TOL, abs_tol=abs_tol):
            return k
    raise AssertionError("unreachable")  # pragma: no cover


def _result(
    arr: np.ndarray, rep: np.ndarray, cuts: Sequence[int], nbytes: dict[int, float]
) -> SearchResult:
    n = arr.size
    ends = [*cuts, n - 1]
    starts = [0, *(c + 1 for c in cuts)]
    sigmas, bottleneck, bounds = [], [], []
    for s, e in zip(starts, ends, strict=True):
        vals = arr[s : e + 1][rep[s : e + 1]].tolist()
        sigmas.append(_pstdev(vals))
        bottleneck.append(math.fsum(vals))
        bounds.append((s, e))
    return SearchResult(
        cuts=tuple(int(c) for c in cuts),
        num_partitions=len(ends),
        objective=math.fsum(sigmas),
        sigmas=tuple(sigmas),
        bottleneck=tuple(bottleneck),
        bounds=tuple(bounds),
        representative=tuple(bool(x) for x in rep),
        crossing_bytes=math.fsum(nbytes[c] for c in cuts),
    )


def _with_sizes(res: SearchResult, arr: np.ndarray, w: np.ndarray, name: str) -> SearchResult:
    """``res`` scored as a balanced plan: ``partition_costs`` S_k (every operator's cost
    in partition k), ``partition_weights`` W_k, ``objective`` max_k S_k."""
    s_k = tuple(math.fsum(arr[s : e + 1].tolist()) for s, e in res.bounds)
    w_k = tuple(math.fsum(w[s : e + 1].tolist()) for s, e in res.bounds)
    return dataclasses.replace(
        res, objective=max(s_k), objective_name=name, partition_costs=s_k, partition_weights=w_k
    )


def _infeasible_k(k: int, kmax: int, rep: np.ndarray) -> PartitionError:
    return PartitionError(
        f"cannot make {k} partitions: each partition needs at least one representative "
        f"operator (cost above the mean), and the {int(rep.sum())} representative operators "
        f"and the valid cuts between them allow at most {kmax} partition(s)",
        hint=f"ask for at most {kmax} partitions, or let the search choose the number",
    )


# --------------------------------------------------------------------------- public API


def representative_mask(costs: Sequence[float]) -> np.ndarray:
    """Bool [N]: ``c_n > mean(c)`` (Eq. 1 constraint #2); all when every cost is equal.

    Raises:
        PartitionError: empty costs, or a cost that is negative or not finite.
    """
    arr = _as_costs(costs)
    exact_mean = sum((Fraction(x) for x in arr.tolist()), Fraction(0)) / arr.size
    mean = float(exact_mean)  # correctly rounded: decides every cost != mean exactly
    mask = arr > mean
    for i in np.flatnonzero(arr == mean):
        mask[i] = Fraction(float(arr[i])) > exact_mean
    if not mask.any():
        mask[:] = True
    return mask


def max_partitions_for_slo(t_o_ms: float, t_p_ms: float, slo_ms: float | None, cap: int) -> int:
    """Largest K in ``1 .. cap`` with ``T_o + (K-1) T_p <= SLO`` (ms); ``cap`` without an SLO.

    Raises:
        PartitionError: ``T_o > SLO``, ``cap < 1``, or a negative or non-finite time.
    """
    if cap < 1:
        raise PartitionError(
            f"the maximum number of partitions must be >= 1, got {cap}",
            hint="ask for at least 1 partition",
        )
    _check_time("T_o", t_o_ms)
    _check_time("T_p", t_p_ms)
    _check_time("the SLO", slo_ms, allow_none=True)
    if slo_ms is None:
        return cap
    if t_o_ms > slo_ms:
        raise PartitionError(
            f"the whole model takes {t_o_ms:g} ms on this host, above the SLO of "
            f"{slo_ms:g} ms: no partitioning can meet it",
            hint="raise --slo, use a faster engine, or smaller input shapes",
        )
    if t_p_ms == 0:
        return cap
    extra = (slo_ms - t_o_ms) / t_p_ms  # may overflow to inf for a tiny T_p
    k = cap if not extra < cap else max(1, min(cap, int(math.floor(extra)) + 1))
    # Fix floating-point rounding of the division against the exact check used elsewhere.
    while k > 1 and _latency_ms(t_o_ms, t_p_ms, k) > slo_ms:
        k -= 1
    while k < cap and _latency_ms(t_o_ms, t_p_ms, k + 1) <= slo_ms:
        k += 1
    return k


def search_partitions(
    costs: Sequence[float],
    valid_cuts: Iterable[int],
    *,
    num_partitions: int | None = None,
    max_partitions: int = 4,
    t_o_ms: float = 0.0,
    t_p_ms: float = 0.0,
    slo_ms: float | None = None,
    cut_bytes: CutBytes | None = None,
) -> SearchResult:
    """Solve Eq. 1 exactly by dynamic programming over the valid cuts (InfScaler §IV-A).

    Args:
        costs: ``c_0 .. c_{N-1}`` in topological order (FLOPs or ms; >= 0).
        valid_cuts: allowed cut positions in ``0 .. N-2``.
        num_partitions: fixed K; ``None`` searches K in ``1 .. max_partitions``.
        t_o_ms, t_p_ms, slo_ms: T_o, T_p and the SLO in ms (``slo_ms`` None: no SLO).
        cut_bytes: bytes crossing each valid cut, a tie-break only; None = 0.

    Returns:
        The optimal :class:`SearchResult`. Ties (rel 1e-9 / abs 1e-12 x max cost) go to fewer
        partitions, then the fewest crossing bytes, then the latest cuts.

    Raises:
        PartitionError: invalid costs; K or ``max_partitions`` below 1; ``T_o > SLO``; a
            fixed K beyond the SLO bound or what the representatives and cuts allow.
        ValueError: a valid cut outside ``0 .. N-2``.
    """
    arr = _as_costs(costs)
    n = arr.size
    cuts = _as_cuts(valid_cuts, n)
    nbytes = _as_cut_bytes(cut_bytes, cuts)
    rep = representative_mask(arr)
    k_values = _eq1_k_values(
        rep, cuts, num_partitions, max_partitions, t_o_ms=t_o_ms, t_p_ms=t_p_ms, slo_ms=slo_ms
    )
    bnd, f, back = _eq1_table(arr, rep, cuts, nbytes, max(k_values))
    last = len(bnd) - 1
    objectives = {k: float(f[k, last]) for k in k_values if np.isfinite(f[k, last])}
    if not objectives:  # pragma: no cover - excluded by the feasibility checks above
        raise _infeasible_k(k_values[0], _max_feasible_partitions(rep, cuts), rep)
    k = _pick_k(objectives, float(arr.max()))
    return _result(arr, rep, sorted(_backtrack(back, bnd, k)), nbytes)


def _eq1_k_values(
    rep: np.ndarray,
    cuts: Sequence[int],
    num_partitions: int | None,
    max_partitions: int,
    *,
    t_o_ms: float,
    t_p_ms: float,
    slo_ms: float | None,
) -> list[int]:
    """The K to solve for: ``[num_partitions]``, or 1 .. the least of ``max_partitions``, the
    SLO bound and the feasible maximum.

    Raises:
        PartitionError: as :func:`search_partitions`.
    """
    if num_partitions is not None:
        if num_partitions < 1:
            raise PartitionError(
                f"the number of partitions must be >= 1, got {num_partitions}",
                hint="ask for at least 1 partition",
            )
        slo_cap = max_partitions_for_slo(t_o_ms, t_p_ms, slo_ms, num_partitions)
        if slo_cap < num_partitions:
            k = num_partitions
            raise PartitionError(
                f"K={k} needs T_o + {k - 1} T_p = {_latency_ms(t_o_ms, t_p_ms, k):g} ms > SLO "
                f"{slo_ms:g} ms (T_o = {t_o_ms:g} ms, T_p = {t_p_ms:g} ms); at most "
                f"{slo_cap} partition(s) meet the SLO",
                hint=f"ask for at most {slo_cap} partitions, or raise --slo",
            )
        feasible = _max_feasible_partitions(rep, cuts)
        if feasible < num_partitions:
            raise _infeasible_k(num_partitions, feasible, rep)
        return [num_partitions]
    if max_partitions < 1:
        raise PartitionError(
            f"the maximum number of partitions must be >= 1, got {max_partitions}",
            hint="ask for at least 1 partition",
        )
    k_top = min(
        max_partitions_for_slo(t_o_ms, t_p_ms, slo_ms, max_partitions),
        _max_feasible_partitions(rep, cuts),
    )
    return list(range(1, k_top + 1))


def _eq1_table(
    arr: np.ndarray, rep: np.ndarray, cuts: Sequence[int], nbytes: dict[int, float], kmax: int
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Eq. 1's dynamic program up to ``kmax`` partitions (the module docstring's
    algorithm): ``(bnd, f, back)``, the boundaries ``[-1, *cuts, N-1]``, ``f[k][b]`` the
    least ``sum sigma`` of k partitions covering operators ``0 .. bnd[b]``, and ``back``
    the tie-broken start of the last of them."""
    n = arr.size
    # Boundaries: P[0] = -1 (before the first operator), the valid cuts, P[-1] = N-1.
    # A segment (P[a], P[b]] covers operators P[a]+1 .. P[b]; starts a in 0..V, ends b in 1..V+1.
    bnd = [-1, *cuts, n - 1]
    nb = len(bnd)
    end_index = {p: b for b, p in enumerate(bnd) if b > 0}
    f = np.full((kmax + 1, nb), np.inf)
    f[0, 0] = 0.0
    back = np.zeros((kmax + 1, nb), dtype=np.int64)
    # g[k][b]: crossing bytes of the kept (tie-broken) k-partition prefix ending at P[b].
    g = np.zeros((kmax + 1, nb))
    bnd_bytes = np.array([0.0, *(nbytes[c] for c in cuts), 0.0])
    abs_tol = _tie_abs_tol(arr)
    # Welford state of the representative costs in (P[a], j], for every start a.
    cnt = np.zeros(nb - 1, dtype=np.int64)
    mean = np.zeros(nb - 1)
    m2 = np.zeros(nb - 1)
    rows = np.arange(kmax)
    n_starts = 0  # starts a with P[a] < j
    for j in range(n):
        while n_starts < nb - 1 and bnd[n_starts] < j:
            n_starts += 1
        if rep[j]:
            x = arr[j]
            s = slice(0, n_starts)
            cnt[s] += 1
            delta = x - mean[s]
            mean[s] += delta / cnt[s]
            m2[s] += delta * (x - mean[s])
        b = end_index.get(j)
        if b is None:
            continue
        c = cnt[:b]
        with np.errstate(invalid="ignore", divide="ignore"):
            sig = np.sqrt(np.maximum(m2[:b], 0.0) / c)
        sig[c == 0] = np.inf  # no representative operator: not allowed
        sig[c == 1] = 0.0
        cand = f[:kmax, :b] + sig[None, :]
        best = cand.min(axis=1)  # exact Eq. 1 minimum, as without the tie-break
        # ties with the minimum (math.isclose against it, as _pick_k does)
        thr = best + np.maximum(TIE_REL_TOL * np.abs(best), abs_tol)
        tied = np.isfinite(cand) & (cand <= thr[:, None])
        gb = np.where(tied, g[:kmax, :b], np.inf)
        tied &= gb == gb.min(axis=1)[:, None]  # fewest crossing bytes among the ties
        arg = b - 1 - np.argmax(tied[:, ::-1], axis=1)  # then the latest start
        f[1:, b] = best
        back[1:, b] = arg
        g[1:, b] = g[rows, arg] + bnd_bytes[b]
    return bnd, f, back


def _backtrack(back: np.ndarray, bnd: Sequence[int], k: int) -> list[int]:
    """The cuts of the k-partition plan ending at the last boundary, from the
    back-pointers ``back[j][b]`` (start of the j-th partition ending at ``bnd[b]``), last
    cut first."""
    plan: list[int] = []
    b = len(bnd) - 1
    for j in range(k, 0, -1):
        b = int(back[j, b])
        if j > 1:
            plan.append(bnd[b])
    return plan


# --------------------------------------------------------------------------- balanced


def _segment_table(values: np.ndarray, bnd: Sequence[int]) -> np.ndarray:
    """``T[a, b]`` = sum of ``values`` over operators ``bnd[a]+1 .. bnd[b]`` (a < b)."""
    pre = np.concatenate([[0.0], np.cumsum(values)])
    at = np.array([pre[p + 1] for p in bnd])
    return at[None, :] - at[:, None]


def search_minmax(
    costs: Sequence[float],
    valid_cuts: Iterable[int],
    num_partitions: int,
    *,
    weights: Sequence[float] | None = None,
    slack: float = 0.10,
    cut_bytes: CutBytes | None = None,
) -> SearchResult:
    """Balanced cuts: the least largest partition cost ``max_k S_k`` (Skiena, The Algorithm
    Design Manual §8.5); two exact O(K V^2) programmes: ``S*``, then among plans with every
    ``S_k <= T`` (``S*`` + rel 1e-9, or ``(1 + slack) S*`` with ``weights``) least
    ``sum_k S_k^2`` (with ``weights``, bytes per operator: least ``sum_k W_k x S_k``); ties
    to fewest crossing bytes, then latest cuts.

    Returns:
        A :class:`SearchResult`: ``objective`` ``max_k S_k``, ``objective_name`` ``"minmax"`` /
        ``"weights"``, ``partition_costs``, ``partition_weights`` and Eq. 1's figures.

    Raises:
        PartitionError: invalid costs or weights, K < 1 or above the valid cuts + 1, or a
            negative slack.
        ValueError: a valid cut outside ``0 .. N-2``.
    """
    arr = _as_costs(costs)
    n = arr.size
    cuts = _as_cuts(valid_cuts, n)
    nbytes = _as_cut_bytes(cut_bytes, cuts)
    w, k = _minmax_arguments(n, len(cuts), num_partitions, weights, slack)
    bnd = [-1, *cuts, n - 1]
    nb = len(bnd)
    seg = _segment_table(arr, bnd)
    segw = _segment_table(w, bnd)
    upper = np.triu(np.ones((nb, nb), dtype=bool), 1)  # a < b
    # 1. S*: f[j][b] = min_a max(f[j-1][a], S(a, b))
    f = np.full(nb, np.inf)
    f[0] = 0.0
    for _ in range(k):
        cand = np.where(upper, np.maximum(f[:, None], seg), np.inf)
        f = cand.min(axis=0)
    s_star = float(f[nb - 1])
    tol = TIE_REL_TOL * max(s_star, 1e-300) + _tie_abs_tol(arr)
    limit = s_star * (1.0 + float(slack)) + tol if weights is not None else s_star + tol
    # 2. least secondary sum among plans with every S_k <= limit; ties: bytes, latest cut
    second = segw * seg if weights is not None else seg * seg
    bnd_bytes = np.array([0.0, *(nbytes[c] for c in cuts), 0.0])
    back = _least_secondary(second, upper & (seg <= limit), upper, bnd_bytes, k)
    plan = _backtrack(back, bnd, k)
    plan.sort()
    res = _result(arr, representative_mask(arr), plan, nbytes)
    return _with_sizes(res, arr, w, "weights" if weights is not None else "minmax")


def _minmax_arguments(
    n: int,
    n_cuts: int,
    num_partitions: int,
    weights: Sequence[float] | None,
    slack: float,
) -> tuple[np.ndarray, int]:
    """Checked weights (zeros for None) and K; raises as :func:`search_minmax`."""
    if weights is not None:
        w = _as_costs(weights)
        if w.size != n:
            raise PartitionError(
                f"{w.size} weight sizes for {n} operators",
                hint="pass one weight byte count per operator (0 for none)",
            )
    else:
        w = np.zeros(n)
    if not (isinstance(slack, int | float) and math.isfinite(slack) and slack >= 0):
        raise PartitionError(f"slack must be a number >= 0, got {slack!r}")
    k = operator.index(num_partitions)
    if k < 1:
        raise PartitionError(
            f"the number of partitions must be >= 1, got {k}", hint="ask for at least 1"
        )
    if k > n_cuts + 1:
        raise PartitionError(
            f"cannot make {k} partitions with {n_cuts} valid cut(s)",
            hint=f"ask for at most {n_cuts + 1} partitions",
        )
    return w, k


def _least_secondary(
    second: np.ndarray, ok: np.ndarray, upper: np.ndarray, bnd_bytes: np.ndarray, k: int
) -> np.ndarray:
    """Step 2 of :func:`search_minmax`: the least sum of ``second[a, b]`` over k
    segments allowed by ``ok``, ties to the fewest crossing bytes (``bnd_bytes`` per
    boundary), then the latest start; the back-pointers ``back[j][b]``."""
    nb = len(bnd_bytes)
    g = np.full(nb, np.inf)  # secondary sum of the best j-partition prefix ending at b
    h = np.zeros(nb)  # its crossing bytes
    g[0] = 0.0
    back = np.zeros((k + 1, nb), dtype=np.int64)
    abs2 = TIE_ABS_TOL_SCALE * float(np.max(second[upper], initial=0.0))
    for j in range(1, k + 1):
        cand = np.where(ok, g[:, None] + second, np.inf)
        best = cand.min(axis=0)
        thr = best + np.maximum(TIE_REL_TOL * np.abs(best), abs2)
        tied = np.isfinite(cand) & (cand <= thr[None, :])
        hb = np.where(tied, h[:, None], np.inf)
        tied &= hb == hb.min(axis=0)[None, :]
        arg = nb - 1 - np.argmax(tied[::-1, :], axis=0)  # the latest start
        back[j] = arg
        h = h[arg] + bnd_bytes
        g = best
    return back


def evaluate_cuts(
    costs: Sequence[float],
    valid_cuts: Iterable[int],
    cuts: Iterable[int],
    *,
    weights: Sequence[float] | None = None,
    cut_bytes: CutBytes | None = None,
) -> SearchResult:
    """The figures of given cuts (``objective_name`` ``"given"``, objective ``max_k S_k``).

    Raises:
        PartitionError: invalid costs, or a cut that is not a valid cut.
        ValueError: a valid cut outside ``0 .. N-2``.
    """
    arr = _as_costs(costs)
    n = arr.size
    valid = set(_as_cuts(valid_cuts, n))
    plan = sorted({operator.index(c) for c in cuts})
    bad = [c for c in plan if c not in valid]
    if bad:
        raise PartitionError(
            f"cuts {bad} are not valid cut positions of this model",
            hint="cut only where one set of tensors crosses (OperatorGraph.valid_cuts)",
        )
    nbytes = _as_cut_bytes(cut_bytes, plan)
    w = np.zeros(n) if weights is None else np.asarray(weights, dtype=float)
    res = _result(arr, representative_mask(arr), plan, nbytes)
    return _with_sizes(res, arr, w, "given")


def brute_force(
    costs: Sequence[float],
    valid_cuts: Iterable[int],
    num_partitions: int,
    cut_bytes: CutBytes | None = None,
) -> SearchResult:
    """Eq. 1 for a fixed K by enumerating every set of K-1 valid cuts: the test oracle of
    :func:`search_partitions` (small inputs), with the same tie key.

    Raises:
        PartitionError: invalid costs, ``num_partitions < 1``, or no feasible plan.
        ValueError: a valid cut outside ``0 .. N-2``.
    """
    arr = _as_costs(costs)
    n = arr.size
    cuts = _as_cuts(valid_cuts, n)
    nbytes = _as_cut_bytes(cut_bytes, cuts)
    if num_partitions < 1:
        raise PartitionError(
            f"the number of partitions must be >= 1, got {num_partitions}",
            hint="ask for at least 1 partition",
        )
    rep = representative_mask(arr)
    plans: list[tuple[float, tuple[int, ...]]] = []
    for combo in itertools.combinations(cuts, num_partitions - 1):
        starts = [0, *(c + 1 for c in combo)]
        ends = [*combo, n - 1]
        total = 0.0
        for s, e in zip(starts, ends, strict=True):
            vals = arr[s : e + 1][rep[s : e + 1]]
            if vals.size == 0:
                break
            total += float(np.std(vals)) if vals.size > 1 else 0.0
        else:
            plans.append((total, combo))
    if not plans:
        raise _infeasible_k(num_partitions, _max_feasible_partitions(rep, cuts), rep)
    least = min(total for total, _ in plans)
    abs_tol = _tie_abs_tol(arr)
    tied = [c for t, c in plans if math.isclose(t, least, rel_tol=TIE_REL_TOL, abs_tol=abs_tol)]
    best = min(tied, key=lambda c: (math.fsum(nbytes[x] for x in c), [-x for x in reversed(c)]))
    return _result(arr, rep, best, nbytes)
