"""`executor.api.train` under real torchrun (gloo, CPU): every registered schedule reproduces the single-process
reference, losses and final parameters, for a convolutional net (model= + even split) and a model whose layers
have different widths (stages=, an uneven split: every boundary has its own shape), on 2 and 4 ranks.

Both models under all schedules run in the session's shared launch of each world size (tests/launch_shared.py,
tests/workers/api_every_schedule.py): torchrun's start-up is paid twice, not once per schedule, model or module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

import schedules
from tests.launch_shared import register_call
from tests.workers.api_every_schedule import every_schedule

ROOT = Path(__file__).parent.parent
RTOL = 1e-5  # float32: the pipeline sums microbatch gradients in another order than the full batch
MODELS = ("conv", "widths")  # tests/workers/api_every_schedule.py's examples


def _torchrun(nproc: int, script: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(script),
           *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def every_schedule_reports_on_rank(folder: Path, *models: str) -> None:
    """Rank side, in the session's shared launch (tests/workers/shared_ranks.py): every model under every
    schedule (tests/workers/api_every_schedule.py); rank 0 writes {model: {schedule: comparison}}."""
    report = {which: every_schedule(which) for which in models}
    if dist.get_rank() == 0:
        (folder / "report.json").write_text(json.dumps(report))


# both models under all schedules, in the shared launch of each world size (tests/launch_shared.py): torchrun's
# start-up is paid once per world size for this module and the others, not once per schedule, model or module
API_CASES = {n: register_call(f"api_{n}ranks", n, f"{__name__}:every_schedule_reports_on_rank", *MODELS)
             for n in (2, 4)}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def every_schedule_reports(request, shared_launches) -> dict[str, dict]:
    """{model: {schedule: comparison with the reference}} from `request.param` ranks."""
    folder = shared_launches.case(API_CASES[request.param]).check()
    return json.loads((folder / "report.json").read_text())


@pytest.mark.parametrize("model", MODELS)
def test_every_schedule_trains_like_the_single_process_reference(model, every_schedule_reports):
    report = every_schedule_reports[model]
    assert sorted(report) == sorted(schedules.names())  # a new registered schedule is picked up with no edit here
    for name, run in report.items():
        assert run["names"] == run["ref_names"] and run["names"], name  # every parameter, under its full name
        assert run["moved"] > 0, name  # training moved every parameter: the comparison is not of untouched values
        assert run["max_param_rel"] < RTOL, (name, run["max_param_rel"])
        assert len(run["losses"]) == len(run["ref_losses"]) == 2, name
        for got, want in zip(run["losses"], run["ref_losses"], strict=True):
            assert got == pytest.approx(want, rel=RTOL), name


def test_the_documented_example_runs_under_torchrun(tmp_path):
    """docs/your_model.md's complete example (examples/train_with_api.py), as written there."""
    proc = _torchrun(2, ROOT / "examples" / "train_with_api.py", str(tmp_path / "timeline.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("1f1b:")]
    assert len(lines) == 1, proc.stdout  # rank 0 alone prints
    losses = [float(x) for x in lines[0].split("losses ")[1].split(";")[0].split(", ")]
    assert len(losses) == 4 and losses[-1] < losses[0]
    from pipesim.timeline import Timeline

    tl = Timeline.read(str(tmp_path / "timeline.json"))
    assert tl.source == "measured" and tl.num_ranks == 2
    assert sum(1 for e in tl.events if e.stream == "compute" and e.kind == "F") == 2 * 4 * 4  # stages x m x steps


def test_bad_arguments_are_one_line_errors_before_any_group_is_built():
    """What `train` checks before touching the process group (a world of one, no torchrun)."""
    from torch import nn

    from executor.api import train
    from pipesim.errors import PipesimError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        layers = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        batch = lambda step: (__import__("torch").randn(4, 4), __import__("torch").randn(4, 4))  # noqa: E731
        with pytest.raises(PipesimError, match="not both or neither"):
            train("1f1b", [layers], model=layers, loss_fn=None, batches=batch, steps=1, microbatches=2)
        with pytest.raises(PipesimError, match="has 1 stages; got 2 stage modules"):
            train("1f1b", list(layers), loss_fn=None, batches=batch, steps=1, microbatches=2)
        with pytest.raises(PipesimError, match="give steps="):
            train("1f1b", model=layers, loss_fn=None, batches=batch, microbatches=2)
        with pytest.raises(PipesimError, match="does not split into dp"):
            train("1f1b", model=layers, loss_fn=None, batches=batch, steps=1, microbatches=3)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
