"""hocc: hierarchical overlapping-ring collectives for torch.distributed.

Drop-in calls with torch.distributed's signatures plus `algo`:
    hocc.all_reduce(t, op=ReduceOp.SUM, group=None, async_op=False, algo="auto")
"""

from hocc.api.collectives import (
    ReduceOp,
    all_gather,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    last_plan,
    plan_for,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
)
from hocc.api.record import dump_record, stats
from hocc.api.validate import HoccError
from hocc.backend.ddp_hook import ddp_comm_hook
from hocc.backend.process_group import HoccProcessGroup, register
from hocc.config import Config, configure, get_config
from hocc.engine.errors import CallMismatchError, CollectiveError
from hocc.engine.group_engines import reset_engines
from hocc.engine.work import Work
from hocc.plan import Plan, make_plan
from hocc.topology import Topology, parse_spec

__version__ = "0.1.0"

register()  # dist.init_process_group("hocc") from here on

__all__ = [
    "CallMismatchError", "CollectiveError", "Config", "HoccError",
    "HoccProcessGroup", "Plan", "ReduceOp", "Topology", "Work", "__version__", "all_gather",
    "all_gather_into_tensor", "all_gather_single", "all_reduce", "configure", "ddp_comm_hook", "dump_record",
    "get_config",
    "last_plan", "make_plan", "parse_spec", "plan_for", "reduce_scatter", "reduce_scatter_single",
    "reduce_scatter_tensor", "reset_engines", "stats",
]
