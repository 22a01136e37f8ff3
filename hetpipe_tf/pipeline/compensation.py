"""Staleness compensation as one composable value, and the one table of what each part does.

A `Compensation` is made of independent parts (docs/convergence.md says what each changes
in Section 6's argument):

  predicts          weight prediction: forwards read their version moved ahead by the
                    local updates it misses, per tensor while its steps repeat (the gate,
                    pipeline/weight_prediction.py)
  reduces_momentum  the stage optimizers' momentum lowered by the momentum staleness
                    implies (strategy/compensation.py)
  averages          each of N virtual workers' updates scaled by 1/N (strategy/averaging.py)
  correction        a correction of each stage gradient (`Correction`): none, DELAY
                    (DC-ASGD-a, pipeline/delay_compensation.py) or GAP (Gap-Aware,
                    pipeline/gap_aware.py)

`TABLE` has one row per part: the predictor it gives every stage, the trainable-sized copies
that predictor keeps (the `PredictionMemory` the planner charges) and its epoch cost for the
N_m rule (strategy/defaults.py). A composition's predictor and memory are those of its last
part that has a predictor (a correction's predictor extends weight prediction's: its state
holds d and more, so it replaces it); its epoch cost is the lowest its parts measured, else
`EPOCH_COST_UNCOMPENSATED`. The stage-optimizer side of momentum reduction and averaging is
`strategy/compensation.optimizer_adjustment`, which reads the two flags.

Named presets (`Compensation.NONE`, ...; `PRESETS`), as users and binaries spell them:

  NONE      nothing: the paper's rules exactly        PREDICT   predicts
  MOMENTUM  reduces_momentum                          BOTH      PREDICT + MOMENTUM
  AVERAGE   averages                                  ALL       BOTH + AVERAGE
  BOTH_DC   BOTH + Correction.DELAY                   BOTH_GA   BOTH + Correction.GAP

Measured useful (docs/convergence.md "The defaults"): NONE, PREDICT and BOTH are the ones
compared there, and BOTH is the strategy's default (NONE in HetSeq mode); BOTH_GA is the
best measured for momentum SGD across two pipelined VWs. The others are compositions kept
reachable by name. Any other composition is a value too (`Compensation(predicts=True,
averages=True)`, or by name "predict+average"); a correction without prediction corrects
the gradients of versions read as they are (its memory is charged as with prediction, an
upper bound; not measured).

Adding a compensation: a new composition of these parts is one preset line here (or none:
build the value), plus tests. A new gradient correction is one `Correction` member and one
`TABLE` row (with its predictor's factory) here, its predictor class (a `WeightPredictor`
subclass in a module of its own, as delay_compensation.py) and tests. A new part that acts
on the stage optimizers is a field and a row here and its adjustment in
`strategy/compensation.optimizer_adjustment`.

This module loads no TensorFlow (the predictors are imported when a stage's is made), so
the binaries' flag help reads `PRESET_NAMES` from here.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable

from hetpipe_tf._args import parse_enum
from hetpipe_tf.partitioner.cost import PredictionMemory

__all__ = ["Compensation", "Correction", "Part", "TABLE", "PRESETS", "PRESET_NAMES",
           "EPOCH_COST_UNCOMPENSATED"]


class Correction(enum.Enum):
    """A correction of each stage gradient for the updates its weights missed."""

    NONE = "none"
    DELAY = "dc"   # DC-ASGD-a (pipeline/delay_compensation.py)
    GAP = "ga"     # Gap-Aware (pipeline/gap_aware.py)


# Predictor factories: (device, n_m, num_vws, look_ahead) -> the stage's predictor. N, the
# number of virtual workers, scales each VW's step (it stands for every VW's).
def _weight_prediction(device: str, n_m: int, num_vws: int, look_ahead: bool):
    from hetpipe_tf.pipeline.weight_prediction import WeightPredictor
    return WeightPredictor(device, scale=float(num_vws), gated=True)


def _delay_compensation(device: str, n_m: int, num_vws: int, look_ahead: bool):
    from hetpipe_tf.pipeline.delay_compensation import DelayCompensatedPredictor
    return DelayCompensatedPredictor(device, n_m, scale=float(num_vws), look_ahead=look_ahead)


def _gap_aware(device: str, n_m: int, num_vws: int, look_ahead: bool):
    from hetpipe_tf.pipeline.gap_aware import GapAwarePredictor
    return GapAwarePredictor(device, n_m, scale=float(num_vws), look_ahead=look_ahead)


@dataclasses.dataclass(frozen=True)
class Part:
    """One row of `TABLE`: a part of a compensation and what it gives.

    field, setting: the part is on in a Compensation whose `field` equals `setting`.
    predictor: (device, n_m, num_vws, look_ahead) -> the stage's predictor; None: the part
      keeps nothing on the stages.
    memory: the predictor's trainable-sized copies, per_version x (N_m - 1) + constant
      (measured: benchmarks/memory_benchmark.py --compensation, docs/memory.md).
    epoch_cost: relative epochs to a target per minibatch of local staleness with this part
      (docs/convergence.md "The defaults"); None: no better than without compensation.
    """

    field: str
    setting: object = True
    predictor: Callable | None = None
    memory: PredictionMemory | None = None
    epoch_cost: float | None = None


# Relative epochs per minibatch of local staleness without compensation (NONE; AVERAGE does
# nothing for local staleness, and PREDICT alone does not keep momentum SGD from collapsing
# at N_m = 2: digits never reached the target).
EPOCH_COST_UNCOMPENSATED = 2.5

# What each part does (module docstring). Weight prediction keeps one d per pending version
# and the predicted weights (N_m copies); DC and GA keep N_m pending versions' windows of
# updates, 2 N_m - 1 distinct updates plus N_m ms or C*C terms (3 N_m - 1).
TABLE: dict[str, Part] = {
    #   part        is on when                   predictor             memory
    "predict":  Part("predicts", True,           _weight_prediction,  PredictionMemory(1, 1)),
    "momentum": Part("reduces_momentum", True,   epoch_cost=0.25),
    "average":  Part("averages", True),
    "dc":       Part("correction", Correction.DELAY, _delay_compensation, PredictionMemory(3, 2)),
    "ga":       Part("correction", Correction.GAP,   _gap_aware,          PredictionMemory(3, 2)),
}


@dataclasses.dataclass(frozen=True, repr=False)
class Compensation:
    """How the strategy compensates staleness: a composition of parts (module docstring).
    Compare with `==`; `value` is the preset's name (or the parts joined by "+")."""

    predicts: bool = False
    reduces_momentum: bool = False
    averages: bool = False
    correction: Correction = Correction.NONE

    def __post_init__(self):
        for name in ("predicts", "reduces_momentum", "averages"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Compensation.{name} must be True or False. Received: "
                                 f"{name}={getattr(self, name)!r}.")
        object.__setattr__(self, "correction", parse_enum(
            Correction, self.correction, arg="correction", what="gradient correction"))

    @property
    def parts(self) -> tuple[str, ...]:
        """The names of the `TABLE` rows this value is made of, in the table's order."""
        return tuple(n for n, row in TABLE.items() if getattr(self, row.field) == row.setting)

    def _stage_part(self) -> Part | None:
        rows = [TABLE[n] for n in self.parts if TABLE[n].predictor is not None]
        return rows[-1] if rows else None

    @property
    def has_predictor(self) -> bool:
        """Whether stages get a predictor (at N_m > 1: strategy/compensation.predicts)."""
        return self._stage_part() is not None

    def make_predictor(self, device: str, n_m: int, num_vws: int = 1):
        """The predictor of a stage on `device` (None: no part keeps stage state)."""
        part = self._stage_part()
        return None if part is None else part.predictor(device, n_m, num_vws, self.predicts)

    @property
    def memory(self) -> PredictionMemory | None:
        """The copies of a stage's trainable weights its predictor keeps (None: none)."""
        part = self._stage_part()
        return None if part is None else part.memory

    @property
    def epoch_cost(self) -> float:
        """c of the N_m rule (strategy/defaults.py)."""
        costs = [TABLE[n].epoch_cost for n in self.parts if TABLE[n].epoch_cost is not None]
        return min(costs, default=EPOCH_COST_UNCOMPENSATED)

    @property
    def value(self) -> str:
        """The preset's name ("both"), else the parts joined by "+" ("predict+average")."""
        return _NAME_OF.get(self) or "+".join(self.parts)

    @property
    def name(self) -> str:
        return self.value.upper()

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        if self in _NAME_OF:
            return f"Compensation.{self.name}"
        set_fields = [f"{f.name}={_show(getattr(self, f.name))}"
                      for f in dataclasses.fields(self) if getattr(self, f.name) != f.default]
        return f"Compensation({', '.join(set_fields)})"

    @classmethod
    def parse(cls, value) -> Compensation:
        """A Compensation, a preset's name or parts joined by "+" (any case, "-" and "_"
        alike: the rule of hetpipe_tf._args.parse_enum)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().lower().replace("-", "_")
            if key in PRESETS:
                return PRESETS[key]
            tokens = [t.strip() for t in key.split("+")]
            if all(t in TABLE for t in tokens):
                settings = {}
                for t in tokens:
                    settings.setdefault(TABLE[t].field, []).append(TABLE[t].setting)
                if all(len(v) == 1 for v in settings.values()):   # one correction at most
                    c = cls(**{f: v[0] for f, v in settings.items()})
                    return PRESETS.get(_NAME_OF.get(c, ""), c)
        raise ValueError(
            "compensation must be a hetpipe_tf Compensation or its name. Received: "
            f"compensation={value!r}; use one of {list(PRESET_NAMES)} (e.g. "
            "Compensation.PREDICT), or parts joined by '+' from "
            f"{list(TABLE)} (each part once, one correction at most).")


def _show(v) -> str:
    return str(v) if isinstance(v, enum.Enum) else repr(v)


# The named presets (module docstring); a new one is one line here.
Compensation.NONE = Compensation()
Compensation.PREDICT = Compensation(predicts=True)
Compensation.MOMENTUM = Compensation(reduces_momentum=True)
Compensation.BOTH = Compensation(predicts=True, reduces_momentum=True)
Compensation.AVERAGE = Compensation(averages=True)
Compensation.ALL = Compensation(predicts=True, reduces_momentum=True, averages=True)
Compensation.BOTH_DC = Compensation(predicts=True, reduces_momentum=True,
                                    correction=Correction.DELAY)
Compensation.BOTH_GA = Compensation(predicts=True, reduces_momentum=True,
                                    correction=Correction.GAP)

# The presets by name, in the order they are defined above (as users and --help list them).
PRESETS: dict[str, Compensation] = {
    n.lower(): c for n, c in vars(Compensation).items() if isinstance(c, Compensation)}
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)
_NAME_OF: dict[Compensation, str] = {c: n for n, c in PRESETS.items()}
