"""`pipesim calibrate --gpu`'s code paths without a GPU: the recorded file, the hardware file it becomes, and
the simulation on that file, which must be the kernel model on the recorded figures computed by hand.

tests/data/gpu_measurements_h100_sample.csv is written by hand in the exact format `--gpu` keeps
(plausible H100 figures, not a measurement: this machine has no GPU); the measuring module itself
runs for real on the CPU on a tiny grid, so its records and the file they make are exercised too.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from pipesim.calibration import gpu
from pipesim.cli import main as pipesim_main
from pipesim.comm.collective_algos import collective_time, group_shape, ring_latency
from pipesim.comm.collective_costs import ring_time
from pipesim.cost.kernel_costs import piece_seconds
from pipesim.cost.model_costs import model_costs
from pipesim.device import gpu_measurements as measured
from pipesim.device.gemm import gemm_time
from pipesim.device.kernels import memory_bound_time
from pipesim.device.profile import device_profile, load_profiles
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import hardware_to_toml, load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.grad_accumulation import accumulate_gradients
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import block_params, embedding_params
from pipesim.model.piece_kernels import embedding_kernels

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests/data/gpu_measurements_h100_sample.csv"
H100 = device_profile("H100")
# the sample's figures by the definitions of docs/gpu_model.md, from its rows
MATMUL = 2.0 * 8192**3 / 0.00139 / 989e12  # the best bf16 GEMM / peak
COPY = 2147483648 / 0.0007  # bytes/s of the best copy
LAUNCH = statistics.median([2.5e-6, 3.5e-6, 3e-6])  # seconds
# flash: the causal records only (the kernel training runs), their FLOPs as executed: the diagonal tiles whole
CAUSAL_EXECUTED = 4 * 4 * 2048 * 2048 * 4096 / 2 * (1 + 128 / 2048)
FLASH_FWD = CAUSAL_EXECUTED / 0.00075 / 989e12
FLASH_BWD = 2.5 * CAUSAL_EXECUTED / 0.0021 / 989e12
HAND = replace(H100, matmul_efficiency=MATMUL, memory_efficiency=COPY / H100.hbm_bandwidth, kernel_overhead=LAUNCH,
               flash_forward_efficiency=FLASH_FWD, flash_backward_efficiency=FLASH_BWD)


def test_memory_bound_efficiency_is_the_memory_bound_kernels_median_and_memory_efficiency_the_copy():
    base = measured.read(SAMPLE)
    extra = [measured.Record(kind, "bfloat16", (), nbytes, 0.5)
             for kind, nbytes in (("softmax", 1000), ("softmax", 500), ("dropout", 3000), ("gelu", 4000))]
    data = measured.Measurements(base.meta, base.records + tuple(extra))
    assert measured.memory_bound_bandwidths(data) == {"softmax": 2000.0, "dropout": 6000.0, "gelu": 8000.0}  # each best
    fig = measured.summarise(data, H100)
    assert fig["memory_bound_efficiency"] == 6000.0 / 3.35e12  # their median
    assert fig["memory_efficiency"] == COPY / 3.35e12  # the copy: GEMM and flash operands stream at it
    assert "memory_bound_efficiency" not in measured.summarise(base, H100)  # none recorded: the profile's
    prof = H100.with_measured("run", **fig)
    assert memory_bound_time(1e9, prof).memory == 1e9 / (3.35e12 * fig["memory_bound_efficiency"])
    assert gemm_time(8192, 8192, 64, "bfloat16", prof).memory == \
        gemm_time(8192, 8192, 64, "bfloat16", replace(prof, memory_bound_efficiency=None)).memory  # not the kernels'
    text = measured.write(data.meta, list(data.records))
    assert measured.parse(text).records == data.records


def test_a_sustained_gemm_scales_matmul_efficiency_by_its_fraction_of_the_burst_rate():
    base = measured.read(SAMPLE)  # its 8192^3 bf16 GEMM: 0.00139 s per call
    slower = measured.Record("gemm_sustained", "bfloat16", (1, 8192, 8192, 8192), 0, 0.00139 / 0.9)
    data = measured.Measurements(base.meta, base.records + (slower,))
    assert measured.sustained_fraction(data) == pytest.approx(0.9, rel=1e-12)
    assert measured.summarise(data, H100)["matmul_efficiency"] == pytest.approx(MATMUL * 0.9, rel=1e-12)
    faster = measured.Record("gemm_sustained", "bfloat16", (1, 8192, 8192, 8192), 0, 0.001)  # never above the burst
    assert measured.sustained_fraction(measured.Measurements(base.meta, base.records + (faster,))) == 1.0
    assert measured.sustained_fraction(base) is None and measured.summarise(base, H100)["matmul_efficiency"] == MATMUL
    other = measured.Record("gemm_sustained", "bfloat16", (1, 512, 512, 512), 0, 1.0)  # no burst of that shape
    assert measured.sustained_fraction(measured.Measurements(base.meta, base.records + (other,))) is None
    assert "sustained GEMM: 90.0 % of its burst rate" in gpu.assemble(data).summary()


def test_the_sample_parses_with_its_header():
    data = measured.read(SAMPLE)
    assert data.meta["device"] == "NVIDIA H100 80GB HBM3" and data.meta["family"] == "H100"
    assert [r.kind for r in data.records][:4] == ["launch", "launch", "launch", "copy"]
    gemm = data.of("gemm")[1]
    assert (gemm.shape, gemm.seconds, gemm.flops) == ((1, 4096, 4096, 4096), 0.000175, 2.0 * 4096**3)


def test_summary_is_the_best_gemm_copy_and_flash_and_the_median_launch():
    fig = measured.summarise(measured.read(SAMPLE), H100)
    assert fig == {"matmul_efficiency": MATMUL, "memory_efficiency": COPY / 3.35e12, "kernel_overhead": LAUNCH,
                   "flash_forward_efficiency": FLASH_FWD, "flash_backward_efficiency": FLASH_BWD}
    assert measured.summarise(measured.read(SAMPLE), H100, "float16")["matmul_efficiency"] == \
        2.0 * 8192**3 / 0.00135 / 989e12  # fp16 has one row of its own


def test_collective_figures_use_nccl_tests_busbw():
    figs = measured.collective_figures(measured.read(SAMPLE))
    assert figs["all_reduce"]["busbw"] == 268435456 / 0.00128 * 2 * 7 / 8
    assert figs["all_reduce"]["small_message_seconds"] == 2.2e-5
    assert figs["send_recv"]["busbw"] == 268435456 / 0.0008


def test_profile_toml_round_trips_with_the_measurement_as_source(tmp_path):
    fig = measured.summarise(measured.read(SAMPLE), H100)
    prof = H100.with_measured("sample run", **fig)
    path = tmp_path / "profile.toml"
    path.write_text(measured.profile_toml("H100", prof))
    back = load_profiles(path)["H100"]
    for name, value in fig.items():
        assert getattr(back, name) == pytest.approx(value, rel=1e-5)  # written to 6 significant digits
        assert back.sources[name] == "sample run"
    assert back.sources["sms"] == H100.sources["sms"] and back.tiles == H100.tiles


def test_bad_files_are_one_line_errors():
    with pytest.raises(PipesimError, match="columns must be"):
        measured.parse("kind,dtype,shape\n")
    with pytest.raises(PipesimError, match="row 1: gemm needs a shape of 4 numbers"):
        measured.parse("kind,dtype,shape,bytes,seconds\ngemm,bfloat16,1x2x3,0,1e-3\n")
    with pytest.raises(PipesimError, match="unknown kind"):
        measured.parse("kind,dtype,shape,bytes,seconds\nconv,bfloat16,,0,1e-3\n")
    with pytest.raises(PipesimError, match="seconds must be positive"):
        measured.parse("kind,dtype,shape,bytes,seconds\nlaunch,float32,,0,0\n")
    with pytest.raises(PipesimError, match="no kernel record"):
        gpu.assemble(measured.parse("# family: H100\nkind,dtype,shape,bytes,seconds\nsend_recv,float32,2,8,1e-5\n"))
    with pytest.raises(PipesimError, match="matmul_efficiency must be a fraction.*pass --family"):
        gpu.assemble(measured.read(SAMPLE), family="A100")  # 0.8 of an H100 is 2.5x an A100's peak
    with pytest.raises(PipesimError, match="no device family for 'Tesla V100'"):
        gpu.family_of("Tesla V100")


def test_write_then_parse_is_the_identity():
    data = measured.read(SAMPLE)
    again = measured.parse(measured.write(data.meta, list(data.records)))
    assert again == data


def test_family_and_base_preset_come_from_the_gpu_name():
    assert [gpu.family_of(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-PCIE-40GB",
                                       "NVIDIA A100-SXM4-80GB", "NVIDIA B200")] == \
        ["H100", "H200", "A100-PCIe", "A100", "B200"]
    assert [gpu.base_preset(f).name for f in ("H100", "H200", "A100", "A100-PCIe", "B200")] == \
        ["dgx-h100", "hgx-h200", "dgx-a100", "pcie-4gpu", "hgx-b200"]
    # a GB200 is the B200 family on its own 1,200 W board, in a rack: its preset, not the HGX board's
    assert gpu.family_of("NVIDIA GB200") == "B200"
    assert [gpu.base_preset("B200", n).name for n in ("NVIDIA GB200", "NVIDIA B200")] == ["gb200-nvl72", "hgx-b200"]
    # Blackwell Ultra: torch names it "NVIDIA B300 SXM6 AC" (TE's GEMM guide) and "NVIDIA GB300" (cudnn-frontend's CSVs)
    assert [gpu.family_of(n) for n in ("NVIDIA B300 SXM6 AC", "NVIDIA GB300")] == ["B300", "B300"]
    assert [gpu.base_preset("B300", n).name for n in ("NVIDIA GB300", "NVIDIA B300 SXM6 AC")] == \
        ["gb300-nvl72", "hgx-b300"]


def test_the_link_is_the_ring_formula_through_the_smallest_and_largest_all_reduce():
    fit = gpu.link_fit(measured.read(SAMPLE))
    assert (fit.kind, fit.ranks, fit.small, fit.large) == ("all_reduce", 8, (8192, 2.2e-5), (268435456, 0.00128))
    bandwidth = 2 * 7 / 8 * (268435456 - 8192) / (0.00128 - 2.2e-5)  # 2 (n-1) / n S / t per byte
    assert fit.bandwidth == pytest.approx(bandwidth, rel=1e-14)
    assert fit.latency == pytest.approx((2.2e-5 - 2 * 7 / 8 * 8192 / bandwidth) / (2 * 7), rel=1e-12)
    for nbytes, seconds in (fit.small, fit.large):  # the simulator's formula gives back both measurements
        assert ring_time("all_reduce", 8, nbytes, fit.bandwidth, fit.latency) == pytest.approx(seconds, rel=1e-12)
    only_p2p = measured.parse("kind,dtype,shape,bytes,seconds\nsend_recv,float32,2,1000,2e-6\n"
                              "send_recv,float32,2,1001000,1.002e-3\nsend_recv,float32,2,1001000,9e-3\n"
                              "send_recv,float32,2,1001000,1e-3\n")
    p2p = gpu.link_fit(only_p2p)  # median of repeats: 1.002e-3 at 1001000 bytes
    assert (p2p.kind, p2p.bandwidth) == ("send_recv", pytest.approx(1e6 / 1e-3, rel=1e-12))
    assert p2p.latency == pytest.approx(2e-6 - 1000 / p2p.bandwidth, rel=1e-9)
    assert gpu.link_fit(measured.parse("kind,dtype,shape,bytes,seconds\nlaunch,float32,,0,1e-6\n")) is None


def test_the_hardware_file_is_the_family_preset_with_the_measured_figures(tmp_path):
    cal = gpu.assemble(measured.read(SAMPLE))
    hw, base = cal.hardware, load_hardware("dgx-h100")
    k = hw.device.kernels
    assert (k.matmul_efficiency, k.memory_efficiency, k.kernel_overhead) == (MATMUL, COPY / 3.35e12, LAUNCH)
    assert (k.flash_forward_efficiency, k.flash_backward_efficiency) == (FLASH_FWD, FLASH_BWD)
    assert k.source.startswith("measured on NVIDIA H100 80GB HBM3, hand-written sample")
    assert (hw.name, hw.device.name, hw.device.family) == ("dgx-h100-measured", "NVIDIA H100 80GB HBM3", "H100")
    # the sample times no memory-bound kernel: they keep the H100 profile's published share ([LIGER]), not the copy's
    assert k.memory_bound_efficiency is None and H100.memory_bound_efficiency == 0.525
    assert hw.device.hbm_bandwidth == pytest.approx(3.35e12 * 0.525, rel=1e-15)
    assert (hw.intra.bandwidth, hw.intra.latency) == (cal.link.bandwidth, cal.link.latency)
    assert replace(hw, name=base.name, source=base.source, device=base.device,
                   intra=replace(hw.intra, bandwidth=base.intra.bandwidth, latency=base.intra.latency)) == base
    assert cal.profile == HAND and cal.profile.sources["matmul_efficiency"] == k.source
    # the file reads back equal, and a table of figures without a family is refused
    path = tmp_path / "hw.toml"
    path.write_text(hardware_to_toml(hw))
    assert load_hardware(str(path)) == hw
    assert "\n[device.kernels]\nmatmul_efficiency = " in path.read_text()
    path.write_text(path.read_text().replace('family = "H100"', ""))
    with pytest.raises(PipesimError, match=r"\[device.kernels\] needs \[device\].family"):
        load_hardware(str(path))
    path.write_text(hardware_to_toml(hw).replace("kernel_overhead = ", "launch_overhead = "))
    with pytest.raises(PipesimError, match=r"unknown field \[device.kernels\].launch_overhead"):
        load_hardware(str(path))


def _first_forward(capsys, tmp_path, *argv: str) -> float:
    """Seconds of stage 0's first forward in `pipesim simulate ... --json` (it starts at 0)."""
    out = tmp_path / "sim.json"
    assert pipesim_main(["simulate", "1f1b", "-p", "2", "-m", "4", *argv, "--json", str(out)]) == 0
    capsys.readouterr()
    action = next(a for a in json.loads(out.read_text())["critical_path"] if a["name"] == "0F0")
    assert action["start"] == 0.0
    return action["end"]


