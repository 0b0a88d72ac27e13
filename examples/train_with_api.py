"""Train your own model with any pipesim schedule from Python: `torchrun --nproc-per-node 2
examples/train_with_api.py [TIMELINE.json]` (docs/your_model.md; tests/test_api.py runs it)."""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from executor.api import train

dist.init_process_group("gloo")
torch.manual_seed(0)  # the same parameters on every rank: each keeps its own stages
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 8))
data = torch.Generator().manual_seed(1)
batches = [(torch.randn(16, 32, generator=data), torch.randn(16, 8, generator=data)) for _ in range(4)]

result = train("1f1b", model=model, split=[3, 2], loss_fn=F.mse_loss, batches=batches, microbatches=4, lr=0.05,
               trace=sys.argv[1] if len(sys.argv) > 1 else False)
if dist.get_rank() == 0:
    print(f"{result.schedule}: losses {', '.join(f'{x:.4f}' for x in result.losses)}; "
          f"step {result.step_time * 1e3:.1f} ms")
dist.destroy_process_group()
