"""The CUDA rules of the design, checked on the sources without a GPU.

1. The accumulation type follows the data: no double instantiation of any kernel or device function of the
   kit narrows a double to float (or half). Every ``.cu`` under ``plugins/`` is compiled to PTX for one
   architecture and every ``.entry`` / ``.func`` body whose demangled name has ``double`` among its template
   arguments is searched for an f64 -> f32/f16/bf16 ``cvt``. Skipped only when nvcc is absent.
2. No launcher synchronises: no ``cudaStreamSynchronize`` / ``cudaDeviceSynchronize``, no blocking
   ``cudaMemcpy(``, no device-to-host copy anywhere under ``plugins/`` (comments ignored).
3. Launch errors name the right op: every public CUDA launcher of plugins/core (``Status <name>_cuda...(``) calls
   ``cuda_clear_stale_error("<name>...")`` first, before any launch, so that another layer's pending error is not
   reported under its name (cuda_utils.cuh). On a GPU (skipped without one), an earlier kernel's fault is reported
   as an earlier error, not as the op's launch failing.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"


def _nvcc():
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    p = Path(home) / "bin" / "nvcc"
    return str(p) if p.is_file() else shutil.which("nvcc")


# ---------------------------------------------------------------------------------------------------------
# PTX parsing

_HEADER = re.compile(r"^[ \t]*(?:\.(?:visible|weak|extern)[ \t]+)*\.(entry|func)[ \t]+(?:\([^)]*\)[ \t]*)?([\w$.]+)",
                     re.M)
# f64 -> narrower float conversions (any rounding / ftz / sat modifiers).
_NARROWING = re.compile(r"\bcvt(?:\.\w+)*\.(?:f32|f16|bf16|f16x2|bf16x2)\.f64\b")


def ptx_functions(ptx):
    """(mangled name, body) of every function defined in `ptx` (declarations without a body are skipped)."""
    out = []
    for m in _HEADER.finditer(ptx):
        # The parameter list, then either ';' (a declaration) or the body '{ ... }' (nested blocks allowed).
        i = ptx.find("(", m.end())
        j = ptx.find(")", i) if i >= 0 else -1
        start = m.end() if j < 0 else j + 1
        semi, brace = ptx.find(";", start), ptx.find("{", start)
        if brace < 0 or (0 <= semi < brace):
            continue
        depth, k = 0, brace
        while k < len(ptx):
            c = ptx[k]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        out.append((m.group(2), ptx[brace:k + 1]))
    return out


def demangle(names):
    if not names:
        return []
    cxxfilt = shutil.which("c++filt")
    assert cxxfilt, "c++filt (binutils) is needed next to nvcc to read the PTX function names"
    r = subprocess.run([cxxfilt], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
    out = r.stdout.splitlines()
    assert len(out) == len(names)
    return out


def template_part(demangled):
    """The demangled name without its trailing parameter list: 'f<double>(float)' -> 'f<double>'."""
    s = demangled.rstrip()
    for suffix in (" const", " volatile"):
        if s.endswith(suffix):
            s = s[: -len(suffix)]
    if not s.endswith(")"):
        return s
    depth = 0
    for k in range(len(s) - 1, -1, -1):
        if s[k] == ")":
            depth += 1
        elif s[k] == "(":
            depth -= 1
            if depth == 0:
                return s[:k]
    return s


def double_narrowings(ptx):
    """[(demangled function, offending instruction)] for every double instantiation narrowing a double."""
    funcs = ptx_functions(ptx)
    names = demangle([n for n, _ in funcs])
    bad = []
    for (_, body), name in zip(funcs, names):
        if "<" not in template_part(name) or not re.search(r"\bdouble\b", template_part(name)):
            continue
        for line in body.splitlines():
            if _NARROWING.search(line):
                bad.append((name, line.strip()))
    return bad


def test_ptx_parsing_finds_narrowing_in_double_instantiations_only():
    # A hand-written PTX fragment: the parser must see both bodies, demangle them and flag only the double one.
    ptx = """
