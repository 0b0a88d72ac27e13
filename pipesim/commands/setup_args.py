"""The flags of what to simulate against (hardware, --cost, links, dp/tp), shared by `simulate` and `sweep`."""

from __future__ import annotations

import argparse

from pipesim.commands.common import int_list, model_config, positive_int
from pipesim.costs import parse_cost_spec
from pipesim.errors import PipesimError
from pipesim.hardware_toml import load_hardware
from pipesim.sim_setup import DEFAULT_HARDWARE, SimSetup


def add_setup_args(parser: argparse.ArgumentParser) -> None:
    """--hardware, --cost, --boundary-bytes, --activation-bytes, --comm, --dp, --tp (model flags separately)."""
    g = parser.add_argument_group("costs and machine")
    g.add_argument("--hardware", metavar="PRESET|FILE",
                   help=f"hardware preset or TOML file (default {DEFAULT_HARDWARE} with a model; none with --cost)")
    g.add_argument("--cost", metavar="SPEC",
                   help="hand-given seconds per microbatch for one rank's share of the model: F=1,B=2 or "
                        "F=1,I=1,W=1 (with v chunks per rank each chunk takes 1/v)")
    g.add_argument("--boundary-bytes", type=int, default=0, metavar="BYTES",
                   help="with --cost: bytes of each activation/gradient message (default 0)")
    g.add_argument("--activation-bytes", type=int, default=0, metavar="BYTES",
                   help="with --cost: bytes stashed per in-flight microbatch (default 0)")
    g.add_argument("--comm", choices=("links", "none"), default=None,
                   help="links: transfers hold the links for latency + bytes/bandwidth; none: free "
                        "(default links when hardware is known)")
    g.add_argument("--dp", type=positive_int, default=1, help="data-parallel replicas per stage (default 1)")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel shards per stage (default 1)")
    g.add_argument("--layer-split", type=int_list, default=None, metavar="N,N,...",
                   help="layers per stage, e.g. 3,2,2,1 (default: even split, earlier stages take the remainder)")


def setup_from_args(args: argparse.Namespace) -> SimSetup:
    """Turn the shared flags into a SimSetup (loads the hardware, parses --cost)."""
    if args.boundary_bytes < 0 or args.activation_bytes < 0:
        raise PipesimError("--boundary-bytes and --activation-bytes must be >= 0")
    cost = parse_cost_spec(args.cost) if args.cost else None
    hw_name = args.hardware or (None if cost is not None else DEFAULT_HARDWARE)
    hardware = load_hardware(hw_name) if hw_name else None
    comm = (args.comm or "links") == "links" and hardware is not None
    model = None if cost is not None else model_config(args)
    split = tuple(args.layer_split) if args.layer_split else None
    if split and cost is not None:
        raise PipesimError("--layer-split needs a model (--model), not --cost")
    return SimSetup(hardware, model, cost, args.boundary_bytes, args.activation_bytes, comm, args.dp, args.tp,
                    layer_split=split)
