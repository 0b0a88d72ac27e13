"""FP8 GEMM figures of a device family: its FP8 tensor-core peak, the fraction real FP8 GEMMs reach, its layouts.

An FP8 GEMM is timed by the same model as any other (pipesim.device.gemm: tile and wave quantisation on the
family's tile shapes, operands through HBM): only the peak, the achievable fraction and the bytes per operand
change. The output tiles are the BF16 ones: CUTLASS's and cuBLAS's Hopper FP8 kernels use 128 x 128 and 128 x 256
output tiles (both in the family's list) with a K tile of 128 bytes, 128 FP8 elements against BF16's 64, and the
model has no K quantisation, so the K tile changes nothing here. The figures live in
pipesim/presets/gemm/fp8.toml with a source each; a family absent there has no FP8 tensor cores (A100), and a
device without a family (a CPU) none either: FP8 is refused there in one line, as an unknown recipe is.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from pipesim.device.profile import DeviceProfile
from pipesim.errors import PipesimError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

FIELDS = ("peak", "matmul_efficiency", "tn_only", "recipes")
# recipe_efficiency: recipe -> its GEMMs' own fraction of its peak, where a source measures it apart;
# fp4_peak: the FP4 tensor cores' dense FLOP/s (Blackwell), which NVFP4's GEMMs (dtype float4) run at
OPTIONAL = ("recipe_efficiency", "fp4_peak")
FP8 = "float8"  # the dtype name pipesim.device.profile.DTYPE_BYTES gives one byte
FP4 = "float4"  # ... half a byte: NVFP4's E2M1 elements
QUANTIZED = (FP8, FP4)  # the GEMM dtypes a quantized linear runs in, timed on these figures (gemm_profile)
FP4_RECIPES = ("nvfp4",)  # recipes whose GEMMs run on the FP4 tensor cores (Megatron-core's --fp4-recipe choices)


@dataclass(frozen=True)
class Fp8Figures:
    """One family's FP8 tensor cores, each figure with its source (pipesim/presets/gemm/fp8.toml)."""

    family: str
    peak: float  # FLOP/s, dense FP8 (E4M3 and E5M2 alike)
    matmul_efficiency: float  # best achievable fraction of `peak` for a large FP8 GEMM
    tn_only: bool  # FP8 GEMMs take only the TN layout (Hopper): the dgrad and wgrad need transposed copies
    recipes: tuple[str, ...]  # --fp8-recipe names run on this family (Transformer Engine's; torchao's rowwise)
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    # a recipe whose GEMMs reach another fraction of `peak` (Blackwell's block-scaled MXFP8 GEMMs), by recipe name
    recipe_efficiency: tuple[tuple[str, float], ...] = ()
    fp4_peak: float | None = None  # FLOP/s, dense FP4 (NVFP4's GEMMs); None: no FP4 tensor cores (Hopper)

    def __post_init__(self) -> None:
        if not (isinstance(self.peak, (int, float)) and self.peak > 0):
            raise PipesimError(f"fp8 figures of {self.family}: peak must be positive FLOP/s, got {self.peak!r}")
        if not (isinstance(self.matmul_efficiency, float) and 0 < self.matmul_efficiency <= 1):
            raise PipesimError(f"fp8 figures of {self.family}: matmul_efficiency must be a fraction in (0, 1], got "
                               f"{self.matmul_efficiency!r}")
        if not isinstance(self.tn_only, bool) or not self.recipes:
            raise PipesimError(f"fp8 figures of {self.family}: tn_only must be true or false and recipes non-empty")
        for recipe, eff in self.recipe_efficiency:
            if recipe not in self.recipes or not (isinstance(eff, float) and 0 < eff <= 1):
                raise PipesimError(f"fp8 figures of {self.family}: recipe_efficiency {recipe} = {eff!r} must be a "
                                   "fraction in (0, 1] of one of its recipes")
        fp4 = [r for r in self.recipes if r in FP4_RECIPES]
        if self.fp4_peak is not None and not (isinstance(self.fp4_peak, (int, float)) and self.fp4_peak > 0):
            raise PipesimError(f"fp8 figures of {self.family}: fp4_peak must be positive FLOP/s, got {self.fp4_peak!r}")
        if fp4 and (self.fp4_peak is None or fp4[0] not in dict(self.recipe_efficiency)):
            raise PipesimError(f"fp8 figures of {self.family}: recipe {fp4[0]} needs fp4_peak and its own "
                               "recipe_efficiency (the FP4 tensor cores' figures)")

    def peak_of(self, recipe: str | None = None) -> float:
        """Dense FLOP/s `recipe`'s GEMMs run at: the FP4 tensor cores' for NVFP4, the FP8 ones' otherwise."""
        return self.fp4_peak if recipe in FP4_RECIPES and self.fp4_peak is not None else self.peak

    def efficiency(self, recipe: str | None = None) -> float:
        """The achievable fraction of `peak` for `recipe`'s GEMMs (its own figure where one is given)."""
        return dict(self.recipe_efficiency).get(recipe, self.matmul_efficiency)

    def gemm_profile(self, profile: DeviceProfile, recipe: str | None = None) -> DeviceProfile:
        """`profile` as `recipe`'s FP8 GEMMs see it: the FP8 peak (and the FP4 one, which NVFP4's float4 GEMMs take)
        and achievable fraction, every other figure (SMs, tiles, HBM, overhead, overlap) the family's own."""
        own = recipe in dict(self.recipe_efficiency)
        source = self.sources.get("recipe_efficiency" if own else "matmul_efficiency", "")
        peaks = {FP8: self.peak, **({FP4: self.fp4_peak} if self.fp4_peak is not None else {})}
        return replace(profile, flops={**profile.flops, **peaks}, matmul_efficiency=self.efficiency(recipe),
                       sources={**profile.sources, "flops": self.sources.get("peak", ""), "matmul_efficiency": source})