.extern .func (.param .b32 func_retval0) _Z3extf(.param .b32 _Z3extf_param_0);
.visible .entry _Z1kIdEvPT_(
\t.param .u64 _Z1kIdEvPT__param_0
)
.maxntid 256, 1, 1
{
\t.reg .f32 %f<2>;
\t{ // callseq
\t}
\tcvt.rn.f32.f64 %f1, %fd1;
}
.visible .entry _Z1kIfEvPT_(
\t.param .u64 _Z1kIfEvPT__param_0
)
{
\tcvt.rn.f32.f64 %f1, %fd1;
}
.func (.param .b64 func_retval0) _Z1gIdEdd(
\t.param .b64 _Z1gIdEdd_param_0
)
{
\tcvt.rz.ftz.f32.f64 %f1, %fd1;
\tcvt.f64.f32 %fd2, %f1;
}
"""
    bad = double_narrowings(ptx)
    assert [name for name, _ in bad] == ["void k<double>(double*)", "double g<double>(double)"]
    assert [insn for _, insn in bad] == ["cvt.rn.f32.f64 %f1, %fd1;", "cvt.rz.ftz.f32.f64 %f1, %fd1;"]


def _cuda_sources():
    return sorted(PLUGINS.rglob("*.cu"))


def _include_dirs():
    return sorted(str(p) for p in PLUGINS.rglob("include") if p.is_dir())


def _compile_ptx(nvcc, src, out_dir):
    out = Path(out_dir) / (src.stem + ".ptx")
    cmd = [nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-ptx", "-arch=sm_80", "-O3"]
    cmd += [f"-I{d}" for d in _include_dirs()] + [str(src), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"nvcc -ptx {src.relative_to(ROOT)} failed:\n{r.stderr[-4000:]}"
    return out.read_text()


@pytest.mark.skipif(_nvcc() is None, reason="no nvcc on this machine")
def test_no_double_instantiation_narrows_to_float():
    srcs = _cuda_sources()
    assert srcs, "no .cu files found under plugins/"
    with tempfile.TemporaryDirectory() as d:
        with ThreadPoolExecutor(max_workers=max(1, min(len(srcs), os.cpu_count() or 1))) as pool:
            ptxs = list(pool.map(lambda s: _compile_ptx(_nvcc(), s, d), srcs))
    problems, doubles = [], 0
    for src, ptx in zip(srcs, ptxs):
        names = demangle([n for n, _ in ptx_functions(ptx)])
        doubles += sum(1 for n in names if re.search(r"\bdouble\b", template_part(n)))
        problems += [f"{src.relative_to(ROOT)}: {name}: {insn}" for name, insn in double_narrowings(ptx)]
    # The check must actually have looked at double kernels (every launcher instantiates them).
    assert doubles >= len(srcs) - 1, f"only {doubles} double instantiations found in the PTX"
    assert not problems, "double instantiations narrow to float:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------
# No synchronisation

_SYNC = [
    (re.compile(r"\bcudaStreamSynchronize\b"), "cudaStreamSynchronize"),
    (re.compile(r"\bcudaDeviceSynchronize\b"), "cudaDeviceSynchronize"),
    (re.compile(r"\bcudaEventSynchronize\b"), "cudaEventSynchronize"),
    (re.compile(r"\bcudaMemcpy\s*\("), "blocking cudaMemcpy("),
    (re.compile(r"\bcudaMemcpy2D\s*\("), "blocking cudaMemcpy2D("),
    (re.compile(r"\bcudaMemcpyDeviceToHost\b"), "a device-to-host copy"),
    (re.compile(r"\bcudaMemcpyFromSymbol\s*\("), "a device-to-host copy"),
]


def strip_comments(src):
    """C/C++ source without comments (string and character literals kept, so '//' inside them survives)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            # keep line numbers
            out.append("\n" * src.count("\n", i, n if j < 0 else j))
            i = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def sync_calls(src):
    found = []
    for lineno, line in enumerate(strip_comments(src).splitlines(), 1):
        for rx, what in _SYNC:
            if rx.search(line):
                found.append((lineno, what, line.strip()))
    return found


def test_sync_scan_sees_code_and_ignores_comments():
    src = ('// cudaStreamSynchronize(s) in a comment\n'
           '/* cudaMemcpy(a, b, n, cudaMemcpyDeviceToHost);\n   still a comment */\n'
           'const char* s = "// not a comment"; cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, st);\n'
           'cudaStreamSynchronize(stream);  // real\n'
           'err = cudaMemcpy (dst, src, n, cudaMemcpyDeviceToHost);\n')
    assert [(ln, what) for ln, what, _ in sync_calls(src)] == [
        (5, "cudaStreamSynchronize"), (6, "blocking cudaMemcpy("), (6, "a device-to-host copy")]


