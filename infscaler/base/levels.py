"""Bounds shared by the pipeline schemas, the request path and the planners, in a module
of its own so that the request path and the CLI's fast client read them without the
pipeline schemas (pydantic).

Priority levels are numbered as Triton numbers them (``model_config.proto``'s
``ModelDynamicBatching.priority_levels``): 1 is the highest, a larger number lower.
"""

#: The largest priority level a pipeline or a request may name.
MAX_PRIORITY_LEVEL = 1_000_000

#: The most instances one unit (partition or stage) may run: the bound of a stage's
#: ``max_instances``, and what the planner and the scaler assume when none is set.
MAX_INSTANCES_PER_UNIT = 16

__all__ = [
    "CPU_WEIGHT_BY_RANK",
    "MAX_INSTANCES_PER_UNIT",
    "MAX_PRIORITY_LEVEL",
    "NICE_BY_RANK",
    "cpu_nice",
    "cpu_weight",
]


#: The nice value of each rank of priority level below the highest one deployed (rank 1:
#: the second-highest level, ...); the last entry holds for every lower rank. Linux CFS
#: gives a runnable task CPU in proportion to its weight (sched(7): nice 0 -> 1024,
#: 10 -> 110, 15 -> 36, 19 -> 15), so an instance of the highest level gets ~9x the CPU
#: of a rank-1 instance it competes with, ~28x of rank 2, ~68x of rank 3 and below.
NICE_BY_RANK = (0, 10, 15, 19)

#: The cgroup v2 ``cpu.weight`` of each rank, as :data:`NICE_BY_RANK` (the highest level
#: at the default 100): the same CFS shares, ``100 x weight(nice) / 1024`` rounded
#: (1024, 110, 36, 15 -> 100, 11, 4, 1), so the two mechanisms compare like for like.
CPU_WEIGHT_BY_RANK = (100, 11, 4, 1)


def _ranks(levels: dict[str, int]) -> dict[str, int]:
    for name, level in levels.items():
        if not 1 <= level <= MAX_PRIORITY_LEVEL:
            raise ValueError(
                f"pipeline {name!r}: priority level {level} not in 1..{MAX_PRIORITY_LEVEL}"
            )
    ranks = {lv: i for i, lv in enumerate(sorted(set(levels.values())))}
    return {name: ranks[lv] for name, lv in levels.items()}


def cpu_nice(levels: dict[str, int]) -> dict[str, int]:
    """The nice value (0-19) each pipeline's instances run at, from the priority levels of
    the pipelines deployed together (``{pipeline: level}``, 1 the highest).

    The highest level deployed runs at nice 0 whatever its number (a lone pipeline at
    ``priority: 5`` loses nothing); each lower distinct level takes the next entry of
    :data:`NICE_BY_RANK`. Pipelines of one level share one nice value, so equal
    priorities compete at the kernel's equal shares as before.

    Raises:
        ValueError: a level outside 1..:data:`MAX_PRIORITY_LEVEL`.
    """
    last = len(NICE_BY_RANK) - 1
    return {name: NICE_BY_RANK[min(r, last)] for name, r in _ranks(levels).items()}


def cpu_weight(levels: dict[str, int]) -> dict[str, int]:
    """The cgroup v2 ``cpu.weight`` each pipeline's cgroup gets, by rank as
    :func:`cpu_nice` (:data:`CPU_WEIGHT_BY_RANK`; the highest level deployed 100).

    Raises:
        ValueError: a level outside 1..:data:`MAX_PRIORITY_LEVEL`.
    """
    last = len(CPU_WEIGHT_BY_RANK) - 1
    return {name: CPU_WEIGHT_BY_RANK[min(r, last)] for name, r in _ranks(levels).items()}