def _data_file() -> Path:
    return Path(str(resources.files("pipesim").joinpath("presets", "gemm", "fp8.toml")))


def load_fp8_figures(path: Path | None = None) -> dict[str, Fp8Figures]:
    """Every family of an FP8 figures file (default the shipped fp8.toml), each field with its source."""
    path = path or _data_file()
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PipesimError(f"cannot read FP8 figures {path}: {exc}") from exc
    out = {}
    for family, table in data.items():
        given = set(table) - {"sources"}
        if not set(FIELDS) <= given <= set(FIELDS) | set(OPTIONAL):
            raise PipesimError(f"{path}: [{family}] must give exactly {', '.join(FIELDS)} (and may give "
                               f"{', '.join(OPTIONAL)})")
        unsourced = given - set(table.get("sources", {}))
        if unsourced:
            raise PipesimError(f"{path}: [{family}] names no source for {', '.join(sorted(unsourced))}")
        out[family] = Fp8Figures(family, table["peak"], table["matmul_efficiency"], table["tn_only"],
                                 tuple(table["recipes"]), dict(table["sources"]),
                                 tuple(sorted(table.get("recipe_efficiency", {}).items())), table.get("fp4_peak"))
    return out


@lru_cache(maxsize=8)
def fp8_figures(family: str | None, device: str = "") -> Fp8Figures:
    """The FP8 figures of `family`, or a one-line error: a device without FP8 tensor cores cannot run FP8."""
    figures = load_fp8_figures()
    if not family or family not in figures:
        what = device or family or "this device"
        raise PipesimError(f"--fp8-format needs FP8 tensor cores ({', '.join(figures)}): {what} has none")
    return figures[family]


def check_fp8_recipe(family: str | None, recipe: str, device: str = "") -> Fp8Figures:
    """The family's FP8 figures, after checking that Transformer Engine runs `recipe` there (mxfp8, nvfp4:
    Blackwell)."""
    blackwell = ", ".join(f for f, figs in load_fp8_figures().items() if figs.fp4_peak)
    if recipe in FP4_RECIPES and (not family or family not in load_fp8_figures()):
        what = device or family or "this device"
        raise PipesimError(f"--fp4-format needs FP4 tensor cores (Blackwell: {blackwell}): {what} has none")
    figures = fp8_figures(family, device)
    if recipe not in figures.recipes:
        need = f"Blackwell ({blackwell})" if recipe in ("mxfp8", *FP4_RECIPES) else \
            "a device that Transformer Engine runs it on"
        flag = "--fp4-recipe" if recipe in FP4_RECIPES else "--fp8-recipe"
        raise PipesimError(f"{flag} {recipe} needs {need}: {device or family} runs "
                           f"{', '.join(figures.recipes)}")
    return figures


__all__ = ["FP4", "FP4_RECIPES", "FP8", "QUANTIZED", "Fp8Figures", "check_fp8_recipe", "fp8_figures",
           "load_fp8_figures"]
