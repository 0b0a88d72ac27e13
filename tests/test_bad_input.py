"""Bad input, as a new user types it: every case exits 2 with one line on stderr, no traceback, no file left.

The classes of the 184 malformed inputs of issue 16: malformed flags, schedule CSVs, hardware files,
deadlocks, outputs (missing folder, a folder, wrong suffix, not a regular file, read-only, write-protected),
numeric ranges and work bounds. Each case runs `pipesim`'s entry point (pipesim.cli.main, a SystemExit caught
as the interpreter would) in a fresh folder holding only the inputs it needs; commands that would launch torchrun
must fail before launching (well under a second). One case per command (PROCESS_CASES) also runs as a real
`pipesim` process: a fresh interpreter's stderr (import-time warnings) and exit status, at a start-up each.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipesim.cli import main

PIPESIM = [sys.executable, "-m", "pipesim"]
ROOT = Path(__file__).resolve().parents[1]

DEADLOCK_CSV = "0F1,0B0,0F0,0B1\n1F0,1B0,1F1,1B1\n"  # rank 0 waits for B0 before sending F0: nobody moves
GOOD_HW = (ROOT / "pipesim" / "presets" / "local-cpu.toml").read_text()
INPUTS = {  # file name -> text, created in every case's folder
    "deadlock.csv": DEADLOCK_CSV,
    "garbage.csv": "0F0,0X9,zz\n",
    "unpaired.csv": "0F0,0RECV_B0,0B0\n1RECV_F0,1SEND_B0,1F0,1B0\n",  # a RECV whose SEND is missing
    "ragged.csv": "0F0,0B0\n1F0,1B0,1F7\n",
    "empty.csv": "",
    "binary.csv": "\x00\x01\x02",
    "bad.toml": "name = \n[device",
    "missing-device.toml": 'name = "x"\ndevices_per_node = 2\nnum_nodes = 1\n',
    "negative.toml": GOOD_HW.replace("latency = 0.00021043956780947005", "latency = -1.0"),
    "unknown-key.toml": GOOD_HW.replace('name = "local-cpu"', 'name = "local-cpu"\nbogus_field = 3'),
    "not-json.json": "{not json",
    "other.json": '{"schema": "something/1"}',
    "folder.json/keep": "",
    "measured.json": (ROOT / "tests" / "data" / "measured_1f1b_gpt_p2.json").read_text(),  # a 2-rank run
    "folder.html/keep": "",
    "tiny-config.json": '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 500, '
                        '"max_position_embeddings": 128, "model_type": "llama", "hidden_act": "silu"}',
    "traces/keep": "",
    "deep.json": "[" * 100_000 + "]" * 100_000,  # deeper than Python's JSON parser recurses
    "long-int.json": '{"schema": "pipesim.timeline/1", "num_ranks": ' + "9" * 5000 + "}",  # past int's digit limit
    "meta-null.json": (ROOT / "tests" / "data" / "measured_1f1b_gpt_p2.json").read_text().replace(
        '"meta":{', '"meta":null,"was":{', 1),
    "meta-no-m.json": (ROOT / "tests" / "data" / "measured_1f1b_gpt_p2.json").read_text().replace(
        '"microbatches":', '"was_microbatches":', 1),
    "two-ranks.csv": "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n",  # valid: 2 ranks, 2 microbatches, 1 stage each
    "job.toml": '[model]\nname = "llama3"\nflavor = "debugmodel"\n',
}

SIM = ["simulate", "1f1b", "-p", "2", "-m", "4"]
RUN = ["run", "1f1b", "--nproc", "2", "--microbatches", "4"]
BENCH = ["bench", "collectives", "--nproc", "2"]

# (id, argv, a piece of the one line). "{ro}" is a read-only folder (a read-only mount when run as root).
CASES = [
    # -- malformed flags
    ("unknown-command", ["frobnicate"], "invalid choice"),
    ("unknown-flag", [*SIM, "--frob"], "unrecognized arguments"),
    ("stages-not-int", ["schedule", "1f1b", "-p", "four"], "'four' is not an integer"),
    ("stages-zero", ["schedule", "1f1b", "-p", "0"], "must be >= 1"),
    ("microbatches-negative", ["simulate", "1f1b", "-m", "-3"], "must be >= 1"),
    ("unknown-schedule", ["schedule", "2f2b"], "2f2b"),
    ("no-schedule", ["simulate"], "name a schedule"),
    ("name-and-csv", ["schedule", "1f1b", "--from-csv", "ragged.csv"], "not both"),
    ("virtual-on-1f1b", ["schedule", "1f1b", "-v", "2"], "--virtual 2 is not admitted"),
    ("interleaved-m", ["schedule", "interleaved-1f1b", "-p", "4", "-m", "3", "-v", "2"], "microbatches"),
    ("bad-cost", [*SIM, "--cost", "F=x"], "F=x"),
    ("cost-unknown-kind", [*SIM, "--cost", "Q=1"], "Q"),
    ("bad-model", [*SIM, "--model", "bert"], "invalid choice"),
    ("bad-dtype", [*SIM, "--dtype", "int3"], "invalid choice"),
    ("layers-lt-stages", ["simulate", "1f1b", "-p", "4", "--layers", "2"], "layers"),
    ("layer-split-sum", [*SIM, "--layer-split", "1,1"], "layer"),
    ("layer-split-cost", [*SIM, "--cost", "F=1,B=2", "--layer-split", "4,4"], "--layer-split needs a model"),
    ("negative-bytes", [*SIM, "--cost", "F=1,B=2", "--boundary-bytes", "-1"], ">= 0"),
    ("slow-no-rank", [*SIM, "--cost", "F=1,B=2", "--slow", "5=2"], "pipeline rank 5 does not exist"),
    ("slow-zero-factor", [*SIM, "--cost", "F=1,B=2", "--slow", "1=0"], "the factor must be a finite number > 0"),
    ("slow-malformed", [*SIM, "--cost", "F=1,B=2", "--slow", "1:2"], "expected RANK=FACTOR"),
    ("slow-link-malformed", [*SIM, "--cost", "F=1,B=2", "--slow-link", "0x1=2"], "expected A-B=FACTOR"),
    ("slow-link-no-rank", [*SIM, "--model", "mlp", "--hardware", "local-cpu", "--slow-link", "0-7=2"],
     "pipeline rank 7 does not exist"),
    ("slow-link-same-rank", [*SIM, "--cost", "F=1,B=2", "--slow-link", "1-1=2"], "two different ranks"),
    ("slow-link-no-links", [*SIM, "--cost", "F=1,B=2", "--slow-link", "0-1=2"], "--slow-link needs links"),
    ("jitter-negative", [*SIM, "--cost", "F=1,B=2", "--jitter", "-0.1"], "--jitter must be a sigma >= 0"),
    ("jitter-overflow", [*SIM, "--cost", "F=1,B=2", "--jitter", "1000"],
     "--jitter 1000: the factor exp(sigma z) of a draw z = 0.94 overflows; give a smaller sigma"),
    ("whatif-jitter-overflow", ["whatif", "measured.json", "--jitter", "1000"], "exp(sigma z) of a draw"),
    ("output-over-input", [*SIM, "--model-config", "tiny-config.json", "--json", "tiny-config.json"],
     "--json tiny-config.json is the file --model-config reads: give another file"),
    ("whatif-trace-over-input", ["whatif", "measured.json", "--trace", "measured.json"],
     "--trace measured.json is the file whatif reads: give another file"),
    ("import-trace-output-in-input", ["import-trace", "traces", "-o", "traces/out.json"],
     "-o traces/out.json is inside"),
    ("cost-with-model", [*SIM, "--cost", "F=1,B=2", "--model-config", "tiny-config.json"],
     "--model-config needs a model, but --cost gives the seconds: drop one"),
    ("cost-with-compile", [*SIM, "--cost", "F=1,B=2", "--compile"], "--compile needs a model, but --cost gives"),
    ("cost-nan", [*SIM, "--cost", "F=nan,B=2"], "--cost F must be a finite number >= 0, got nan"),
    ("cost-twice", [*SIM, "--cost", "F=1,B=2,F=3"], "--cost 'F=1,B=2,F=3' gives F twice"),
    ("cost-empty", [*SIM, "--cost", ""], "malformed --cost ''"),
    ("cost-fb-without-pairs", [*SIM, "--cost", "F=1,B=2,FB=2.5"],
     "--cost FB= times overlapped forward + backward pairs; 1f1b has none"),
    ("simulate-ilp-not-searched", [*SIM, "--cost", "F=1,B=2", "--ilp", "5"],
     "--ilp applies to zb-auto, zb-2p and zb-v, not 1f1b"),
    ("sweep-ilp-none-searched", ["sweep", "--schedules", "1f1b,zb-h1", "-p", "2", "-m", "4", "--cost", "F=1,B=2",
                                 "--ilp", "5"], "--ilp applies to zb-auto, zb-2p and zb-v; the sweep has none of them"),
    ("sweep-virtual-none-looped", ["sweep", "--schedules", "1f1b,zb-h1", "-p", "2", "-m", "4", "--cost", "F=1,B=2",
                                   "--virtual", "2"], "--virtual applies to schedules with several stages per rank"),
    ("mlp-heads", [*SIM, "--model", "mlp", "--heads", "16"], "--heads needs a transformer (--model gpt or "
                                                               "--model-config)"),
    ("mlp-attention", [*SIM, "--model", "mlp", "--attention", "flash"], "--attention needs a transformer"),
    ("cpu-host-ce-fusion", [*SIM, "--model", "gpt", "--hardware", "local-cpu", "--cross-entropy-loss-fusion"],
     "--cross-entropy-loss-fusion acts on GPU kernels: local-cpu has no GPU device family (use a GPU preset)"),
    ("cpu-host-transformer-impl", [*SIM, "--model", "gpt", "--hardware", "local-cpu", "--transformer-impl", "local"],
     "--transformer-impl acts on GPU kernels: local-cpu has no GPU device family"),
    ("cpu-host-graphs", [*SIM, "--model", "gpt", "--hardware", "local-cpu", "--cuda-graph-impl", "local"],
     "--cuda-graph-impl acts on GPU kernels: local-cpu has no GPU device family"),
    ("cpu-host-eager-rmsnorm", [*SIM, "--model", "gpt", "--normalization", "RMSNorm", "--hardware", "local-cpu",
                                "--eager-rmsnorm"], "--eager-rmsnorm acts on GPU kernels: local-cpu has no GPU device"),
    ("boundary-bytes-with-a-model", [*SIM, "--model", "mlp", "--boundary-bytes", "100"],
     "--boundary-bytes sizes --cost's stages; a model's messages and activations come from the model"),
    ("schedule-search-flag-without-ilp", ["schedule", "zb-auto", "-p", "4", "-m", "8", "--memory-limit", "2x"],
     "--memory-limit sets the exact search: give --ilp (zb-auto, zb-2p, zb-v) with it"),
    ("layers-huge", [*SIM, "--model", "gpt", "--layers", "1000000000"],
     "--layers 1000000000 is above pipesim's bound of 65,536 (the deepest published models have a few hundred)"),
    ("moe-imbalance-nan", [*SIM, "--model", "moe", "--moe-load-imbalance", "nan"],
     "moe imbalance (the most-loaded expert's tokens / the mean) must be in [1, E / k = 2]"),
    ("moe-capacity-inf", [*SIM, "--model", "moe", "--moe-expert-capacity-factor", "inf"],
     "moe capacity_factor must be a number in (0, E / k = 2]"),
    ("whatif-no-rank", ["whatif", "measured.json", "--slow", "5=2"], "pipeline rank 5 does not exist"),
    ("whatif-link-no-rank", ["whatif", "measured.json", "--slow-link", "0-3=2"], "pipeline rank 3 does not exist"),
    ("whatif-zero-factor", ["whatif", "measured.json", "--slow", "1=0"], "the factor must be a finite number > 0"),
    ("whatif-not-a-timeline", ["whatif", "other.json"], "is not a pipesim timeline"),
    ("sweep-empty-schedules", ["sweep", "--schedules", ","], "at least one schedule"),
    ("sweep-unknown", ["sweep", "--schedules", "gpipe,nope"], "nope"),
    ("plot-missing-input", ["plot", "missing.json", "-o", "x.html"], "file not found: missing.json"),
    ("plot-not-json", ["plot", "not-json.json", "-o", "x.html"], "cannot read not-json.json"),
    ("plot-deep-json", ["plot", "deep.json", "-o", "x.html"], "nests deeper than Python's parser goes"),
    ("whatif-long-int", ["whatif", "long-int.json"], "cannot read long-int.json: Exceeds the limit"),
    ("whatif-meta-null", ["whatif", "meta-null.json"], "meta must be an object"),
    ("whatif-meta-no-m", ["whatif", "meta-no-m.json"], "the timeline's meta 'm' must be a positive integer"),
    ("import-trace-deep-json", ["import-trace", "deep.json", "-o", "t.json"], "nests deeper than Python's parser"),
    ("plan-job-bad-degree", ["plan", "--from-torchtitan", "job.toml", "--cp", "x"],
     "argument --cp: invalid int value: 'x'"),
    ("whatif-special-file", ["whatif", "/dev/zero"], "/dev/zero is not a regular file"),
    ("csv-special-file", ["schedule", "--from-csv", "/dev/zero"], "schedule CSV /dev/zero is not a regular file"),
    ("megatron-special-file", ["simulate", "--from-megatron", "/dev/zero"],
     "--from-megatron /dev/zero is not a regular file"),
    ("torchtitan-special-file", ["simulate", "--from-torchtitan", "/dev/zero"],
     "--from-torchtitan /dev/zero is not a regular file"),
    ("csv-virtual", ["schedule", "--from-csv", "two-ranks.csv", "--virtual", "2"],
     "--virtual 2: two-ranks.csv has its own stages per rank, 1; drop --virtual"),
    ("run-csv-virtual", ["run", "--from-csv", "two-ranks.csv", "--nproc", "2", "-m", "2", "--virtual", "2"],
     "two-ranks.csv has its own stages per rank, 1"),
    ("qkv-bias-mlp", ["simulate", "1f1b", "--model", "mlp", "--add-qkv-bias"],
     "--add-qkv-bias needs a transformer (--model gpt or --model-config)"),
    # a typed -p or -m (or --microbatch-size's m) the CSV does not have: read past until 2026-12-07
    ("csv-stages", ["schedule", "--from-csv", "two-ranks.csv", "-p", "4"],
     "--stages 4: two-ranks.csv has its own ranks, 2; drop --stages"),
    ("csv-microbatches", ["simulate", "--from-csv", "two-ranks.csv", "-m", "4"],
     "--microbatches 4: two-ranks.csv has its own microbatches, 2; drop --microbatches"),
    ("csv-microbatch-size", ["simulate", "--from-csv", "two-ranks.csv", "--model", "gpt", "--microbatch-size", "2",
                             "--batch", "8"],
     "--microbatch-size 2 gives 4 microbatches per replica; two-ranks.csv has its own, 2"),
    ("run-csv-stages", ["run", "--from-csv", "two-ranks.csv", "--nproc", "3", "-p", "3"],
     "--stages 3: two-ranks.csv has its own ranks, 2; drop --stages"),
    ("run-csv-world", ["run", "--from-csv", "two-ranks.csv", "--nproc", "3"],
     "two-ranks.csv has 2 pipeline ranks, but the run's 3 ranks (--nproc x nodes) over dp(1) x tp(1) leave 3: it "
     "needs 2 ranks"),
    ("run-csv-microbatches", ["run", "--from-csv", "two-ranks.csv", "--nproc", "2", "-m", "4"],
     "--microbatches 4: two-ranks.csv has its own microbatches, 2"),
    ("run-csv-microbatch-size", ["run", "--from-csv", "two-ranks.csv", "--nproc", "2", "--batch", "8",
                                "--microbatch-size", "1"],
     "--microbatch-size 1 gives 8 microbatches per replica; two-ranks.csv has its own, 2"),
    ("run-slow-twice", [*RUN, "--slow", "0=1.5", "--slow", "0=2"],
     "--slow names rank 0 more than once: give each rank one factor"),
    ("sim-slow-link-twice", [*SIM, "--cost", "F=1,B=2", "--hardware", "local-cpu", "--slow-link", "0-1=1.5",
                             "--slow-link", "1-0=2"], "--slow-link names link 0-1 more than once"),
    ("run-trace-empty", [*RUN, "--trace", ""], "--trace needs a file name, got an empty one"),
    ("run-save-dir-empty", [*RUN, "--save-dir", ""], "--save-dir needs a folder name, got an empty one"),
    ("calibrate-trace-quick", ["calibrate", "--from-trace", "traces", "-o", "hw.toml", "--model", "mlp", "--quick"],
     "--quick shortens the executor runs: it does nothing with --from-trace"),
    ("validate-gpu-hardware", ["validate", "--out", "v.md", "--hardware", "dgx-a100"],
     "--hardware dgx-a100: validate predicts the executor's CPU runs here, which need a [host] profile"),
    ("plot-other-schema", ["plot", "other.json", "-o", "x.html"], "is not a pipesim timeline"),
    ("plot-step-zero", ["plot", "other.json", "-o", "x.html", "--step", "0"], "must be >= 1"),
    ("run-nnodes-no-endpoint", [*RUN, "--nnodes", "2"], "--rdzv-endpoint"),
    ("run-then-bad", [*RUN, "--then", "gpipe", "--frob"], "after --then"),
    ("run-dp-not-dividing", ["run", "1f1b", "--nproc", "3", "--dp", "2"], "3"),
    ("run-weights-too-big", [*RUN, "--model", "mlp", "--hidden", "10000000", "--layers", "2"],
     "the model's parameters and gradients alone need"),
    ("bench-unknown-op", [*BENCH, "--ops", "all_reduce,shout"], "unknown collective 'shout'"),
    ("bench-bad-size", [*BENCH, "--sizes", "12Q"], "cannot read size '12Q'"),
    ("calibrate-devices", ["calibrate", "-o", "hw.toml", "--devices", "1"], "--devices must be >= 2"),
    ("validate-rounds", ["validate", "--out", "v.md", "--rounds", "0"], "--rounds 0"),
    ("validate-reuse-missing", ["validate", "--out", "v.md", "--reuse", "nowhere"], "--reuse nowhere"),
    # -- schedule CSVs and deadlocks
    ("csv-missing", ["schedule", "--from-csv", "missing.csv"], "missing.csv"),
    ("csv-garbage", ["schedule", "--from-csv", "garbage.csv"], "garbage.csv"),
    ("csv-empty", ["schedule", "--from-csv", "empty.csv"], "empty.csv"),
    ("csv-binary", ["schedule", "--from-csv", "binary.csv"], "binary.csv"),
    ("csv-deadlock", ["schedule", "--from-csv", "deadlock.csv"], "deadlock"),
    ("csv-deadlock-simulate", ["simulate", "--from-csv", "deadlock.csv", "--cost", "F=1,B=2"], "deadlock"),
    ("csv-deadlock-run", ["run", "--from-csv", "deadlock.csv", "--nproc", "2", "-m", "2"], "deadlock"),
    ("csv-unpaired-recv", ["schedule", "--from-csv", "unpaired.csv"], "SEND_F(stage 0, mb 0) is missing on rank 0"),
    ("csv-is-folder", ["schedule", "--from-csv", "folder.json"], "folder.json"),
    # -- hardware files
    ("sim-cp-comm-type", [*SIM, "--cp-comm-type", "a2a+p2p"], "invalid choice: 'a2a+p2p'"),
    ("sim-ub-overlap-no-sp", [*SIM, "--model", "gpt", "--tp", "2", "--hardware", "dgx-h100", "--tp-comm-overlap"],
     "--tp-comm-overlap needs tensor parallelism with --sequence-parallel"),
    ("sim-ub-cfg-unreadable", [*SIM, "--model", "gpt", "--tp", "2", "--sequence-parallel", "--hardware", "dgx-h100",
                               "--tp-comm-overlap", "--tp-comm-overlap-cfg", "not-json.json"],
     "--tp-comm-overlap-cfg not-json.json: not YAML"),
    ("hw-unknown-preset", [*SIM, "--hardware", "dgx-z900"], "dgx-z900"),
    ("hw-unparsable", [*SIM, "--hardware", "bad.toml"], "bad.toml"),
    ("hw-missing-section", [*SIM, "--hardware", "missing-device.toml"], "missing-device.toml"),
    ("hw-negative", [*SIM, "--hardware", "negative.toml"], "latency"),
    ("hw-unknown-key", [*SIM, "--hardware", "unknown-key.toml"], "bogus_field"),
    ("hw-too-few-devices", ["simulate", "1f1b", "-p", "64", "-m", "64", "--hardware", "dgx-h100"], "needs 64 devices"),
    ("validate-hw-missing", ["validate", "--out", "v.md", "--hardware", "nope.toml"], "nope.toml"),
    # -- outputs: checked before any work
    ("sim-json-no-folder", [*SIM, "--json", "nodir/r.json"], "--json nodir/r.json: folder nodir does not exist"),
    ("sim-json-folder", [*SIM, "--json", "folder.json"], "--json folder.json: is a folder"),
    ("sim-json-suffix", [*SIM, "--json", "r.txt"], "--json r.txt: writes JSON; name the file *.json"),
    ("sim-json-dev-full", [*SIM, "--json", "/dev/full"], "--json /dev/full: exists and is not a regular file"),
    ("sim-json-read-only", [*SIM, "--json", "{ro}/r.json"], "r.json"),
    ("sim-trace-bad-keeps-json", [*SIM, "--json", "r.json", "--trace", "/nonexistent/t.json"], "/nonexistent"),
    ("sim-same-file", [*SIM, "--json", "r.json", "--trace", "r.json"], "name the same file"),
    ("schedule-plot-png", ["schedule", "1f1b", "--plot", "x.png"], "--plot x.png: writes HTML"),
    ("sweep-plot-suffix", ["sweep", "--schedules", "gpipe", "--plot", "s.png"], "--plot s.png: writes HTML"),
    ("sweep-json-no-folder", ["sweep", "--schedules", "gpipe", "--json", "nodir/s.json"], "folder nodir"),
    ("sweep-json-read-only", ["sweep", "--schedules", "gpipe", "--json", "{ro}/s.json"], "s.json"),
    ("plot-o-png", ["plot", "other.json", "-o", "x.png"], "-o x.png: writes HTML"),
    ("plot-png-jpg", ["plot", "other.json", "-o", "x.html", "--png", "x.jpg"], "--png x.jpg: writes PNG"),
    ("plot-o-folder", ["plot", "other.json", "-o", "folder.html"], "-o folder.html: is a folder"),
    ("run-json-no-folder", [*RUN, "--json", "nodir/r.json"], "--json nodir/r.json: folder nodir does not exist"),
    ("run-trace-suffix", [*RUN, "--trace", "t.html"], "--trace t.html: writes JSON"),
    ("run-json-read-only", [*RUN, "--json", "{ro}/r.json"], "r.json"),
    ("run-save-dir-file", [*RUN, "--save-dir", "deadlock.csv"], "--save-dir deadlock.csv: exists and is not a folder"),
    ("run-then-json-no-folder", [*RUN, "--then", "gpipe", "--json", "nodir/g.json"], "folder nodir"),
    ("bench-json-no-folder", [*BENCH, "--json", "nodir/c.json"], "--json nodir/c.json: folder nodir"),
    ("bench-plot-suffix", [*BENCH, "--plot", "c.png"], "--plot c.png: writes HTML"),
    ("calibrate-o-suffix", ["calibrate", "-o", "hw.json"], "-o hw.json: writes TOML"),
    ("calibrate-o-no-folder", ["calibrate", "-o", "nodir/hw.toml"], "folder nodir"),
    ("calibrate-o-dev-full", ["calibrate", "-o", "/dev/full"], "not a regular file"),
    ("validate-out-suffix", ["validate", "--out", "v.html"], "--out v.html: writes Markdown"),
    ("validate-out-no-folder", ["validate", "--out", "nodir/v.md"], "folder nodir"),
    ("validate-img-dir-file", ["validate", "--out", "v.md", "--img-dir", "deadlock.csv"], "not a folder"),
    # -- numeric ranges
    ("run-lr-nan", [*RUN, "--lr", "nan"], "--lr must be a positive finite number"),
    ("run-lr-negative", [*RUN, "--lr", "-0.1"], "--lr must be a positive finite number"),
    ("run-pg-timeout-negative", [*RUN, "--pg-timeout", "-1"], "--pg-timeout"),
    ("run-pg-timeout-inf", [*RUN, "--pg-timeout", "inf"], "--pg-timeout"),
    ("run-fail-rank-out-of-range", [*RUN, "--fail-rank", "5"], "--fail-rank 5: the run has ranks 0 to 1"),
    ("run-warmup-all-steps", [*RUN, "--steps", "2", "--warmup", "2"], "--warmup 2 leaves no measured step"),
    ("run-warmup-negative", [*RUN, "--warmup", "-1"], "--warmup"),
    ("bench-timeout-zero", [*BENCH, "--timeout", "0"], "--timeout must be more than 0"),
    ("bench-timeout-nan", [*BENCH, "--timeout", "nan"], "--timeout"),
    ("bench-iters-zero", [*BENCH, "--iters", "0"], "--iters"),
    ("bench-size-64G", [*BENCH, "--sizes", "64G"], "above the bound"),
    ("bench-elements-huge", [*BENCH, "--lecture", "--elements", "100000000000"], "above the bound"),
    ("bench-size-zero", [*BENCH, "--sizes", "0"], "size '0'"),
    # -- work bounded before it starts
    ("schedule-huge-virtual", ["schedule", "interleaved-1f1b", "-p", "4", "-m", "8", "-v", "100000"],
     "above the bound"),
    ("simulate-huge", ["simulate", "1f1b", "-p", "1024", "-m", "4096", "--cost", "F=1,B=2"], "above the bound"),
    ("sweep-million-stages", ["sweep", "--schedules", "gpipe,1f1b", "--stages", "1000000"],
     "needs 1000000 devices"),
    ("sweep-million-stages-cost", ["sweep", "--schedules", "gpipe", "--stages", "1000000", "--cost", "F=1,B=2"],
     "above the bound"),
    ("sweep-nothing-admissible", ["sweep", "--schedules", "interleaved-1f1b", "--stages", "4", "-m", "6",
                                  "--cost", "F=1,B=2", "--json", "s.json"], "no combination could be simulated"),
]


@pytest.fixture(scope="module")
def read_only_folder(tmp_path_factory) -> str:
    """A folder nothing can be written into: chmod for a user, a read-only mount (sysfs) for root."""
    if os.geteuid() == 0:
        return "/sys"
    folder = tmp_path_factory.mktemp("ro")
    folder.chmod(0o555)
    return str(folder)


# one case per command, and both kinds of one-line error (argparse's, a PipesimError's) and a schedule's grid
PROCESS_CASES = ("unknown-command", "unknown-flag", "csv-deadlock", "sweep-unknown", "plot-not-json",
                 "run-json-no-folder", "bench-bad-size", "calibrate-o-suffix", "validate-rounds")


def _folder(name: str, base: Path) -> tuple[Path, set[str]]:
    """The case's fresh folder with every input file, and what it holds before the command."""
    cwd = base / name
    cwd.mkdir()
    for rel, text in INPUTS.items():
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        if not rel.endswith("/keep"):
            (cwd / rel).write_text(text)
    return cwd, {str(p.relative_to(cwd)) for p in cwd.rglob("*")}


