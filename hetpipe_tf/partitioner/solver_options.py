"""Options and outcomes of the partition search: which exact method, its budgets, and the
two ways a search can end without an answer (out of time; a solver failure)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Sequence

from hetpipe_tf._args import check_int, parse_enum
from hetpipe_tf.partitioner import dp
from hetpipe_tf.partitioner.plan import PartitionError


class TimeLimitReached(Exception):
    """A MILP call ran out of its time budget before finding any layout."""


class SolverError(PartitionError):
    """HiGHS failed (status 3 or 4) under every retried setting: the search could not tell
    whether a layout fits, which is not the same as none fitting."""


class Method(enum.Enum):
    """Which exact method plans: DP when its tables are small enough (AUTO), or always one."""

    AUTO = "auto"
    DP = "dp"
    MILP = "milp"


@dataclasses.dataclass(frozen=True)
class SolverOptions:
    """Knobs of the solver; the defaults solve every order exactly."""

    method: Method = Method.AUTO
    # AUTO uses the DP while one DP check touches at most this many cells (class-count
    # vectors x classes^2 x layers, `dp.work_estimate`); 16 devices in 4 classes of 4 over
    # 1000 layers are 1e7 (~4 s here), 16 distinct classes would be 2.6e11 (MILP then).
    dp_max_work: int = 20_000_000
    max_enumerated_orders: int = 120   # MILP: more distinct orders -> assignment MILP
    time_limit_s: float | None = None  # budget of one search over all orders; None = optimal
    mip_rel_gap: float = 1e-6
    usable_fraction: float = 0.9       # share of device memory a stage may use
    # HiGHS' presolve returned wrong "optimal" layouts at the memory knife edge (checked
    # against an exhaustive search), so it is off by default; on it is 2-3x faster on large
    # models and layouts still fit (re-checked), but may not be optimal.
    presolve: bool = False

    def __post_init__(self) -> None:
        # The value's name ("dp") is accepted too, e.g. from a flag.
        object.__setattr__(self, "method", parse_enum(Method, self.method, arg="method",
                                                      what="planning method"))
        check_int("dp_max_work", self.dp_max_work, minimum=0, hint="e.g. 20_000_000")

    def uses_dp(self, devices: Sequence[Any], num_layers: int) -> bool:
        if self.method is Method.AUTO:
            return dp.work_estimate(devices, num_layers) <= self.dp_max_work
        return self.method is Method.DP
