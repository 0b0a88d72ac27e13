"""`pipesim run zb-auto|zb-2p`: the workers run the order the simulator times for the run's model, not the
registry's unit-cost one (pipesim/commands/run_orders.py, RunConfig.orders)."""

from __future__ import annotations

import json

import schedules
from executor.run_config import RunConfig, configs_from_json
from pipesim.cli import main
from pipesim.commands.run_orders import order_hardware
from pipesim.model.config import ModelConfig
from pipesim.sim.sim_setup import SimSetup

GPT = ["--model", "gpt", "--hidden", "128", "--layers", "8", "--heads", "4", "--seq", "64", "--vocab", "4096",
       "--batch", "32"]


def test_run_config_carries_the_simulated_order(capsys):
    argv = ["run", "zb-auto,zb-h2", "--nproc", "4", "-m", "8", *GPT, "--backend", "gloo", "--print-config"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    cfg = configs_from_json(text)[0]
    assert [name for name, _ in cfg.orders] == ["zb-auto"]  # only the searched schedules carry an order
    built = cfg.check(4)  # what every worker builds from the JSON
    model = ModelConfig(kind="gpt", hidden=128, layers=8, heads=4, seq=64, vocab=4096, batch=32)
    plain = RunConfig(names=("zb-auto",), microbatches=8, model=model, backend="gloo")
    setup = SimSetup(order_hardware(plain, None, 4), model, job=plain.job_for(4), check_memory=False)
    registry = schedules.build("zb-auto", 4, 8)
    tuned = setup.tuned(registry, setup.costs(registry))
    assert built[0].programs == tuned.programs  # the very order the simulator times
    assert tuned.programs != registry.programs  # here the model's costs change it
    assert setup.simulate(tuned, setup.costs(registry)).makespan < setup.simulate(registry,
                                                                                  setup.costs(registry)).makespan
    assert built[1].programs == schedules.build("zb-h2", 4, 8).programs  # handcrafted: as registered
    assert json.loads(text)[0]["orders"][0][0] == "zb-auto"


def test_a_run_without_searched_schedules_is_unchanged(capsys):
    assert main(["run", "1f1b", "--nproc", "2", "-m", "4", "--backend", "gloo", "--print-config"]) == 0
    assert configs_from_json(capsys.readouterr().out)[0].orders == ()


def test_order_flags_without_an_order_to_search_are_refused(capsys):
    """--hardware and --ilp only cost searched orders: beside none they are refused, not ignored."""
    base = ["run", "--nproc", "2", "-m", "4", "--model", "mlp", "--backend", "gloo", "--print-config"]
    hardware = "--hardware costs the order of zb-auto, zb-2p (and of zb-v with --ilp) only; this run has none to order"
    ilp = "--ilp searches the order of zb-auto, zb-2p, zb-v only; this run has none of them"
    for names, flags, message in (("1f1b", ["--hardware", "dgx-h100"], hardware),
                                  ("zb-v", ["--hardware", "dgx-h100"], hardware),
                                  ("zb-h1", ["--ilp", "2"], ilp)):
        assert main([base[0], names, *base[1:], *flags]) == 2
        assert capsys.readouterr().err == f"pipesim: error: {message}\n"
    # one searched run of a --then chain is enough (the chain is ordered with the first run's flags)
    assert main([base[0], "1f1b", *base[1:], "--hardware", "local-cpu", "--then", "zb-auto"]) == 0
    assert [c.orders != () for c in configs_from_json(capsys.readouterr().out)] == [False, True]


def test_a_run_the_cost_model_refuses_keeps_the_unit_cost_order(capsys):
    """The executor recomputes an MLP; the cost model does not model that: the registry's order runs, said once."""
    argv = ["run", "zb-auto", "--nproc", "2", "-m", "4", "--model", "mlp", "--recompute", "full", "--backend", "gloo",
            "--print-config"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert configs_from_json(out.out)[0].orders == ()
    assert out.err.startswith("pipesim run: zb-auto keeps its unit-cost order: the cost model refuses this run")


def test_run_zb_v_with_ilp_carries_the_v_search_order(capsys):
    """`pipesim run zb-v --ilp S`: the workers get the V order the search returned for the run's costs (without
    --ilp zb-v keeps its handcrafted order and carries none)."""
    argv = ["run", "zb-v", "--nproc", "2", "-m", "2", *GPT, "--backend", "gloo", "--print-config"]
    assert main(argv) == 0
    assert configs_from_json(capsys.readouterr().out)[0].orders == ()
    assert main([*argv, "--ilp", "20"]) == 0
    cfg = configs_from_json(capsys.readouterr().out)[0]
    assert [name for name, _ in cfg.orders] == ["zb-v"]
    model = ModelConfig(kind="gpt", hidden=128, layers=8, heads=4, seq=64, vocab=4096, batch=32)
    plain = RunConfig(names=("zb-v",), microbatches=2, model=model, backend="gloo")
    setup = SimSetup(order_hardware(plain, None, 2), model, job=plain.job_for(2), check_memory=False,
                     ilp_time_limit=20)
    registry = schedules.build("zb-v", 2, 2)
    tuned = setup.tuned(registry, setup.costs(registry))
    assert tuned.meta["search"] == "ilp-optimal"  # proven: the same order however fast the box
    assert cfg.check(2)[0].programs == tuned.programs != registry.programs