def _left(cwd: Path, before: set[str], ro: str) -> tuple[set[str], list[str]]:
    """Files the command left in its folder, and in the read-only folder (when it is not a mount)."""
    after = {str(p.relative_to(cwd)) for p in cwd.rglob("*")}
    return after - before, [p for p in ("r.json", "s.json") if ro != "/sys" and (Path(ro) / p).exists()]


def _main_in_process(argv: list[str]) -> tuple[int, str]:
    """`pipesim ARGV` as `python -m pipesim` would end: (exit code, stderr); an escaping exception is a traceback."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's errors
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except Exception:  # noqa: BLE001 - what the interpreter would print, for the assertions to see
            traceback.print_exc(file=sys.stderr)
            code = 1
    return code, err.getvalue()


def _run_in_process(case: tuple, base: Path, ro: str) -> tuple[int, str, float, set[str], list[str]]:
    name, argv, _ = case
    cwd, before = _folder(name, base)
    argv = [a.replace("{ro}", ro) for a in argv]
    here = os.getcwd()
    os.chdir(cwd)
    try:
        t0 = time.perf_counter()
        code, stderr = _main_in_process(argv)
        seconds = time.perf_counter() - t0
    finally:
        os.chdir(here)
    return code, stderr, seconds, *_left(cwd, before, ro)


def _run_process(case: tuple, base: Path, ro: str) -> tuple[str, int, str, float, set[str], list[str]]:
    name, argv, _ = case
    cwd, before = _folder(name, base)
    argv = [a.replace("{ro}", ro) for a in argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    done = subprocess.run([*PIPESIM, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    return name, done.returncode, done.stderr, time.perf_counter() - t0, *_left(cwd, before, ro)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, read_only_folder) -> dict[str, tuple]:
    base = tmp_path_factory.mktemp("bad-input")
    return {case[0]: _run_in_process(case, base, read_only_folder) for case in CASES}


@pytest.fixture(scope="module")
def process_outcomes(tmp_path_factory, read_only_folder) -> dict[str, tuple]:
    base = tmp_path_factory.mktemp("bad-input-process")
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.map(lambda c: _run_process(c, base, read_only_folder),
                           [c for c in CASES if c[0] in PROCESS_CASES])
        return {r[0]: r[1:] for r in results}


def test_cases_are_distinct():
    assert len({c[0] for c in CASES}) == len(CASES)
    assert set(PROCESS_CASES) <= {c[0] for c in CASES}


def _assert_refused(outcome: tuple, message: str) -> None:
    code, stderr, seconds, new_files, ro_left = outcome
    lines = [line for line in stderr.splitlines() if line.strip()]
    grid_lines = [g for g in lines[:-1] if g.startswith(("step ", "rank "))]  # a bad schedule's marked grid
    assert code == 2, stderr
    assert "Traceback" not in stderr
    assert lines and len(lines) - len(grid_lines) == 1, stderr
    assert message in lines[-1], lines[-1]
    assert not new_files and not ro_left, new_files or ro_left  # no output, no temporary file
    assert seconds < 20  # refused up front: no torchrun launched, no schedule of a million stages built


@pytest.mark.parametrize(("name", "argv", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_left(outcomes, name, argv, message):
    _assert_refused(outcomes[name], message)


@pytest.mark.parametrize(("name", "argv", "message"), [c for c in CASES if c[0] in PROCESS_CASES],
                         ids=[c[0] for c in CASES if c[0] in PROCESS_CASES])
def test_a_real_pipesim_process_refuses_the_same_way(process_outcomes, name, argv, message):
    _assert_refused(process_outcomes[name], message)
