"""torch.distributed's communication operations, in one table: what each one is, for the recorder
that wraps them (``lab.rank.calls``, ``lab.rank.callspec``), the records' reader
(``lab.rank.flightrecords``) and the analysis of a hang or a crash (``lab.core.why``,
``lab.core.rankview``). Standard library only: it runs on every host.

An operation is named as the public function names it (``all_reduce``); a record may carry an
older function's name for it (``_all_gather_base``) or ProcessGroup's (``ProcessGroup.allreduce``),
and :data:`CANONICAL` maps those back, so that a rank that calls ``group.allreduce`` meets one that
calls ``dist.all_reduce`` in the same collective.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["collective", "send", "recv", "batch"]


@dataclass(frozen=True)
class Op:
    name: str  # the public function's name (or, for ``public=False``, ProcessGroup's only one)
    kind: Kind = "collective"
    rooted: bool = False  # it has a root: src or dst, a rank of its group
    from_root: bool = False  # its data go from the root to the others (broadcast, scatter)
    reduces: bool = False  # it takes a reduce op, on which every rank must agree
    sizes_differ: bool = False  # the ranks' sizes may differ (objects, all_to_all, a barrier's none)
    # The arguments that say what a rank sends each rank of the group and what it takes from each ("": none):
    # split sizes (all_to_all_single's rows) or lists of a tensor a rank; the ranks' must meet pair by pair.
    peers: tuple[str, str] | None = None
    objects: bool = False  # it takes Python objects, pickled, not tensors
    older: tuple[str, ...] = ()  # older public functions that are the same operation
    methods: tuple[str, ...] = ()  # ProcessGroup's methods that are the same operation
    public: bool = True  # a function of torch.distributed (else a ProcessGroup method only)


OPS: tuple[Op, ...] = (
    Op("send", "send", methods=("send",)),
    Op("recv", "recv", methods=("recv", "recv_anysource")),
    Op("isend", "send"),
    Op("irecv", "recv"),
    Op("send_object_list", "send", objects=True),
    Op("recv_object_list", "recv", objects=True),
    Op("batch_isend_irecv", "batch"),
    Op("broadcast", rooted=True, from_root=True, methods=("broadcast",)),
    Op("all_reduce", reduces=True, methods=("allreduce",)),
    Op("reduce", rooted=True, reduces=True, methods=("reduce",)),
    Op("all_gather", peers=("", "tensor_list"), methods=("allgather",)),
    Op("all_gather_into_tensor", older=("_all_gather_base",), methods=("_allgather_base",)),
    Op("all_gather_single"),  # (FSDP2's)
    Op("gather", rooted=True, peers=("", "gather_list"), methods=("gather",)),
    Op("scatter", rooted=True, from_root=True, peers=("scatter_list", ""), methods=("scatter",)),
    Op("reduce_scatter", reduces=True, methods=("reduce_scatter",)),
    Op("reduce_scatter_tensor", reduces=True, older=("_reduce_scatter_base",), methods=("_reduce_scatter_base",)),
    Op("reduce_scatter_single", reduces=True),  # (FSDP2's)
    Op("all_to_all", sizes_differ=True, peers=("input_tensor_list", "output_tensor_list"),
       methods=("alltoall",)),
    Op("all_to_all_single", sizes_differ=True, peers=("input_split_sizes", "output_split_sizes"),
       methods=("alltoall_base",)),
    Op("all_reduce_coalesced", reduces=True, methods=("allreduce_coalesced",)),
    Op("all_gather_coalesced", methods=("allgather_coalesced",)),
    Op("allgather_into_tensor_coalesced", methods=("allgather_into_tensor_coalesced",), public=False),
    Op("reduce_scatter_tensor_coalesced", methods=("reduce_scatter_tensor_coalesced",), public=False),
    Op("barrier", sizes_differ=True, methods=("barrier",)),
    Op("monitored_barrier", sizes_differ=True, methods=("monitored_barrier",)),
    Op("broadcast_object_list", rooted=True, from_root=True, sizes_differ=True, objects=True),
    Op("all_gather_object", sizes_differ=True, objects=True),
    Op("gather_object", rooted=True, sizes_differ=True, objects=True),
    Op("scatter_object_list", rooted=True, from_root=True, sizes_differ=True, objects=True),
)

METHOD = "ProcessGroup."  # how a record names a method of ProcessGroup's

# What the recorder wraps: torch.distributed's functions (those this torch has), ProcessGroup's methods.
FUNCTIONS: tuple[str, ...] = tuple(name for op in OPS if op.public for name in (op.name, *op.older))
GROUP_METHODS: tuple[str, ...] = tuple(method for op in OPS for method in op.methods)
# The functions whose tensor goes to a peer (what a rank's records count as bytes it sent).
TENSOR_SENDS = frozenset(op.name for op in OPS if op.kind == "send" and not op.objects)


def _named(ops: list[Op]) -> frozenset[str]:
    """Every name a record may give these operations: the function's, older ones, ProcessGroup's."""
    return frozenset(name for op in ops for name in (op.name, *op.older, *(METHOD + m for m in op.methods)))


SENDS = _named([op for op in OPS if op.kind == "send"])
RECEIVES = _named([op for op in OPS if op.kind == "recv"])
P2P = SENDS | RECEIVES
BATCHES = _named([op for op in OPS if op.kind == "batch"])
# A collective's other names -> its own (ProcessGroup's and older functions'), so that records meet.
CANONICAL = {alias: op.name for op in OPS if op.kind == "collective"
             for alias in (*op.older, *op.methods) if alias != op.name}
# Collectives by what their ranks must agree on (their canonical names).
ROOTED = frozenset(op.name for op in OPS if op.rooted)
FROM_ROOT = frozenset(op.name for op in OPS if op.from_root)
REDUCING = frozenset(op.name for op in OPS if op.reduces)
SIZES_DIFFER = frozenset(op.name for op in OPS if op.sizes_differ)
PER_PEER = {op.name: op.peers for op in OPS if op.peers}  # (the arguments: Op.peers)
SPLIT_SIZES = frozenset(op.name for op in OPS if op.peers and op.peers[0].endswith("_split_sizes"))  # (counts)
# The functions whose peer or root is a ``dst`` argument (sends, and what goes to a root), else ``src``.
TO_TARGET = frozenset(op.name for op in OPS if op.kind == "send" or (op.rooted and not op.from_root))


def canonical(op: str) -> str:
    """The operation a record's name stands for: ``ProcessGroup.allreduce`` is ``all_reduce``."""
    name = op.removeprefix(METHOD)
    return CANONICAL.get(name, name)