def test_calibrate_from_measurements_then_simulate_is_the_kernel_model_on_the_recorded_figures(capsys, tmp_path):
    hw_file = tmp_path / "h100.toml"
    assert pipesim_main(["calibrate", "-o", str(hw_file), "--from-measurements", str(SAMPLE)]) == 0
    printed = capsys.readouterr().out
    assert "intra link: 373.4 GB/s" in printed and f"wrote {hw_file}" in printed
    assert not (tmp_path / "h100.measurements.csv").exists()  # kept by --gpu only: this one is recorded already
    b, hidden = 1024, 4096  # an MLP stage of 2 layers: Linear(h, h) + GeLU on b rows, in bf16
    model = ["--model", "mlp", "--hidden", str(hidden), "--layers", "4", "--batch", str(4 * b), "--dtype", "bfloat16"]
    layer = gemm_time(b, hidden, hidden, "bfloat16", HAND).seconds + memory_bound_time(2 * b * hidden * 2, HAND).seconds
    overhead = load_hardware("dgx-h100").per_action_overhead
    assert _first_forward(capsys, tmp_path, *model, "--hardware", str(hw_file)) == \
        pytest.approx(2 * layer + overhead, rel=1e-12)
    shipped = gemm_time(b, hidden, hidden, "bfloat16", H100).seconds + memory_bound_time(4 * b * hidden, H100).seconds
    assert _first_forward(capsys, tmp_path, *model, "--hardware", "dgx-h100") == \
        pytest.approx(2 * shipped + overhead, rel=1e-12)
    assert abs(layer / shipped - 1) > 0.05  # the measured figures move it: the test above could fail


