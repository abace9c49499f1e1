"""Which worker process handles which node in one exchange: a sticky longest-processing-time plan.

Each node's Context lives in exactly one worker (its owner), so a node's messages run where its state
is. Clients differ in cost (Dirichlet partitions give one client 5x the data of another), so a fixed
node -> worker map leaves one worker idle while the other still trains. Before every exchange the pool
re-plans with the cost each node had in the previous message of the same type (measured in the worker):

1. every node with an owner stays there; nodes without one go, most expensive first, to the least-loaded
   worker (longest processing time first);
2. then, while moving one node from the most- to the least-loaded worker (or swapping two nodes between
   them) shortens the longer of the two queues by more than ``min_gain`` (relative), the move or swap
   whose shifted cost is nearest half the gap is made.

Step 2 moves few nodes and only for a real gain, so a stable federation converges to a fixed map and
stops migrating Contexts. Pure function; nothing here touches processes.
"""

from __future__ import annotations

import bisect
from typing import Mapping


def plan(costs: Mapping[int, float], owner: Mapping[int, int], num_workers: int, fixed: frozenset[int] = frozenset(),
         min_gain: float = 0.03, max_moves: int | None = None) -> dict[int, int]:
    """Worker index for every node in ``costs`` (the nodes of this exchange, cost >= 0 each).

    ``owner`` maps nodes to their current worker (missing: the node has none yet); nodes in ``fixed``
    keep their owner whatever the balance (e.g. a node with a message still running)."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    bad = [n for n, c in costs.items() if not c >= 0]
    if bad:
        raise ValueError(f"node cost must be >= 0, got {costs[bad[0]]} for node {bad[0]}")
    loads = [0.0] * num_workers
    out: dict[int, int] = {}
    for node, cost in costs.items():
        w = owner.get(node)
        if w is not None:
            if not 0 <= w < num_workers:
                raise ValueError(f"node {node} is owned by worker {w}, but there are {num_workers} workers")
            out[node] = w
            loads[w] += cost
    for node in sorted((n for n in costs if n not in out), key=lambda n: (-costs[n], n)):
        w = min(range(num_workers), key=lambda i: (loads[i], i))
        out[node] = w
        loads[w] += costs[node]
    moves = 0
    limit = len(costs) if max_moves is None else max_moves
    while moves < limit:
        hi = max(range(num_workers), key=lambda i: (loads[i], -i))
        lo = min(range(num_workers), key=lambda i: (loads[i], i))
        gap = loads[hi] - loads[lo]
        if hi == lo or gap <= 0:
            break
        best = _best_exchange(costs, [n for n, w in out.items() if w == hi and n not in fixed],
                              [n for n, w in out.items() if w == lo and n not in fixed], gap)
        if best is None:
            break
        shift, give, take = best
        if gap - abs(gap - 2 * shift) <= 2 * min_gain * loads[hi]:
            break  # the longest queue would shrink by less than min_gain
        out[give] = lo
        if take is not None:
            out[take] = hi
        loads[hi] -= shift
        loads[lo] += shift
        moves += 1
    return out


def _best_exchange(costs: Mapping[int, float], on_hi: list[int], on_lo: list[int], gap: float
                   ) -> tuple[float, int, int | None] | None:
    """The move (a node from hi to lo) or swap (a from hi, b from lo) whose shifted cost is nearest gap/2,
    as (shift, a, b or None); None when nothing shifts a cost in (0, gap)."""
    best: tuple[float, int, int | None] | None = None
    lo_sorted = sorted(on_lo, key=lambda n: (costs[n], n))
    lo_costs = [costs[n] for n in lo_sorted]
    for a in sorted(on_hi):
        candidates: list[tuple[float, int | None]] = [(costs[a], None)]
        i = bisect.bisect_left(lo_costs, costs[a] - gap / 2)  # swap partners b with c_a - c_b near gap/2
        candidates += [(costs[a] - lo_costs[j], lo_sorted[j]) for j in (i - 1, i) if 0 <= j < len(lo_sorted)]
        for shift, b in candidates:
            if 0 < shift < gap and (best is None or abs(shift - gap / 2) < abs(best[0] - gap / 2)):
                best = (shift, a, b)
    return best


def makespan(costs: Mapping[int, float], assignment: Mapping[int, int], num_workers: int) -> float:
    """The largest total cost any worker gets under ``assignment``."""
    loads = [0.0] * num_workers
    for node, w in assignment.items():
        loads[w] += costs[node]
    return max(loads)