# The one synchronisation a launcher may reach, and why: ONNX Runtime 1.16/1.17 (no KernelContext_GetScratchBuffer) on
# a device without stream-ordered memory pools (no cudaMallocAsync) leaves only ONNX Runtime's stream-less allocator
# for scratch memory, which must not go back to the arena before our kernels are done (ort_scratch.h). Nothing else.
SYNC_EXCEPTIONS = {("plugins/onnxruntime/ort_scratch.h", "cudaStreamSynchronize(stream_);")}


def test_no_synchronising_cuda_call_under_plugins():
    files = [p for p in PLUGINS.rglob("*") if p.suffix in {".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp"}]
    assert any(p.suffix == ".cu" for p in files)
    found = [(str(p.relative_to(ROOT)), ln, what, line)
             for p in sorted(files) for ln, what, line in sync_calls(p.read_text())]
    excepted = [f for f in found if (f[0], f[3]) in SYNC_EXCEPTIONS]
    assert len(excepted) == len(SYNC_EXCEPTIONS), "an exception no longer in the code: drop it from SYNC_EXCEPTIONS"
    problems = [f"{path}:{ln}: {what}: {line}" for path, ln, what, line in found if (path, line) not in SYNC_EXCEPTIONS]
    assert not problems, "synchronising CUDA calls (launchers must stay asynchronous and capturable):\n" + \
        "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------
# Launch errors name the right op

_LAUNCHER = re.compile(r"^Status (\w+_cuda\w*)\([^{;]*\)\s*\{", re.M | re.S)


def launchers_without_clear(src):
    """Public launchers (Status f_cuda...(...) {) whose body does not start by clearing a stale error under its name."""
    code = strip_comments(src)
    bad = []
    for m in _LAUNCHER.finditer(code):
        body = code[m.end():]
        first = body.lstrip().split(";", 1)[0]
        if f'cuda_clear_stale_error("{m.group(1)}")' not in first:
            bad.append(m.group(1))
    return bad


def test_the_clear_scan_sees_launchers():
    src = ('Status a_cuda(int x) {\n  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("a_cuda"));\n  k<<<1, 1>>>();\n}\n'
           'Status b_cuda(int x,\n              int y) {\n  k<<<1, 1>>>();\n  return cuda_clear_stale_error("b_cuda");\n}\n'
           'Status c_cuda_f32_rois(int x) {\n  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("a_cuda"));\n}\n'
           'size_t d_workspace_cuda(int x) { return 0; }\n')
    assert launchers_without_clear(src) == ["b_cuda", "c_cuda_f32_rois"]


def test_every_cuda_launcher_clears_a_stale_error_first():
    srcs = sorted((ROOT / "plugins" / "core" / "src").glob("*.cu"))
    found = sum(len(_LAUNCHER.findall(strip_comments(p.read_text()))) for p in srcs)
    assert found >= 17, f"only {found} launchers found"
    bad = [f"{p.name}: {name}" for p in srcs for name in launchers_without_clear(p.read_text())]
    assert not bad, "launchers that do not clear a stale CUDA error first (their launch status would be another " \
                    "layer's):\n" + "\n".join(bad)


_STICKY_CHILD = """
import time, torch
import dcnkit
from dcnkit.ops import roi_align
x = torch.zeros(4, device="cuda")
x[torch.tensor([10], device="cuda")] = 1.0  # another layer's kernel faults (device-side assert), asynchronously
time.sleep(2)
try:
    roi_align(torch.randn(1, 2, 8, 8, device="cuda"), torch.tensor([[0, 1.0, 1.0, 6.0, 6.0]], device="cuda"), 2)
    print("no error")
except RuntimeError as e:
    print("error:", e)
"""


@pytest.mark.cuda
def test_an_earlier_fault_is_not_reported_as_the_ops_launch_failing():
    r = subprocess.run([sys.executable, "-c", _STICKY_CHILD], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    # Either the kit's launcher reports the earlier error as such, or torch reports it first (its own API calls in
    # the op see the lost context); never "roi_align_forward_cuda: <error>" as if the op's launch had failed.
    assert "roi_align_forward_cuda: device-side assert" not in out, out[-3000:]