def test_a_gpt_stage_on_the_file_is_its_kernels_on_the_recorded_figures(tmp_path):
    path = tmp_path / "h100.toml"
    path.write_text(hardware_to_toml(gpu.assemble(measured.read(SAMPLE)).hardware))
    hw = load_hardware(str(path))
    model = ModelConfig(kind="gpt", hidden=1024, layers=4, heads=16, seq=1024, vocab=32000, batch=16, dtype="bfloat16")
    opts, b = LayerOptions(attention="flash"), 4
    stage = model_costs(model, 2, 4, hw, Job(attention="flash")).table.stages[0]
    pieces = ((embedding_kernels(model, b, opts), embedding_params(model)), (layer_kernels(model, b, opts),
                                                                            block_params(model)))
    emb, lay = (piece_seconds(accumulate_gradients(k, n, dtype_bytes=2, grad_bytes=4, fused=True), "bfloat16", HAND)
                for k, n in pieces)  # bfloat16: float32 main gradients (Megatron's default)
    assert stage.forward == pytest.approx(emb.F + 2 * lay.F + hw.per_action_overhead, rel=1e-12)
    assert stage.backward_weight == pytest.approx(emb.I + emb.W + 2 * (lay.I + lay.W) + 2 * hw.per_action_overhead,
                                                  rel=1e-12)  # stage 0: W runs the whole backward


