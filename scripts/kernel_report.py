"""Kernel report for sm_90: what ptxas and the SASS say about every CUDA kernel of plugins/core, with gates.

    python scripts/kernel_report.py                  # all plugins/core/src/*.cu; exit 1 when a gate fails
    python scripts/kernel_report.py --sources roi_align.cu --json report.json

Each core .cu is compiled as CMake compiles it (nvcc -std=c++17 --expt-relaxed-constexpr -O3), for sm_90 only,
with ``-cubin -Xptxas -v`` into a temporary folder (nothing is cached), then disassembled with ``cuobjdump -sass``
(the ``nvidia-cuda-cuobjdump`` wheel, which needs ``nvidia-cuda-nvdisasm``). Per kernel it prints registers,
stack frame and spills; per loop (a backward branch) the static SASS count, CALLs (the 64-bit division slow
path: a CALL whose callee is integer division) and 64-bit int<->float conversions (I2F/F2I .S64/.U64) inside loops; and for the kernels with a known
trip count the estimated SASS per element (a static cost model):

    per element = (loop body, inner loops times their trip count / unroll) / elements per loop iteration
                  + (every other instruction of the kernel) / elements per thread
(the element loop: of the innermost loops issuing the per-element marker -- those with no nested loop that issues
it too -- the one with the most global loads). Each iteration of the element loop is executed once per
`elements per loop iteration` elements (the markers it issues); everything else is charged once per thread's
work item: the setup before the loop, tails and the grid-stride step after it, cold paths too, so the estimate
is an upper bound of the dynamic path, with one exception: a block head that only thread 0 runs
(`if (threadIdx.x == 0)` at the kernel's start: the RoI kernels' plan head) is issued by one warp per block and
charged as such. Other loops (outside the element loop, neither holding it nor in it)
count `other_trip` times (once unless a kernel's Spec says otherwise: the fused backward's shuffle reduction over
its slices, up to log2(32) = 5 steps). Checked by hand on the DCN gather (float, int32 indices, 3x3, mask, sm_90,
2026-11-25): a 16-channel work item executes ~191 instructions up to the channel loop, 4 x 69 in it and ~8 after
it, ~30 per element; the model gives 31.9 (it also charges the 1-channel tail loop and the cold paths).

Gates (issue 25 item 6): 0 spill and 0 stack frame in every kernel; for the hot kernels (GATED below, float,
half and bfloat16 instantiations) <= 48 registers, no CALL and no 64-bit int<->float conversion inside loops,
and the SASS per element under the kernel's bound. A gated kernel missing from the sources is reported as
"kernel absent" and fails nothing. PENDING lists kernels known to break a gate, with the reason; they are
reported and do not fail the run, but one that passes every gate fails it (take it off the list).
Issue 37 item 7: "all loops" counts CALLs and conversions in every loop; LOOP_CLEAN kernels (every instantiation)
must have none, and NOT_PER_ELEMENT says, for the kernels that have some, why those loops do not run per element.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "plugins" / "core"
NVCC_FLAGS = ["-std=c++17", "--expt-relaxed-constexpr", "-O3", "-arch=sm_90"]
MAX_REGISTERS = 48


@dataclass(frozen=True)
class Spec:
    """The gates of one hot kernel. ``marker``: the opcode prefix issued once per element (each column element
    or output is stored once: STG; the fused backward's 4 atomics: RED, per_element 4). ``inner_trip``: trip
    count of the loops nested in the element loop (samples per bin), ``inner_loads``: global loads per inner
    iteration (the 4 taps), used to find the unroll factor. ``elements_per_thread``: the amortisation of the
    rest of the kernel (prologue, plan, epilogue). ``other_trip``: trip count of the loops outside the element
    loop (counted once by default; the fused backward's warp-shuffle reduction over slices: at most log2(32) = 5)."""
    max_sass_per_element: float
    marker: str = "STG"
    per_element: int = 1
    inner_trip: int = 1
    inner_loads: int = 4
    elements_per_thread: float = 16.0
    threads_per_block: int = 256
    other_trip: float = 1.0
    note: str = ""


# Hot kernels, keyed by their (unqualified) name.
GATED = {
    # The DCN gather (2026-11-25, sm_90, nvcc 13.0): 31-37 SASS per column element for float (the 4-channel loop
    # 67-83 static SASS, the rest 222-261 once per 16-channel slice), 40-48 registers, no 64-bit conversion in
    # loops, for every float/half/bfloat16 instantiation (32- and 64-bit indices; half/bfloat16 34-48). The kernel
    # before: 42-57 for float by this model (130-173 by the earlier one), its 64-bit-index variants with 6
    # I2F/F2I.S64 in the grid-stride loop.
    "deform_conv2d_gather_kernel": Spec(40, note="per column element, 16 channels per thread slice"),
    "deform_conv2d_sampling_backward_kernel": Spec(60, marker="RED", per_element=4, other_trip=5,
                                                   elements_per_thread=32.0,
                                                   note="per column element, at least 32 channels per thread slice "
                                                        "(kDcnMinBackwardSliceChannels)"),
    "roi_align_plan_forward_kernel": Spec(250, inner_trip=4, elements_per_thread=32 * 49 / 256,
                                          note="per output, sampling ratio 2, 7x7 bins, 32 channels per block"),
    "roi_align_plan_backward_kernel": Spec(float("inf"), marker="RED", per_element=16, inner_trip=4,
                                           note="registers and loops only"),
    "multi_level_roi_align_plan_forward_kernel": Spec(250, inner_trip=4, elements_per_thread=32 * 49 / 256,
                                                      note="per output, as RoIAlign's"),
    "multi_level_roi_align_plan_backward_kernel": Spec(float("inf"), marker="RED", per_element=16, inner_trip=4,
                                                       note="registers and loops only"),
    "deform_roi_pool_plan_forward_kernel": Spec(250, inner_trip=4, elements_per_thread=32 * 49 / 256,
                                                note="per output, as RoIAlign's (the bins' offsets applied in the plan)"),
    "deform_roi_pool_plan_grad_input_kernel": Spec(float("inf"), marker="RED", per_element=16, inner_trip=4,
                                                   note="registers and loops only"),
    # R-FCN's default grid: 4 x 4 samples per bin, so the bound is RoIAlign's 250 at 4 samples plus 12 samples of
    # about 25 SASS each (4 loads, 4 FMA, 2 LDS.128, addresses, the sample test and count); two stores per output
    # (the output and its count)
    "deform_psroi_pool_plan_forward_kernel": Spec(550, per_element=2, inner_trip=16, elements_per_thread=32 * 49 / 256,
                                                  note="per output, sample_per_part 4, 7x7 bins, 32 output channels "
                                                       "per block"),
    "deform_psroi_pool_plan_grad_input_kernel": Spec(float("inf"), marker="RED", per_element=64, inner_trip=16,
                                                     note="registers and loops only"),
}

# Kernels known to break a gate, with the reason.
PENDING: dict[str, str] = {
    "DeviceRadixSortOnesweepKernel": "CUB's radix sort (the deterministic DCN backward's plan): CUB's code, not ours",
    "DeviceRadixSortSingleTileKernel": "CUB's radix sort (the deterministic DCN backward's plan): CUB's code, not ours",
    "assert_levels_kernel": "MSDA's level-table check (one thread per level, no sampling): its loop's 64-bit division",
    "dcnv3_forward_kernel": "DCNv3 (62-91 registers, loops with 64-bit conversions): its own rewrite, not issue 48's",
    "dcnv3_backward_kernel": "DCNv3 (83-108 registers, loops with 64-bit conversions): its own rewrite, not issue 48's",
    "msda_forward_kernel": "multi-scale deformable attention (64-80 registers, loops with CALLs): its own rewrite",
    "msda_backward_kernel": "multi-scale deformable attention (96-128 registers, loops with CALLs): its own rewrite",
    "deform_conv2d_gather_kernel": "double only (the float64 gradcheck instantiation): 70-72 registers",
    "deform_conv2d_gather_kernel_wide": "double only (the float64 gradcheck instantiation): 64 registers",
    "deform_conv2d_point_grad_kernel": "double only (the float64 gradcheck instantiation): 56-68 registers",
    "deform_conv2d_sampling_backward_kernel": "double only (the float64 gradcheck instantiation): 80-92 registers",
    "deform_psroi_pool_backward_kernel": "the atomic backward of DeformPSRoIPool (grad_input scatter and grad_trans in "
                                         "one thread): 60 registers, 86 in double; capped at 48 it spills",
    "deform_psroi_pool_trans_grad_kernel": "deterministic grad_trans, a (RoI, class, part) per thread: 100 registers, "
                                           "128 in double; capped at 48 it spills 280 B",
    "deform_psroi_pool_forward_kernel": "double only: stack and spill at 48 registers",
    "deform_psroi_pool_plan_forward_kernel": "double only: stack and spill at 48 registers",
    "deform_psroi_pool_plan_grad_input_kernel": "double only: stack and spill at 48 registers",
    "roi_gather_footprint_kernel": "double only (DeformPSRoIPool's footprint): stack and spill at 48 registers",
    "roi_align_visit_backward_kernel": "double only: stack and spill at 48 registers (the bounded visit)",
    "multi_level_roi_align_visit_backward_kernel": "double only: stack and spill at 48 registers (the bounded visit)",
    "roi_align_rotated_visit_forward_kernel": "double only: stack and spill at 48 registers (the bounded visit)",
    "roi_align_rotated_visit_backward_kernel": "double only: stack and spill at 48 registers (the bounded visit)",
}

# Kernels excused from a gate other than the SASS rules (every kernel of every instantiation keeps those: no loop with
# a CALL or a 64-bit int<->float conversion, registers <= MAX_REGISTERS, no stack, no spill), by name, with the reason.
EXCEPTIONS: dict[str, str] = {}

_DTYPES = {"f": "float", "d": "double", "6__half": "half", "13__nv_bfloat16": "bfloat16"}


def kernel_name(mangled: str) -> tuple[str, str]:
    """(unqualified name, first template argument as a dtype) of an Itanium-mangled kernel name."""
    i = 3 if mangled.startswith("_ZN") else 2
    name = ""
    while i < len(mangled) and mangled[i].isdigit():
        n = re.match(r"\d+", mangled[i:]).group(0)
        i += len(n)
        name, i = mangled[i:i + int(n)], i + int(n)
    args = mangled[i + 1:] if mangled[i:i + 1] == "I" else ""
    dtype = next((v for k, v in _DTYPES.items() if args.startswith(k)), "")
    return name or mangled, dtype


# ---- ptxas -v -------------------------------------------------------------------------------------

@dataclass
class Kernel:
    source: str
    mangled: str
    name: str
    dtype: str
    registers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    sass: int = 0
    loops: list = field(default_factory=list)  # [(start, end, static count)]
    call_all_loops: int = 0
    conv64_all_loops: int = 0
    bad_loops: list = field(default_factory=list)  # [(start, end, CALLs, 64-bit conversions)]: the SASS rules' loops
    violations: int = 0
    sass_per_element: float | None = None
    failures: list = field(default_factory=list)
    status: str = ""


def parse_ptxas(text: str, source: str) -> dict[str, Kernel]:
    kernels, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name, dtype = kernel_name(m.group(1))
            cur = kernels.setdefault(m.group(1), Kernel(source, m.group(1), name, dtype))
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            cur.stack, cur.spill_stores, cur.spill_loads = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur.registers = int(m.group(1))
    return kernels


# ---- SASS -----------------------------------------------------------------------------------------

_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def parse_sass(text: str) -> dict[str, list[tuple[int, str, str]]]:
    """Function name -> [(address, opcode, operands)]."""
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = _INSTR.search(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(3), m.group(4).strip()))
    return funcs


def is_conv64(op: str) -> bool:
    """A 64-bit integer <-> float conversion (I2F.S64, I2F.F64.U64, F2I.S64.TRUNC, ...)."""
    parts = op.split(".")
    return parts[0] in ("I2F", "F2I") and any(p in ("S64", "U64") for p in parts[1:])


def is_call(op: str) -> bool:
    """Any CALL (CALL.REL, CALL.ABS...): a subroutine not inlined -- a division or math slow path, an assert."""
    return op.split(".")[0] == "CALL"


def find_loops(instrs) -> list[tuple[int, int]]:
    """[(first, last)] instruction positions of each loop: a branch back to an earlier address."""
    pos = {a: i for i, (a, _, _) in enumerate(instrs)}
    loops = []
    for i, (addr, op, args) in enumerate(instrs):
        if op.split(".")[0] != "BRA":
            continue
        t = re.search(r"0x([0-9a-f]+)", args)
        if t and int(t.group(1), 16) <= addr and int(t.group(1), 16) in pos:
            loops.append((pos[int(t.group(1), 16)], i))
    return sorted(set(loops))


def _inside(inner, outer) -> bool:
    return outer[0] <= inner[0] and inner[1] <= outer[1] and inner != outer


def sass_per_element(instrs, loops, spec: Spec):
    """(the static cost model above, the element loop); (None, None) when no loop issues the marker."""
    def count(lo, hi, pred):
        return sum(1 for _, op, _ in instrs[lo:hi + 1] if pred(op))

    def marker(op):
        return op.startswith(spec.marker)

    # The element loop: of the innermost loops whose own body (without nested loops) issues the marker, the one
    # with the most global loads (the hot path; a loop that only stores, such as writing zeros, is not it). An
    # outer loop that holds a marker loop (a grid-stride loop around a channel loop) is per-thread work.
    def own_markers(lp):
        inner = [q for q in loops if _inside(q, lp) and not any(_inside(q, r) and _inside(r, lp) for r in loops)]
        return inner, count(lp[0], lp[1], marker) - sum(count(q[0], q[1], marker) for q in inner)

    issuing = [lp for lp in loops if own_markers(lp)[1] > 0]
    best = None
    for lp in issuing:
        if any(_inside(q, lp) for q in issuing):
            continue
        inner, own = own_markers(lp)
        loads = count(lp[0], lp[1], lambda op: op.startswith("LDG"))
        if best is None or (loads, lp[1] - lp[0]) > best[3]:
            best = (lp, inner, own, (loads, lp[1] - lp[0]))
    if best is None:
        return None, None
    lp, inner, own, _ = best
    size = lp[1] - lp[0] + 1
    body = size - sum(q[1] - q[0] + 1 for q in inner)
    for q in inner:
        loads = count(q[0], q[1], lambda op: op.startswith("LDG") or op.startswith("LDS"))
        unroll = max(1, loads // spec.inner_loads) if spec.inner_loads else 1
        trips = -(-spec.inner_trip // unroll)
        body += (q[1] - q[0] + 1) * trips
    elements = own / spec.per_element
    # Everything else once per thread: before and after the element loop (cold paths and tails included), up
    # to the kernel's last instruction (not the alignment padding after it: NOPs and the branch to itself).
    end = len(instrs)
    while end > 0 and (instrs[end - 1][1].startswith("NOP") or _self_branch(instrs[end - 1])):
        end -= 1
    # Loops outside the element loop that neither hold it nor sit in it (outermost ones, with what they hold):
    # other_trip times.
    others = [q for q in loops if q != lp and not _inside(q, lp) and not _inside(lp, q) and q[1] < end]
    others = [q for q in others if not any(_inside(q, r) for r in others)]
    # Those issuing the marker are the element loop's alternatives (a border point's scatter): charged once.
    others = [q for q in others if count(q[0], q[1], marker) == 0]
    # A block head that one thread computes (`if (threadIdx.x == 0) {...}`: the RoI kernels' plan head) is issued
    # by one warp of the block, not by every thread: charged once per block's elements, i.e. divided by its warps.
    lo, hi = one_thread_region(instrs)
    if lp[0] <= hi and lo <= lp[1]:
        lo, hi = 0, -1
    head = hi - lo + 1
    rest = end - size - head + (spec.other_trip - 1) * sum(q[1] - q[0] + 1 for q in others)
    warps = spec.threads_per_block / 32
    return body / elements + rest / spec.elements_per_thread + head / (spec.elements_per_thread * warps), lp


def one_thread_region(instrs) -> tuple[int, int]:
    """(first, last) index of the region that only thread 0 runs, (0, -1) if none: in the kernel's opening, an
    `S2R Rt, SR_TID.X`, an `ISETP.NE... Pn, PT, Rt, RZ` and then a forward `@Pn BRA target`: the instructions after
    the branch up to its target."""
    tid = pred = None
    for i, (addr, op, args) in enumerate(instrs[:24]):
        a = [x.strip() for x in args.split(",")]
        if op == "S2R" and len(a) == 2 and a[1] == "SR_TID.X":
            tid = a[0]
        elif tid and op.startswith("ISETP.NE") and len(a) >= 4 and a[2] == tid and a[3] == "RZ":
            pred = a[0]
        elif pred and op.split(".")[0] == "BRA":  # (the parser drops the predicate: the first branch after it)
            t = re.search(r"0x([0-9a-f]+)", args)
            target = int(t.group(1), 16) if t else -1
            last = max((j for j, ins in enumerate(instrs) if ins[0] < target), default=i)
            return (i + 1, last) if target > addr else (0, -1)
    return 0, -1


def _self_branch(instr) -> bool:
    addr, op, args = instr
    t = re.search(r"0x([0-9a-f]+)", args)
    return op.split(".")[0] == "BRA" and t is not None and int(t.group(1), 16) == addr


def analyse(kernel: Kernel, instrs) -> None:
    """Loops, the SASS per element of a gated kernel, and every loop holding a CALL or a 64-bit conversion."""
    loops = find_loops(instrs)
    kernel.sass = len(instrs)
    kernel.loops = [(instrs[a][0], instrs[b][0], b - a + 1) for a, b in loops]
    spec = GATED.get(kernel.name)
    if spec is not None:
        kernel.sass_per_element, _ = sass_per_element(instrs, loops, spec)
    kernel.bad_loops = []
    in_loop = set()
    for a, b in loops:
        calls = sum(1 for i in range(a, b + 1) if is_call(instrs[i][1]))
        conv = sum(1 for i in range(a, b + 1) if is_conv64(instrs[i][1]))
        if calls or conv:
            kernel.bad_loops.append((instrs[a][0], instrs[b][0], calls, conv))
        in_loop.update(range(a, b + 1))
    kernel.call_all_loops = sum(1 for i in in_loop if is_call(instrs[i][1]))
    kernel.conv64_all_loops = sum(1 for i in in_loop if is_conv64(instrs[i][1]))


def sass_rules(kernel: Kernel) -> dict[str, int]:
    """The SASS rules' counters of one instantiation (docs/performance.md, issue 48): loops holding a CALL or a
    64-bit int<->float conversion (each loop once; a loop nested in another counts in both), registers over the
    budget, a stack frame, spills."""
    return {"loops": len(kernel.bad_loops), "registers": int(kernel.registers > MAX_REGISTERS),
            "stack": int(kernel.stack > 0), "spill": int(kernel.spill_stores > 0 or kernel.spill_loads > 0)}


def gate(kernel: Kernel) -> None:
    f = kernel.failures
    rules = sass_rules(kernel)
    kernel.violations = sum(rules.values())
    if kernel.stack:
        f.append(f"stack frame {kernel.stack} B (expected 0)")
    if kernel.spill_stores or kernel.spill_loads:
        f.append(f"spills {kernel.spill_stores}/{kernel.spill_loads} B (expected 0)")
    if rules["registers"]:
        f.append(f"{kernel.registers} registers (expected <= {MAX_REGISTERS})")
    if rules["loops"]:
        calls = sum(c for _, _, c, _ in kernel.bad_loops)
        conv = sum(v for _, _, _, v in kernel.bad_loops)
        f.append(f"{rules['loops']} loops with CALL or 64-bit int<->float conversion ({calls} CALL, {conv} conversions; "
                 "expected none)")
    spec = GATED.get(kernel.name)
    if spec is not None and kernel.dtype == "float" and kernel.name not in EXCEPTIONS:
        if kernel.sass_per_element is None:
            f.append(f"no loop issues {spec.marker} (the element loop was not found)")
        elif kernel.sass_per_element > spec.max_sass_per_element:
            f.append(f"{kernel.sass_per_element:.0f} SASS per element (expected <= {spec.max_sass_per_element:g})")
    kernel.status = "FAIL: " + "; ".join(f) if f else "ok"


def settle_pending(kernels: list[Kernel]) -> None:
    """A PENDING kernel's failing instantiations are reported as pending; when none of them fails any more, they
    all fail the run ("passes": take it off the list)."""
    for name, why in PENDING.items():
        # "double only": the other instantiations keep every gate (a double G of a footprint kernel: Idd in the name)
        same = [k for k in kernels if k.name == name and
                (not why.startswith("double only") or k.dtype == "double" or (not k.dtype and "Idd" in k.mangled))]
        if not same:
            continue
        if any(k.failures for k in same):
            for k in same:
                if k.failures:
                    k.status = "pending: " + why
        else:
            for k in same:
                k.status = "passes (remove it from PENDING)"


def failed(kernel: Kernel) -> bool:
    return kernel.status.startswith("FAIL") or kernel.status.startswith("passes")


# ---- tools ---------------------------------------------------------------------------------------

def find_nvcc() -> str | None:
    for d in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if d and Path(d, "bin", "nvcc").exists():
            return str(Path(d, "bin", "nvcc"))
    return shutil.which("nvcc")


def find_cuobjdump() -> str | None:
    """cuobjdump from the nvidia-cuda-cuobjdump wheel (with nvdisasm from nvidia-cuda-nvdisasm beside it),
    else one on PATH that has nvdisasm beside it or on PATH."""
    try:
        import nvidia  # namespace package of the CUDA wheels
        for base in nvidia.__path__:
            for exe in sorted(Path(base).glob("cu*/bin/cuobjdump")):
                if exe.with_name("nvdisasm").exists():
                    return str(exe)
    except ImportError:
        pass
    exe = shutil.which("cuobjdump")
    if exe and (Path(exe).with_name("nvdisasm").exists() or shutil.which("nvdisasm")):
        return exe
    return None


def missing_tools() -> str | None:
    if not find_nvcc():
        return "nvcc not found (CUDA_HOME, /usr/local/cuda or PATH)"
    if not find_cuobjdump():
        return "cuobjdump with nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
    return None


def compile_one(nvcc: str, cuobjdump: str, src: Path, out: Path) -> dict[str, Kernel]:
    cubin = out / (src.stem + ".cubin")
    cmd = [nvcc, *NVCC_FLAGS, f"-I{CORE / 'include'}", "-cubin", "-Xptxas", "-v", "-o", str(cubin), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src.name}:\n{r.stderr[-4000:]}")
    kernels = parse_ptxas(r.stdout + r.stderr, src.name)
    env = dict(os.environ, PATH=str(Path(cuobjdump).parent) + os.pathsep + os.environ.get("PATH", ""))
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env, check=True)
    funcs = parse_sass(sass.stdout)
    for mangled, k in kernels.items():
        analyse(k, funcs.get(mangled, []))
        gate(k)
    return kernels


def report(sources: list[Path], jobs: int) -> list[Kernel]:
    nvcc, cuobjdump = find_nvcc(), find_cuobjdump()
    with tempfile.TemporaryDirectory(prefix="dcnkit-kernel-report-") as tmp:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            results = list(pool.map(lambda s: compile_one(nvcc, cuobjdump, s, Path(tmp)), sources))
    kernels = sorted((k for r in results for k in r.values()), key=lambda k: (k.source, k.name, k.dtype, k.mangled))
    settle_pending(kernels)
    return kernels


def table(kernels: list[Kernel]) -> str:
    head = ("| source | kernel | dtype | regs | stack | spill | SASS | loops (static SASS) | CALL/I2F64 in loops "
            "| bad loops | SASS/elem | gate |")
    rows = [head, "|" + "---|" * 12]
    for k in kernels:
        loops = ", ".join(str(n) for _, _, n in k.loops[:6]) + (" ..." if len(k.loops) > 6 else "")
        spec = GATED.get(k.name)
        shown = k.sass_per_element is not None and spec is not None and spec.max_sass_per_element != float("inf")
        per = f"{k.sass_per_element:.0f}" if shown else ""
        rows.append(f"| {k.source} | {k.name} | {k.dtype} | {k.registers} | {k.stack} | "
                    f"{k.spill_stores}/{k.spill_loads} | {k.sass} | {loops} | {k.call_all_loops}/{k.conv64_all_loops} | "
                    f"{len(k.bad_loops)} | {per} | {k.status} |")
    present = {k.name for k in kernels}
    for name, spec in GATED.items():
        if name not in present:
            rows.append(f"| | {name} | | | | | | | | | | kernel absent ({spec.note}) |")
    if EXCEPTIONS:
        rows.append("\nExceptions (gates other than the SASS rules):")
        rows.extend(f"  {name}: {why}" for name, why in EXCEPTIONS.items())
    return "\n".join(rows)


def violation_table(kernels: list[Kernel]) -> str:
    """The SASS rules' count by kernel (all its instantiations): loops with a CALL or a 64-bit conversion, kernels
    over MAX_REGISTERS registers, with a stack frame, with spills; and the total."""
    by_name: dict[str, dict[str, int]] = {}
    for k in kernels:
        d = by_name.setdefault(k.name, {"instantiations": 0, "loops": 0, "registers": 0, "stack": 0, "spill": 0})
        d["instantiations"] += 1
        for key, n in sass_rules(k).items():
            d[key] += n
    rows = [f"SASS rules (sm_90; docs/performance.md): per kernel, over its instantiations",
            "| kernel | instantiations | loops with CALL / 64-bit conversion | registers > "
            f"{MAX_REGISTERS} | stack | spill | violations |", "|" + "---|" * 7]
    total = {"loops": 0, "registers": 0, "stack": 0, "spill": 0}
    for name in sorted(by_name, key=lambda n: (-sum(v for key, v in by_name[n].items() if key != "instantiations"), n)):
        d = by_name[name]
        v = d["loops"] + d["registers"] + d["stack"] + d["spill"]
        for key in total:
            total[key] += d[key]
        rows.append(f"| {name} | {d['instantiations']} | {d['loops']} | {d['registers']} | {d['stack']} | "
                    f"{d['spill']} | {v} |")
    rows.append(f"\nSASS rule violations: {sum(total.values())} (loops with CALL or 64-bit conversion {total['loops']}, "
                f"over {MAX_REGISTERS} registers {total['registers']}, stack {total['stack']}, spill {total['spill']}) "
                f"in {len(kernels)} kernel instantiations")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", nargs="*", help="file names under plugins/core/src (default: every .cu)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel nvcc processes (default 2)")
    ap.add_argument("--json", help="also write the report as JSON here")
    args = ap.parse_args(argv)
    why = missing_tools()
    if why:
        print(f"kernel report skipped: {why}")
        return 0
    src_dir = CORE / "src"
    sources = [src_dir / s for s in args.sources] if args.sources else sorted(src_dir.glob("*.cu"))
    for s in sources:
        if not s.exists():
            ap.error(f"--sources: expected files under {src_dir}, got {s.name} (not found)")
    kernels = report(sources, args.jobs)
    print(table(kernels))
    print()
    print(violation_table(kernels))
    bad = [k for k in kernels if failed(k)]
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(k) for k in kernels], indent=1))
    print(f"\n{len(kernels)} kernels, {len(bad)} failing a gate" + "".join(f"\n  {k.name} ({k.dtype}): {k.status}" for k in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
