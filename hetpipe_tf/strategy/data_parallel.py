"""`DataParallel`: how the strategy does data parallelism over unequal devices
(docs/hetseq.md)."""

from __future__ import annotations

import enum

from hetpipe_tf._args import parse_enum

__all__ = ["DataParallel"]


class DataParallel(enum.Enum):
    """How the strategy does data parallelism over unequal devices."""

    WSP = "wsp"         # virtual workers (pipelines) through parameter servers (HetPipe)
    HETSEQ = "hetseq"   # every device the whole model, a share of each batch by its speed
    # WSP with every batch split into one share per VW by its throughput (ps/split.py): a
    # faster VW takes a larger minibatch instead of more minibatches.
    WSP_SPLIT = "wsp_split"

    @classmethod
    def parse(cls, value: "DataParallel | str") -> "DataParallel":
        return parse_enum(cls, value, arg="data_parallel", what="data_parallel mode")