def test_gpu_without_cuda_is_one_line_and_no_file(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "hw.toml"
    assert pipesim_main(["calibrate", "-o", str(out), "--gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpu needs a CUDA GPU" in err
    assert list(tmp_path.iterdir()) == []


def test_the_measuring_code_on_the_cpu_writes_a_file_that_assembles(tmp_path):
    pytest.importorskip("torch")
    from pipesim.calibration import gpu_measure  # local import: torch, as the command does

    data = gpu_measure.measure(gpu_measure.CPU_GRID, "cpu")
    assert data.meta["device"] == "cpu" and data.meta["gpus"] == "0"
    assert [r.kind for r in data.records] == ["launch"] * 3 + ["copy", "softmax", "dropout", "layer_norm", "gelu"] + \
        ["gemm"] * 16 + ["gemm_sustained"] + ["flash_forward", "flash_backward"] * 2 + ["gemm_sustained"]
    assert [(r.dtype, r.shape) for r in data.of("gemm_sustained")] == [("float32", (1, 64, 64, 64)),
                                                                       ("float8", (1, 64, 64, 64))]  # the largest
    assert [r.dtype for r in data.of("gemm")] == ["float32"] * 8 + ["float8"] * 8  # torch._scaled_mm on the CPU
    scores, rows = 2 * 64 * 64, 64 * 32  # CPU_GRID: 2 x 64 x 64 scores, 64 x 32 rows, float32
    assert [r.nbytes for r in data.records[4:8]] == [2 * scores * 4, 2 * scores * 4 + scores, 2 * rows * 4,
                                                     2 * rows * 4]
    assert {r.shape for r in data.of("gemm")} == {(1, m, n, k) for m in (32, 64) for n in (32, 64) for k in (32, 64)}
    assert gpu.gemm_dtype(data) == "float32"  # FP8's records give their own figure
    assert [r.shape for r in data.of("flash_forward")] == [(1, 64, 2, 16, 0), (1, 64, 2, 16, 1)]
    assert data.of("copy")[0].nbytes == 2 << 20  # 1 MiB read and written
    path = tmp_path / "cpu.measurements.csv"
    path.write_text(measured.write(data.meta, list(data.records)))
    again = measured.read(path)
    cal = gpu.assemble(again, family="H100")
    assert cal.dtype == "float32" and cal.link is None
    bandwidths = measured.memory_bound_bandwidths(again)
    assert list(bandwidths) == ["softmax", "dropout", "layer_norm", "gelu"]
    assert cal.hardware.device.kernels.memory_bound_efficiency == \
        statistics.median(bandwidths.values()) / H100.hbm_bandwidth
    assert "memory-bound kernels: " in cal.summary() and ", their median (softmax " in cal.summary()
    assert cal.hardware.device.kernels.matmul_efficiency == measured.summarise(again, H100, "float32")[
        "matmul_efficiency"]
    held = min(1.0, again.of("gemm")[7].seconds / again.of("gemm_sustained")[0].seconds)  # (1, 64, 64, 64): 8th
    fp8 = [r for r in again.of("gemm") if r.dtype == "float8"]
    held8 = min(1.0, fp8[-1].seconds / again.of("gemm_sustained")[1].seconds)
    assert measured.sustained_fraction(again, "float8") == held8
    assert cal.hardware.device.kernels.fp8_matmul_efficiency == pytest.approx(
        max(r.flops / r.seconds for r in fp8) / 1979e12 * held8, rel=1e-12)  # the H100's FP8 peak (fp8.toml)
    assert "FP8 GEMMs (torch._scaled_mm): " in cal.summary()
    assert measured.sustained_fraction(again, "float32") == held
    assert cal.hardware.device.kernels.matmul_efficiency == pytest.approx(
        max(r.flops / r.seconds for r in again.of("gemm")) / H100.peak("float32") * held, rel=1e-12)
    assert gpu.measurements_path(Path("out/h100.toml")) == Path("out/h100.measurements.csv")


def test_a_collectives_report_becomes_records(tmp_path):
    report = tmp_path / "collectives.json"  # executor/collectives_bench.py's --json report, two ops
    report.write_text(json.dumps({"backend": "nccl", "world_size": 4, "results": [
        {"op": "all_reduce", "bytes": 1048576, "time": 2e-5, "algbw": 0, "busbw": 0, "busbw_factor": 1.5,
         "iters": 5, "verified": True},
        {"op": "broadcast", "bytes": 1048576, "time": 1e-5, "algbw": 0, "busbw": 0, "busbw_factor": 1.0,
         "iters": 5, "verified": True}]}))
    assert gpu.collective_records(report) == [measured.Record("all_reduce", "float32", (4,), 1048576, 2e-5)]
    report.write_text("{}")
    with pytest.raises(PipesimError, match="cannot read collectives report"):
        gpu.collective_records(report)


def test_the_docs_print_the_summary_the_code_computes():
    recorded = measured.read(ROOT / "tests/data/gpu_measurements_h200.csv")  # bench/gpu_calibrate.sh on an H200
    assert recorded.meta["device"] == "NVIDIA H200" and len(recorded.of("gemm")) == 128
    assert gpu.assemble(recorded).summary() in (ROOT / "docs/calibration.md").read_text()


def test_the_a100_what_if_file_is_mamf_times_the_h200_runs_ratios():
    """bench/hardware/dgx-a100-h200-ratios.toml (docs/gpu_model.md's what-if) carries the recorded H200 run's sustained
    fraction and memory-bound share over the A100's MAMF figure, and says it is no measurement of an A100."""
    hw = load_hardware(str(ROOT / "bench/hardware/dgx-a100-h200-ratios.toml"))
    run = measured.read(ROOT / "tests/data/gpu_measurements_h200.csv")
    k = hw.device.kernels
    assert hw.device.family == "A100" and k.source.startswith("what-if, not a measurement of an A100")
    mamf = 0.869  # the A100 profile's figure before [HE22]: MAMF 271.2 / 312 to three digits
    assert k.matmul_efficiency == pytest.approx(mamf * measured.sustained_fraction(run), abs=1e-4)
    share = measured.summarise(run, device_profile("H200"))["memory_bound_efficiency"]
    assert k.memory_bound_efficiency == pytest.approx(share, abs=1e-4)


def test_all_gather_and_reduce_scatter_get_their_own_bandwidth_factor_from_the_same_fit(tmp_path):
    # an all_reduce and two half-as-fast-per-byte kinds over 8 ranks, hand-made: the ring's bytes coefficient is
    # 2 (n-1)/n for all_reduce, (n-1)/n for the others (pipesim.comm.collective_costs.ring_time)
    rows = ["kind,dtype,shape,bytes,seconds", "all_reduce,float32,8,8192,2.2e-05",
            "all_reduce,float32,8,268435456,0.00128",
            "all_gather,float32,8,8192,1.5e-05", "all_gather,float32,8,268435456,0.0008",
            "reduce_scatter,float32,8,8192,1.5e-05", "reduce_scatter,float32,8,268435456,0.00072",
            "launch,float32,,0,5e-06"]
    data = measured.parse("\n".join(rows) + "\n")
    link = gpu.link_fit(data)
    ag = 7 / 8 * (268435456 - 8192) / (0.0008 - 1.5e-5)  # the all_gather fit's bandwidth
    rs = 7 / 8 * (268435456 - 8192) / (0.00072 - 1.5e-5)
    factors = gpu.collective_factors(data, link)
    assert factors == {"all_gather": pytest.approx(ag / link.bandwidth, rel=1e-14),
                       "reduce_scatter": pytest.approx(rs / link.bandwidth, rel=1e-14)}
    assert gpu.collective_factors(data, None) == {}
    only_ar = measured.parse("\n".join(rows[:3]) + "\n")
    assert gpu.collective_factors(only_ar, gpu.link_fit(only_ar)) == {}
    hw = replace(load_hardware("dgx-h100"), intra=replace(load_hardware("dgx-h100").intra,
                                                          bandwidth=link.bandwidth, collective_bandwidth=factors))
    # a ring all_gather on 8 GPUs of one node: NCCL's latency plus (n-1)/n S at bandwidth x factor, Simple protocol
    big = 1 << 30
    t = collective_time("all_gather", big, list(range(8)), hw, algo="ring", protocol="Simple")
    assert t.bus_bandwidth == link.bandwidth * factors["all_gather"]
    assert t.seconds == pytest.approx(ring_latency("all_gather", group_shape(hw, list(range(8))), "Simple")
                                      + 7 / 8 * big / (link.bandwidth * factors["all_gather"]), rel=1e-14)
    ar = collective_time("all_reduce", big, list(range(8)), hw, algo="ring", protocol="Simple")
    assert ar.bus_bandwidth == link.bandwidth  # all_reduce keeps the link's own bandwidth
    # the file carries the factors and reads back equal; a bad table is one line
    path = tmp_path / "hw.toml"
    path.write_text(hardware_to_toml(hw))
    assert load_hardware(str(path)) == hw and "collective_bandwidth = { all_gather = " in path.read_text()
    for bad, said in (("{ all_to_all = 0.9 }", "unknown collective 'all_to_all'"),
                      ("{ all_gather = 0 }", r"collective_bandwidth.all_gather must be a positive number"),
                      ("0.9", "must be a table of collective = factor")):
        text = hardware_to_toml(hw).replace("collective_bandwidth = {", f"collective_bandwidth = {bad} #{{", 1)
        path.write_text(text)
        with pytest.raises(PipesimError, match=said):
            load_hardware(str(path))
    # assemble puts them on the measured file's [intra] link
    sample = measured.parse(SAMPLE.read_text() + "\n".join(rows[3:7]) + "\n")
    cal = gpu.assemble(sample)
    assert cal.hardware.intra.collective_bandwidth == gpu.collective_factors(sample, cal.link)
    assert "collectives' bandwidth over all_reduce's: all_gather " in cal.summary()
    assert gpu.assemble(measured.read(SAMPLE)).hardware.intra.collective_bandwidth is None  # all_reduce only
