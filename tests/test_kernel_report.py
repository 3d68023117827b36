"""scripts/kernel_report.py: the sm_90 kernel report (ptxas registers, stack and spills; SASS loops, CALL and
64-bit conversions in hot loops, SASS per element) and its gates. The parsing and the gates are checked on small
hand-written ptxas / SASS texts; then the report runs on every core .cu (nvcc and the cuobjdump wheel; skipped
with the reason where they are missing), prints its table and fails on a gate."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "kernel_report.py"
_spec = importlib.util.spec_from_file_location("kernel_report", SCRIPT)
kr = importlib.util.module_from_spec(_spec)
sys.modules["kernel_report"] = kr
_spec.loader.exec_module(kr)

PLAN = "_ZN6dcnkit12_GLOBAL__N_129roi_align_plan_forward_kernelIffEEvNS_14RoIAlignParamsEPKT_S5_PS3_"
OTHER = "_ZN6dcnkit12_GLOBAL__N_112other_kernelIdEEvPKT_"
PTXAS = f"""ptxas info    : Compiling entry function '{PLAN}' for 'sm_90'
ptxas info    : Function properties for {PLAN}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers
ptxas info    : Function properties for {OTHER}
    32 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 90 registers, used 0 barriers
"""


def _sass(name, body):
    lines = [f"\t\tFunction : {name}"]
    for i, ins in enumerate(body):
        lines.append(f"        /*{i * 16:04x}*/                   {ins} ;   /* 0x0 */")
    return "\n".join(lines)


# prologue (2), element loop [2, 11] with an inner loop [4, 9] of 4 taps (unroll 1), 1 STG per element
ELEMENT_NEST = ["S2R R0, SR_TID.X", "MOV R1, R2",
                "IADD3 R3, R3, 1, RZ", "MOV R4, RZ",
                "LDG.E R5, [R6]", "LDG.E R7, [R6+0x4]", "LDG.E R8, [R6+0x8]", "LDG.E R9, [R6+0xc]", "FFMA R4, R5, R7, R4",
                "@P0 BRA 0x40",
                "STG.E [R10], R4", "@P1 BRA 0x20",
                "EXIT"]


def test_kernel_names_and_dtypes_from_mangled_names():
    assert kr.kernel_name(PLAN) == ("roi_align_plan_forward_kernel", "float")
    assert kr.kernel_name("_ZN6dcnkit16store_acc_kernelI13__nv_bfloat16fEEvPKT0_lPT_") == ("store_acc_kernel", "bfloat16")
    assert kr.kernel_name("_ZN6dcnkit3fooI6__halfEEvv") == ("foo", "half")


def test_ptxas_registers_stack_and_spills():
    ks = kr.parse_ptxas(PTXAS, "x.cu")
    assert (ks[PLAN].registers, ks[PLAN].stack, ks[PLAN].spill_stores) == (40, 0, 0)
    assert (ks[OTHER].registers, ks[OTHER].stack, ks[OTHER].spill_stores, ks[OTHER].spill_loads) == (90, 32, 4, 8)


def test_loops_conversions_and_the_per_element_model():
    funcs = kr.parse_sass(_sass(PLAN, ELEMENT_NEST))
    instrs = funcs[PLAN]
    assert [op for _, op, _ in instrs][:3] == ["S2R", "MOV", "IADD3"]
    assert kr.find_loops(instrs) == [(2, 11), (4, 9)]
    assert kr.is_conv64("I2F.S64") and kr.is_conv64("F2I.S64.TRUNC") and kr.is_conv64("I2F.F64.U64")
    assert not kr.is_conv64("I2F.U32.RP") and not kr.is_conv64("F2I.FTZ.U32.TRUNC.NTZ") and not kr.is_conv64("F2F.F64.F32")
    # element loop: 10 - 6 own + 6 * 4 trips = 28 per element, plus the 3 instructions outside it (2 before, EXIT
    # after) / elements_per_thread
    spec = kr.GATED["roi_align_plan_forward_kernel"]
    value, loop = kr.sass_per_element(instrs, kr.find_loops(instrs), spec)
    assert loop == (2, 11)
    assert value == pytest.approx(4 + 6 * 4 + 3 / spec.elements_per_thread)
    # alignment padding after the last instruction is not counted
    padded = kr.parse_sass(_sass(PLAN, ELEMENT_NEST + ["BRA 0xd0", "NOP", "NOP"]))[PLAN]
    assert kr.sass_per_element(padded, kr.find_loops(padded), spec)[0] == pytest.approx(value)
    # a loop after the element loop (a shuffle reduction) counts other_trip times; the EXIT once
    tail = ELEMENT_NEST[:12] + ["SHFL.DOWN PT, R1, R2, R3, R4", "@P2 BRA 0xc0", "EXIT", "NOP", "NOP"]
    instrs = kr.parse_sass(_sass(PLAN, tail))[PLAN]
    five = kr.Spec(250, inner_trip=4, elements_per_thread=16, other_trip=5)
    value, loop = kr.sass_per_element(instrs, kr.find_loops(instrs), five)
    assert loop == (2, 11)
    assert value == pytest.approx(4 + 6 * 4 + (2 + 2 * 5 + 1) / 16)
    # a loop that only stores (zeros for a bad RoI) beside the hot one is not the element loop
    zeros = ["STG.E [R10], RZ", "@P2 BRA 0x0"]
    instrs = kr.parse_sass(_sass(PLAN, zeros + ELEMENT_NEST[:9] + ["@P0 BRA 0x60", "STG.E [R10], R4",
                                                                   "@P1 BRA 0x40", "EXIT"]))[PLAN]
    assert kr.sass_per_element(instrs, kr.find_loops(instrs), spec)[1] == (4, 13)


def test_the_element_loop_is_the_innermost_marker_loop():
    # A grid-stride loop [1, 12] whose own body stores 2 elements (a channel remainder) around a channel loop
    # [4, 10] (4 loads, 1 store): the channel loop is the element loop (7 SASS per element), and the other 7
    # instructions of the kernel (setup, remainder, grid step, EXIT) are charged once per thread.
    body = ["S2R R0, SR_TID.X",
            "MOV R1, R2", "STG.E [R10], R4", "STG.E [R10+0x4], R4",
            "LDG.E R5, [R6]", "LDG.E R7, [R6+0x4]", "LDG.E R8, [R6+0x8]", "LDG.E R9, [R6+0xc]",
            "FFMA R4, R5, R7, R4", "STG.E [R10], R4", "@P0 BRA 0x40",
            "IADD3 R0, R0, 0x100, RZ", "@P1 BRA 0x10", "EXIT"]
    spec = kr.GATED["deform_conv2d_gather_kernel"]
    instrs = kr.parse_sass(_sass(PLAN, body))[PLAN]
    assert kr.find_loops(instrs) == [(1, 12), (4, 10)]
    value, loop = kr.sass_per_element(instrs, kr.find_loops(instrs), spec)
    assert loop == (4, 10)
    assert value == pytest.approx(7 + 7 / spec.elements_per_thread)


def test_a_block_head_of_thread_zero_is_charged_once_per_block():
    # `if (threadIdx.x == 0) { head }` [3, 6] before the element loop [7, 11]: one warp of the block issues the head,
    # so it costs head / (elements per thread x warps per block); the other 4 instructions once per thread.
    body = ["S2R R2, SR_TID.X", "ISETP.NE.AND P0, PT, R2, RZ, PT", "@P0 BRA 0x70",
            "LDG.E R3, [R4]", "FMUL R3, R3, R3", "FADD R3, R3, R3", "STS [RZ], R3",
            "LDG.E R5, [R6]", "LDG.E R7, [R6+0x4]", "LDG.E R8, [R6+0x8]", "LDG.E R9, [R6+0xc]",
            "STG.E [R10], R4", "@P1 BRA 0x70", "EXIT"]
    spec = kr.GATED["deform_conv2d_gather_kernel"]
    instrs = kr.parse_sass(_sass(PLAN, body))[PLAN]
    assert kr.one_thread_region(instrs) == (3, 6)
    value, loop = kr.sass_per_element(instrs, kr.find_loops(instrs), spec)
    assert loop == (7, 12)
    assert value == pytest.approx(6 + 4 / spec.elements_per_thread + 4 / (spec.elements_per_thread * 8))
    # A branch on another register is no thread-0 head: all of it is charged per thread.
    other = [b.replace("ISETP.NE.AND P0, PT, R2, RZ, PT", "ISETP.NE.AND P0, PT, R9, RZ, PT") for b in body]
    instrs = kr.parse_sass(_sass(PLAN, other))[PLAN]
    assert kr.one_thread_region(instrs) == (0, -1)
    assert kr.sass_per_element(instrs, kr.find_loops(instrs), spec)[0] == pytest.approx(6 + 8 / spec.elements_per_thread)


def test_an_alternative_marker_loop_is_charged_once_and_a_reduction_loop_other_trip_times():
    # The element loop [2, 10] (4 loads, 4 REDs: one element), a border point's loop [11, 13] (1 load, 1 RED: an
    # alternative path) and a shuffle loop [14, 15] after them: the alternative once, the shuffle loop 5 times.
    body = ["S2R R0, SR_TID.X", "MOV R1, R2",
            "LDG.E R5, [R6]", "LDG.E R7, [R6+0x4]", "LDG.E R8, [R6+0x8]", "LDG.E R9, [R6+0xc]",
            "RED.E.ADD.F32 [R10], R5", "RED.E.ADD.F32 [R10+0x4], R7", "RED.E.ADD.F32 [R10+0x8], R8",
            "RED.E.ADD.F32 [R10+0xc], R9", "@P0 BRA 0x20",
            "LDG.E R5, [R6]", "RED.E.ADD.F32 [R10], R5", "@P1 BRA 0xb0",
            "SHFL.DOWN PT, R1, R2, R3, R4", "@P2 BRA 0xe0", "EXIT"]
    spec = kr.Spec(60, marker="RED", per_element=4, other_trip=5, elements_per_thread=32)
    instrs = kr.parse_sass(_sass(PLAN, body))[PLAN]
    loops = kr.find_loops(instrs)
    assert loops == [(2, 10), (11, 13), (14, 15)], loops
    value, loop = kr.sass_per_element(instrs, loops, spec)
    assert loop == (2, 10)
    assert value == pytest.approx(9 + (2 + 3 + 2 * 5 + 1) / 32)  # before, head 2; the alternative 3; shuffle 2 x 5


def _gated(ptxas_regs=40, body=ELEMENT_NEST, name=PLAN, stack=0):
    k = kr.Kernel("x.cu", name, *kr.kernel_name(name), registers=ptxas_regs, stack=stack)
    kr.analyse(k, kr.parse_sass(_sass(name, body))[name])
    kr.gate(k)
    return k


def test_gates_pass_and_fail():
    assert _gated().status == "ok"
    assert "registers" in _gated(ptxas_regs=56).status and kr.failed(_gated(ptxas_regs=56))
    assert "stack frame 16 B" in _gated(stack=16).status
    # a 64-bit division slow path (integer work only) called from the loop; the subroutine follows EXIT
    slow = ELEMENT_NEST[:4] + ["I2F.S64 R2, R3", "CALL.REL.NOINC 0xe0"] + ELEMENT_NEST[4:] + [
        "IMAD.HI.U32 R1, R2, R3, RZ", "RET.REL.NODEC R20 0x0"]
    slow[11] = "@P0 BRA 0x60"  # the inner loop starts two instructions later
    slow[13] = "@P1 BRA 0x20"
    k = _gated(body=slow)
    assert "1 loops with CALL or 64-bit int<->float conversion (1 CALL, 1 conversions" in k.status
    # the fp32 division slow path is a CALL too: any CALL in a loop breaks the SASS rules
    fdiv = slow[:-2] + ["FFMA R1, R2, R3, R4", "IMAD.HI.U32 R1, R2, R3, RZ", "RET.REL.NODEC R20 0x0"]
    fdiv[5] = "CALL.REL.NOINC 0xe0"
    assert "(1 CALL, 1 conversions" in _gated(body=fdiv).status and kr.failed(_gated(body=fdiv))
    heavy = ELEMENT_NEST[:4] + ["FADD R1, R1, R1"] * 60 + ELEMENT_NEST[4:]
    heavy[4 + 60 + 5] = f"@P0 BRA 0x{(4) * 16:x}"
    heavy[4 + 60 + 7] = "@P1 BRA 0x20"
    k = _gated(body=heavy)
    assert "SASS per element (expected <= 250)" in k.status, k.status
    # no element loop at all: the model cannot be applied, which is a failure, not a pass
    assert "element loop was not found" in _gated(body=["MOV R1, R2", "EXIT"]).status


def test_loop_clean_kernels_fail_on_a_conversion_in_any_loop_of_any_instantiation():
    # Issue 37 item 7: deform_conv2d_plan_kernel (not gated) with a 64-bit conversion in a loop that is not its hot
    # one, in its double instantiation: counted in "all loops" and failing, as it is a LOOP_CLEAN kernel; the same
    # body under another, unlisted name only reports the count.
    plan = "_ZN6dcnkit12_GLOBAL__N_125deform_conv2d_plan_kernelIdliLi3ELi3ELb1EEEvNS_18DeformConv2dParamsE"
    body = ["S2R R0, SR_TID.X", "I2F.S64 R2, R3", "@P2 BRA 0x10"] + ELEMENT_NEST[2:]
    body[10] = "@P0 BRA 0x50"  # the element nest, one instruction later: its loops start at 0x30 and 0x50
    body[12] = "@P1 BRA 0x30"
    k = _gated(body=body, name=plan)
    assert k.name == "deform_conv2d_plan_kernel" and k.dtype == "double"
    assert (k.call_all_loops, k.conv64_all_loops) == (0, 1)
    assert "(0 CALL, 1 conversions; expected none)" in k.status and kr.failed(k)
    other = _gated(body=body, name=OTHER)  # every kernel keeps the SASS rules, listed or not
    assert other.conv64_all_loops == 1 and kr.failed(other)
    visit = "_ZN6dcnkit12_GLOBAL__N_130roi_align_visit_forward_kernelIffEEvNS_14RoIAlignParamsEPKT_S5_PS3_b"
    assert kr.failed(_gated(body=body, name=visit))  # the bounded visit has no exception any more


def test_pending_kernels_are_reported_and_must_still_break_a_gate(monkeypatch):
    monkeypatch.setitem(kr.PENDING, "dcnv3_forward_kernel", "a known break")
    name, name_d = "_ZN6dcnkit20dcnv3_forward_kernelIffEEvv", "_ZN6dcnkit20dcnv3_forward_kernelIddEEvv"

    def settle(stack_f):
        ks = [kr.Kernel("dcnv3.cu", n, *kr.kernel_name(n), registers=40, stack=s) for n, s in
              ((name, stack_f), (name_d, 0))]
        for k in ks:
            kr.gate(k)
        kr.settle_pending(ks)
        return ks

    f, d = settle(32)  # the float instantiation still breaks a gate: pending, and the double one is ok
    assert f.status == "pending: a known break" and d.status == "ok" and not kr.failed(f) and not kr.failed(d)
    f, d = settle(0)  # no instantiation breaks a gate any more: take it off the list
    assert f.status.startswith("passes") and kr.failed(f) and kr.failed(d)


def test_a_double_only_pending_kernel_keeps_every_gate_in_its_other_instantiations(monkeypatch):
    monkeypatch.setitem(kr.PENDING, "dcnv3_forward_kernel", "double only: a known break")
    name_f, name_d = "_ZN6dcnkit20dcnv3_forward_kernelIffEEvv", "_ZN6dcnkit20dcnv3_forward_kernelIddEEvv"
    ks = [kr.Kernel("dcnv3.cu", n, *kr.kernel_name(n), registers=60) for n in (name_f, name_d)]
    for k in ks:
        kr.gate(k)
    kr.settle_pending(ks)
    f, d = ks
    assert kr.failed(f) and not f.status.startswith("pending")  # float over 48 registers still fails
    assert d.status == "pending: double only: a known break" and not kr.failed(d)


@pytest.mark.skipif(kr.missing_tools() is not None, reason=f"kernel report tools: {kr.missing_tools()}")
def test_kernel_report_gates_on_every_core_kernel():
    p = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "2"], capture_output=True, text=True, timeout=900)
    print(p.stdout)
    assert "| roi_align.cu | roi_align" in p.stdout, p.stdout + p.stderr
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
