"""The machine a schedule runs on: devices, nodes, and the links between them.

Think of a building of rooms (nodes) with desks (devices): colleagues in one room talk over the
room's link (`intra`), rooms talk over the building's network (`inter`). Figures are plain SI units
(bytes/s, seconds, bytes, FLOP/s); `bandwidth` is the effective figure used everywhere, the
datasheet `peak_bandwidth` stays beside it for reference. CPU processes that share a host's cores
(the calibrated `local-cpu` file) carry a `HostProfile` as well; every other preset has none.

Each field is declared once, here: its metadata (`kind`, `unit`, `doc`) drives the TOML reader
and writer (`pipesim.hardware.toml_io`, which also loads the presets in `pipesim/presets/*.toml`).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from pipesim.cost.cost_equation import KINDS, CostEquation, SplitCosts, action_seconds
from pipesim.errors import PipesimError

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter")  # the rings a link's `collective_bandwidth` scales


def file_field(kind: str, unit: str = "", doc: str = "", default: Any = MISSING, **extra: Any) -> Any:
    """A dataclass field with its file metadata. Kinds: str, bool, pos (> 0), nonneg (>= 0), frac (0 < x <= 1),
    posint, flops (dtype -> FLOP/s), kinds (F/I/W -> factor), collectives (NCCL collective -> factor), choice
    (`choices`), section (a nested table)."""
    return field(default=default, metadata={"kind": kind, "unit": unit, "doc": doc, **extra})


@dataclass(frozen=True)
class LinkClass:
    """One kind of link; every device pair of that kind gets its own copy (unless `shared`)."""

    name: str = file_field("str", doc='"nvlink" | "nvswitch" | "infiniband" | "pcie" | "ethernet" | "loopback" | ...')
    bandwidth: float = file_field("pos", "bytes/s", "per direction, effective (used by all cost formulas)")
    # bytes/s per direction, datasheet (a file may leave it out: then equal to bandwidth)
    peak_bandwidth: float = file_field("pos", "bytes/s", "per direction, datasheet", default_from="bandwidth")
    latency: float = file_field("nonneg", "seconds", "per message / per ring step")
    # one medium per node (PCIe through the host, loopback): all transfers contend
    shared: bool = file_field("bool", doc="one medium per node: all transfers contend", default=False)
    # measured: an NCCL collective's bus bandwidth over all_reduce's, per kind (`pipesim calibrate --gpu` with
    # several GPUs); a ring of that kind runs at bandwidth x factor. None: every kind at `bandwidth`
    collective_bandwidth: dict[str, float] | None = file_field(
        "collectives", doc="factor on bandwidth per NCCL collective (its measured busbw / all_reduce's)", default=None)

    def __hash__(self) -> int:  # a dict field: hash by its sorted items so Hardware stays hashable
        kinds = tuple(sorted(self.collective_bandwidth.items())) if self.collective_bandwidth else None
        return hash((self.name, self.bandwidth, self.peak_bandwidth, self.latency, self.shared, kinds))

    def kind_bandwidth(self, kind: str) -> float:
        """Bytes/s a ring of collective `kind` runs at on this link: `bandwidth`, times its measured factor."""
        factors = self.collective_bandwidth or {}
        return self.bandwidth * factors.get(kind, 1.0)


# [device.kernels] figures measured on a board, at its own tensor clock (a power limit beside them does not scale them)
MEASURED_AT_CLOCK = ("matmul_efficiency", "fp8_matmul_efficiency", "flash_forward_efficiency",
                     "flash_backward_efficiency")


@dataclass(frozen=True)
class KernelFigures:
    """Measured figures of the device family's kernel model (`[device.kernels]`, written by `pipesim calibrate
    --gpu`): each one given replaces the family's figure of pipesim/presets/gemm/devices.toml for this hardware."""

    matmul_efficiency: float | None = file_field("frac", doc="best GEMM FLOP/s / dense peak", default=None)
    fp8_matmul_efficiency: float | None = file_field("frac", doc="best FP8 GEMM FLOP/s / FP8 dense peak",
                                                     default=None)
    memory_efficiency: float | None = file_field("frac", default=None, doc="a copy's bytes/s / datasheet HBM")
    kernel_overhead: float | None = file_field("nonneg", "seconds", "per kernel (median empty kernel)",
                                               default=None)
    flash_forward_efficiency: float | None = file_field("frac", doc="flash attention forward FLOP/s / peak",
                                                        default=None)
    flash_backward_efficiency: float | None = file_field("frac", doc="flash attention backward FLOP/s / peak",
                                                         default=None)
    memory_bound_efficiency: float | None = file_field("frac", default=None,
                                                       doc="memory-bound kernels' median bytes/s / datasheet HBM")
    # a board of the family that differs from its reference board (pipesim/presets/gemm/devices.toml): its datasheet
    # HBM, and its power limit, which sets its tensor clock (pipesim.device.power)
    hbm_bandwidth: float | None = file_field("pos", "bytes/s", "this board's datasheet HBM, where it differs from the "
                                             "family's", default=None)
    power_limit: float | None = file_field("pos", "watts", "this board's power limit, where it differs from the "
                                           "family's reference board", default=None)
    source: str = file_field("str", doc="the run the figures come from (each figure's source)", default="")

    def figures(self) -> dict[str, float]:
        """The figures given (name -> value), in declaration order."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "source" and getattr(self, f.name) is not None}


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or one CPU process on local-cpu)."""

    name: str = file_field("str")
    flops: dict[str, float] = file_field("flops", "FLOP/s", "dense peak per dtype")  # dtype -> FLOP/s
    hbm_bandwidth: float = file_field("pos", "bytes/s")
    memory: int = file_field("posint", "bytes")
    compute_efficiency: float = file_field("frac", doc="achieved fraction of peak for stage work")
    # kind ("F", "I", "W") -> factor on compute_efficiency for that work (calibrated; None: 1 for all)
    kind_efficiency: dict[str, float] | None = file_field("kinds", doc="factor on compute_efficiency per kind",
                                                    default=None)
    # kind -> factor on hbm_bandwidth for that work's memory traffic (calibrated on CPUs, where a
    # weight-gradient pass streams writes at another rate than a forward reads weights; None: 1 for all)
    kind_memory_efficiency: dict[str, float] | None = file_field("kinds", doc="factor on hbm_bandwidth per kind",
                                                           default=None)
    # the pipesim/presets/gemm/devices.toml profile ("A100", "H100", ...) that times each kernel from its
    # shape (pipesim.cost.kernel_costs); "" (CPU processes, unknown GPUs): the roofline at compute_efficiency
    family: str = file_field("str", doc="device profile timing kernels by shape (empty: compute_efficiency)",
                             default="")
    # measured figures over the family's profile (`pipesim calibrate --gpu`); None: the profile's own
    kernels: KernelFigures | None = file_field("section", doc="measured kernel figures over the family's",
                                               default=None)

    def __hash__(self) -> int:  # dict fields: hash by their sorted items so Hardware stays hashable
        kinds = tuple(sorted(self.kind_efficiency.items())) if self.kind_efficiency else None
        mem = tuple(sorted(self.kind_memory_efficiency.items())) if self.kind_memory_efficiency else None
        return hash((self.name, tuple(sorted(self.flops.items())), self.hbm_bandwidth, self.memory,
                     self.compute_efficiency, kinds, mem, self.family, self.kernels))


@dataclass(frozen=True)
class HostProfile:
    """How CPU processes share a host's cores and talk gloo (calibrated; `[host]` in a hardware file).

    Only hardware whose devices are CPU processes has one; the simulator then runs its host plug-ins
    (`pipesim.sim.host`: core sharing, SEND posting, late RECVs). Seconds and fractions.
    """

    cores: int = file_field("posint", doc="CPU cores per node shared by its ranks")
    node_corun_slowdown: float = file_field("nonneg", doc="speed lost per other runnable rank on its node", default=0.0)
    oversubscription_slowdown: float = file_field(
        "nonneg", doc="speed lost per runnable rank beyond the cores (time slices: while any waits)", default=0.0)
    time_slice: float = file_field("nonneg", "seconds", "ranks beyond the cores take turns (0: fluid sharing)",
                             default=0.0)
    send_overhead: float = file_field("nonneg", "seconds", "a SEND holds its rank (posting the isend)", default=0.0)
    late_recv_delay: float = file_field("nonneg", "seconds", "a RECV begun after its SEND lasts at least this",
                                  default=0.0)
    split_backward_overhead: float = file_field("nonneg", "seconds", "added to each split I and W action", default=0.0)
    split_group_overhead: float = file_field("nonneg", "seconds", "per weighted op of the stage, on each split W",
                                       default=0.0)
    split_graph_overhead: float = file_field("nonneg", "seconds", "per backward op of the stage, on each split I",
                                       default=0.0)
    probe_seconds: float = file_field("nonneg", "seconds", "the speed probe on the calibrated machine (0: none)",
                                      default=0.0)
    probe_tolerance: float = file_field("nonneg", doc="probe ratio beyond which this file is another machine's",
                                        default=0.0)
    probe_machine: str = file_field("str", doc="host | CPU model | cores the probe ran on (this one: no check)",
                                    default="")

    @property
    def split_costs(self) -> SplitCosts:
        return SplitCosts(self.split_backward_overhead, self.split_group_overhead, self.split_graph_overhead)


@dataclass(frozen=True)
class Hardware:
    """`num_nodes` nodes of `devices_per_node` identical devices; device ids are global, node-major."""

    name: str = file_field("str")
    device: DeviceSpec = file_field("section")
    devices_per_node: int = file_field("posint")
    num_nodes: int = file_field("posint")
    intra: LinkClass = file_field("section", doc="inside a node")
    inter: LinkClass | None = file_field("section", doc="across nodes (None for one node)", default=None)
    # the network `--nodes N` joins N such nodes with (a single-node preset's family's InfiniBand)
    scale_out: LinkClass | None = file_field("section", doc="network --nodes N joins such nodes with",
                                             default=None)
    # the GPUs one host drives (a torchrun node), where fewer than a node's NVLink domain: GB200 NVL72's 4-GPU trays
    devices_per_host: int | None = file_field("posint", doc="GPUs per host (torchrun node) where fewer than "
                                              "devices_per_node (None: a node is one host)", default=None)
    per_action_overhead: float = file_field("nonneg", "seconds", "added to every compute action (dispatch)",
                                            default=0.0)
    per_op_overhead: float = file_field("nonneg", "seconds", "per framework op an action runs", default=0.0)
    # seconds the GPUs' host takes to launch one op of a MoE layer (pipesim.cost.host_issue); None: its x86 figure
    host_launch: float | None = file_field("pos", "seconds", "host seconds per launched op (None: an x86 host's)",
                                           default=None)
    # seconds per op of I and W work (autograd's engine); None: per_op_overhead
    backward_op_overhead: float | None = file_field("nonneg", "seconds", "per framework op of I and W work",
                                                    default=None)
    # "max": compute and memory traffic overlap (GPUs); "sum": they add up (calibrated CPUs)
    roofline: str = file_field("choice", doc="compute + memory time: max (overlap) or sum", default="max",
                         choices=("max", "sum"))
    source: str = file_field("str", doc="where the figures come from", default="")
    host: HostProfile | None = file_field("section", doc="CPU processes sharing host cores", default=None)

    @property
    def num_devices(self) -> int:
        return self.devices_per_node * self.num_nodes

    @property
    def host_devices(self) -> int:
        """The GPUs of one host (a torchrun node): `devices_per_host`, else a whole node."""
        return self.devices_per_host or self.devices_per_node

    def _check_device(self, device: int) -> None:
        if not 0 <= device < self.num_devices:
            raise PipesimError(
                f"device {device} is outside hardware {self.name!r} "
                f"({self.num_nodes} node(s) x {self.devices_per_node} = {self.num_devices} devices)"
            )

    def node_of(self, device: int) -> int:
        self._check_device(device)
        return device // self.devices_per_node

    def link_between(self, src: int, dst: int) -> LinkClass:
        """The link class a src -> dst transfer uses: intra if same node, else inter."""
        if self.node_of(src) == self.node_of(dst):
            return self.intra
        if self.inter is None:
            raise PipesimError(f"hardware {self.name!r} has no [inter] link between node {self.node_of(src)} "
                               f"and node {self.node_of(dst)}")
        return self.inter

    def link_resources(self, src: int, dst: int) -> tuple[str, ...]:
        """Names of the contended resources (capacity one transfer each) a src -> dst transfer holds.

        Switched links: the sender's tx port and the receiver's rx port, so opposite directions
        overlap (full duplex). Across nodes those ports are the per-device NICs. A shared medium is
        one bus per node that both directions contend for. Same device: nothing.
        """
        if src == dst:
            self._check_device(src)
            return ()
        link = self.link_between(src, dst)
        ns, nd = self.node_of(src), self.node_of(dst)
        if link.shared:
            if ns == nd:
                return (f"n{ns}.{link.name}.bus",)
            return (f"n{ns}.{link.name}.bus", f"n{nd}.{link.name}.bus")
        return (f"n{ns}.d{src}.{link.name}.tx", f"n{nd}.d{dst}.{link.name}.rx")

    def p2p_time(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds of one uncontended transfer: latency + nbytes / bandwidth (0 on the same device)."""
        if src == dst:
            self._check_device(src)
            return 0.0
        link = self.link_between(src, dst)
        return link.latency + nbytes / link.bandwidth

    def cost_equation(self, dtype: str, *, per_kind: bool = True) -> CostEquation:
        """The figures of the compute-time rule for `dtype` work (`per_kind`: with the calibrated kind factors)."""
        peak = self.device.flops.get(dtype)
        if peak is None:
            raise PipesimError(f"hardware {self.name!r} has no {dtype} FLOP/s figure "
                               f"(has {', '.join(sorted(self.device.flops))})")
        dev, eff = self.device, self.device.compute_efficiency
        kinds = dev.kind_efficiency if per_kind else None
        mem = dev.kind_memory_efficiency if per_kind else None
        rates = tuple(peak * (eff * kinds.get(k, 1.0)) if kinds else peak * eff for k in KINDS)
        bandwidths = tuple(dev.hbm_bandwidth * mem.get(k, 1.0) if mem else dev.hbm_bandwidth for k in KINDS)
        return CostEquation(rates, bandwidths, self.roofline, self.per_action_overhead, self.per_op_overhead,
                            self.backward_op_overhead,
                            self.host.split_costs if self.host is not None else SplitCosts())

    def compute_time(self, flops: float, bytes_moved: float, dtype: str, kind: str | None = None,
                     ops: float = 0.0) -> float:
        """Roofline seconds of one action: `pipesim.cost.cost_equation.action_seconds` on this hardware's figures.

        `kind` (F, I or W) selects the device's calibrated `kind_efficiency` and `kind_memory_efficiency`
        factors, when it has them; `ops` framework ops cost `per_op_overhead` each on top
        (`backward_op_overhead` for I and W work, when set: autograd runs them without Python dispatch).
        """
        eq = self.cost_equation(dtype, per_kind=kind in KINDS)
        slot = KINDS.index(kind) if kind in KINDS else 0
        work, moved = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
        work[slot], moved[slot] = flops, bytes_moved
        return action_seconds(eq, work, moved, ops=ops, backward_ops=ops if kind in ("I", "W") else 0.0)

    def with_nodes(self, nodes: int) -> Hardware:
        """`nodes` of these nodes joined by their network (`--nodes`): the [inter] link of a multi-node file,
        else the preset's [scale_out]. Named `<nodes>x-<name>`; the same hardware when `nodes` already match."""
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise PipesimError(f"--nodes must be a positive integer, got {nodes!r}")
        if nodes == self.num_nodes:
            return self
        network = self.inter or self.scale_out
        if network is None and nodes > 1:
            raise PipesimError(f"--nodes {nodes}: hardware {self.name!r} names no network to join nodes with "
                               "(a [scale_out] or [inter] section)")
        base = self.name.split("x-", 1)[1] if self.num_nodes > 1 and "x-" in self.name else self.name
        return replace(self, name=base if nodes == 1 else f"{nodes}x-{base}", num_nodes=nodes,
                       inter=network if nodes > 1 else None)

    def with_domain(self, devices: int) -> Hardware:
        """Each node filled with only `devices` of its GPUs (`--nvlink-domain`): a job that takes part of every NVLink
        domain, as Slurm's --segment places 4-GPU trays within GB200 NVL72 racks. Ranks fill a domain's `devices`
        before the next domain's; named `<name>/<devices>`. Given before `--nodes` joins the domains."""
        if not isinstance(devices, int) or isinstance(devices, bool) or not 1 <= devices <= self.devices_per_node:
            raise PipesimError(f"--nvlink-domain {devices}: hardware {self.name!r} has {self.devices_per_node} "
                               "devices per node; give 1 to that many")
        if devices == self.devices_per_node:
            return self
        if self.num_nodes > 1:
            raise PipesimError(f"--nvlink-domain {devices}: hardware {self.name!r} already joins {self.num_nodes} "
                               "nodes; give a one-node preset and --nodes")
        if self.devices_per_host is not None and devices % self.devices_per_host:
            raise PipesimError(f"--nvlink-domain {devices}: hardware {self.name!r} has {self.devices_per_host} "
                               "devices per host; a domain holds whole hosts")
        return replace(self, name=f"{self.name}/{devices}", devices_per_node=devices)

    def with_power_limit(self, watts: float) -> Hardware:
        """Its GPUs capped at `watts` (`--power-limit`): the board's limit in `[device.kernels]`, which the family's
        rated boards turn into a tensor clock (pipesim.device.power), named `<name>@<watts>W` so that every report
        says so. Needs a GPU device family."""
        if not self.device.family:
            raise PipesimError(f"--power-limit {watts:g}: hardware {self.name!r} has no GPU device family to clock")
        given = self.device.kernels.figures() if self.device.kernels else {}
        if clocked := [f for f in MEASURED_AT_CLOCK if f in given]:
            raise PipesimError(f"--power-limit {watts:g}: hardware {self.name!r} already gives {', '.join(clocked)} "
                               "in [device.kernels], for the board it was measured on; edit the file instead")
        kernels = replace(self.device.kernels or KernelFigures(), power_limit=float(watts))
        if not kernels.source:
            kernels = replace(kernels, source=f"--power-limit {watts:g}")
        return replace(self, name=f"{self.name}@{watts:g}W", device=replace(self.device, kernels=kernels))

    def with_host(self, **changes: Any) -> Hardware:
        """A copy whose host profile has `changes` (the hardware must have one)."""
        if self.host is None:
            raise PipesimError(f"hardware {self.name!r} has no [host] profile to change")
        return replace(self, host=replace(self.host, **changes))

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.inter is None:
            d["inter"] = None
        return d


__all__ = ["MEASURED_AT_CLOCK", "DeviceSpec", "Hardware", "HostProfile", "KernelFigures", "LinkClass", "file_field"]
