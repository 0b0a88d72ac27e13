"""The machine a schedule runs on: devices, nodes, and the links between them.

Think of a building of rooms (nodes) with desks (devices): colleagues in one room talk over the
room's link (`intra`), rooms talk over the building's network (`inter`). Figures are plain SI units
(bytes/s, seconds, bytes, FLOP/s); `bandwidth` is the effective figure used everywhere, the
datasheet `peak_bandwidth` stays beside it for reference. Presets live in `pipesim/presets/*.toml`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pipesim.errors import PipesimError


@dataclass(frozen=True)
class LinkClass:
    """One kind of link; every device pair of that kind gets its own copy (unless `shared`)."""

    name: str  # "nvlink" | "nvswitch" | "infiniband" | "pcie" | "ethernet" | "loopback" | ...
    bandwidth: float  # bytes/s per direction, effective (used by all cost formulas)
    peak_bandwidth: float  # bytes/s per direction, datasheet
    latency: float  # seconds per message / per ring step
    shared: bool = False  # one medium per node (PCIe through the host, loopback): all transfers contend


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or one CPU process on local-cpu)."""

    name: str
    flops: dict[str, float]  # dtype -> dense peak FLOP/s
    hbm_bandwidth: float  # bytes/s
    memory: int  # bytes
    compute_efficiency: float  # achieved fraction of peak for matmul-heavy stage work
    # kind ("F", "I", "W") -> factor on compute_efficiency for that work (calibrated; None: 1 for all)
    kind_efficiency: dict[str, float] | None = None
    # kind -> factor on hbm_bandwidth for that work's memory traffic (calibrated on CPUs, where a
    # weight-gradient pass streams writes at another rate than a forward reads weights; None: 1 for all)
    kind_memory_efficiency: dict[str, float] | None = None

    def __hash__(self) -> int:  # dict fields: hash by their sorted items so Hardware stays hashable
        kinds = tuple(sorted(self.kind_efficiency.items())) if self.kind_efficiency else None
        mem = tuple(sorted(self.kind_memory_efficiency.items())) if self.kind_memory_efficiency else None
        return hash((self.name, tuple(sorted(self.flops.items())), self.hbm_bandwidth, self.memory,
                     self.compute_efficiency, kinds, mem))


@dataclass(frozen=True)
class Hardware:
    """`num_nodes` nodes of `devices_per_node` identical devices; device ids are global, node-major."""

    name: str
    device: DeviceSpec
    devices_per_node: int
    num_nodes: int
    intra: LinkClass  # inside a node
    inter: LinkClass | None  # across nodes (None for one node)
    per_action_overhead: float = 0.0  # seconds added to every compute action (dispatch; calibrated)
    per_op_overhead: float = 0.0  # seconds per framework op an action runs (eager dispatch, kernel launch)
    backward_op_overhead: float | None = None  # seconds per op of I and W work (autograd's engine); None: per_op
    host_cores: int | None = None  # CPU cores per node when compute runs on host cores (local-cpu)
    node_corun_slowdown: float = 0.0  # fraction of speed lost per other runnable rank on its node (memory, caches)
    oversubscription_slowdown: float = 0.0  # speed lost per runnable rank > host_cores (time_slice: while any waits)
    time_slice: float = 0.0  # seconds: ranks beyond host_cores take turns in slices (0: fluid sharing)
    roofline: str = "max"  # "max": compute and memory traffic overlap (GPUs); "sum": they add up (calibrated CPUs)
    split_backward_overhead: float = 0.0  # seconds added to each split I and W action (runtime bookkeeping)
    split_group_overhead: float = 0.0  # seconds more per weighted op of the stage, on each split W action
    split_graph_overhead: float = 0.0  # seconds per backward op of the stage, on each split I (graph walk)
    send_overhead: float = 0.0  # seconds a SEND holds its rank (posting the isend); idle time, not compute
    late_recv_delay: float = 0.0  # seconds a RECV lasts at least when its message was posted before it began
    oversubscribed_recv_delay: float = 0.0  # seconds added to late_recv_delay when ranks outnumber host_cores
    source: str = ""  # where the figures come from

    @property
    def num_devices(self) -> int:
        return self.devices_per_node * self.num_nodes

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

    def compute_time(self, flops: float, bytes_moved: float, dtype: str, kind: str | None = None,
                     ops: float = 0.0) -> float:
        """Roofline seconds: max(compute-bound, memory-bound) (or their sum) + per-action dispatch overhead.

        `kind` (F, I or W) selects the device's calibrated `kind_efficiency` and `kind_memory_efficiency`
        factors, when it has them; `ops` framework ops cost `per_op_overhead` each on top
        (`backward_op_overhead` for I and W work, when set: autograd runs them without Python dispatch).
        """
        peak = self.device.flops.get(dtype)
        if peak is None:
            raise PipesimError(f"hardware {self.name!r} has no {dtype} FLOP/s figure "
                               f"(has {', '.join(sorted(self.device.flops))})")
        eff = self.device.compute_efficiency
        if kind is not None and self.device.kind_efficiency:
            eff *= self.device.kind_efficiency.get(kind, 1.0)
        compute = flops / (peak * eff)
        bandwidth = self.device.hbm_bandwidth
        if kind is not None and self.device.kind_memory_efficiency:
            bandwidth *= self.device.kind_memory_efficiency.get(kind, 1.0)
        memory = bytes_moved / bandwidth
        per_op = self.per_op_overhead
        if kind in ("I", "W") and self.backward_op_overhead is not None:
            per_op = self.backward_op_overhead
        fixed = self.per_action_overhead + ops * per_op
        if self.roofline == "sum":
            return compute + memory + fixed
        return max(compute, memory) + fixed

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.inter is None:
            d["inter"] = None
        return d


def preset_names() -> list[str]:
    from pipesim.hardware_toml import preset_names as names

    return names()


def load_hardware(spec: str) -> Hardware:
    """A preset name (`dgx-h100`) or a path to a hardware TOML file; PipesimError on bad input."""
    from pipesim.hardware_toml import load_hardware as load

    return load(spec)


def hardware_to_toml(hw: Hardware) -> str:
    """TOML text that `load_hardware` reads back to an equal Hardware."""
    from pipesim.hardware_toml import hardware_to_toml as dump

    return dump(hw)


__all__ = ["DeviceSpec", "Hardware", "LinkClass", "hardware_to_toml", "load_hardware", "preset_names"]
