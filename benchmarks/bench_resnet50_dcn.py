"""End to end: ResNet-50 with DCNv2 in its last two stages (1x3x224x224), PyTorch eager vs ONNX Runtime.

    python benchmarks/bench_resnet50_dcn.py [--device cpu|cuda] [--threads 2] [--repeat 15] [--batch 1]

The 3x3 convolution of every bottleneck of ``layer3`` and ``layer4`` of torchvision's ResNet-50 becomes a
``dcnkit.nn.ModulatedDeformConv2dPack`` (DCNv2: offsets and mask predicted by a 3x3 convolution; here with small
random weights so that the offsets are non-zero), 9 deformable layers. The model is exported once with
``dcnkit.export.to_onnx`` (standard ONNX ``DeformConv``, what ``torch.onnx.export`` writes) and run as:

* PyTorch eager (``torch.inference_mode``);
* ONNX Runtime with its built-in ``DeformConv`` (``ort_session(..., kit_kernels=False)``);
* ONNX Runtime with the kit's kernel (``ort_session(...)``: the same file, DeformConv rewritten in memory);
* TensorRT, float32 and float16, with the kit's plugins (DeformConv rewritten to ``dcnkit::DeformConv2d``) and
  with TensorRT's own DeformConv import, when TensorRT is importable and a GPU is present.

On CUDA: float32 and float16 eager, and ONNX Runtime's CUDA execution provider when onnxruntime has it.
Outputs are compared before timing; times are the fastest of interleaved rounds.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def resnet50_dcn(quick: bool = False):
    import torch
    import torchvision

    from dcnkit.nn import ModulatedDeformConv2dPack

    torch.manual_seed(0)
    if quick:  # ResNet-18-sized blocks keep the smoke test fast
        model = torchvision.models.resnet18(weights=None)
    else:
        model = torchvision.models.resnet50(weights=None)
    count = 0
    for stage in (model.layer3, model.layer4):
        for block in stage:
            conv = block.conv2
            dcn = ModulatedDeformConv2dPack(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                                            padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                                            bias=False)
            with torch.no_grad():
                dcn.weight.copy_(conv.weight)
                dcn.conv_offset.weight.normal_(0, 0.01)
                dcn.conv_offset.bias.normal_(0, 0.5)
            block.conv2 = dcn
            count += 1
    return model.eval(), count


def resnet50_dcn_model(quick: bool = False):
    """:func:`resnet50_dcn`'s model alone: a ``dcnkit export`` factory (benchmarks/onnx_writers.py)."""
    return resnet50_dcn(quick)[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap, repeat=10)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args(argv)
    device = C.resolve_device(args)
    import numpy as np
    import onnxruntime as ort
    import torch

    import dcnkit.export
    from dcnkit.runtime import ort_session

    model, count = resnet50_dcn(args.quick)
    size = 64 if args.quick else 224
    x = torch.randn(args.batch, 3, size, size, generator=torch.Generator().manual_seed(1))
    tmp = tempfile.mkdtemp(prefix="dcnkit-bench-")
    path = os.path.join(tmp, "resnet50_dcn.onnx")
    dcnkit.export.to_onnx(model, (x,), path, verbose=False)  # standard DeformConv nodes
    sess_probe = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {sess_probe.get_inputs()[0].name: x.numpy()}
    del sess_probe

    providers = C.ort_providers(device, tf32=True)  # whole-model runtime as deployed (TF32 on, like cuDNN's)
    opts = dict(intra_op_num_threads=args.threads, inter_op_num_threads=1, session_config=C.NO_SPIN)
    builtin = ort_session(path, providers=providers, kit_kernels=False, **opts)
    kit = ort_session(path, providers=providers, **opts)

    m = model.to(device)
    xd = x.to(device)

    def eager(mod=m, inp=xd):
        with torch.inference_mode():
            return mod(inp)

    ref = eager().float().cpu().numpy()
    y_builtin = builtin.run(None, feeds)[0]
    y_kit = kit.run(None, feeds)[0]
    # 53 layers deep: float32 sums in another order drift further than one op's; TF32 on the GPU.
    precision = "tf32" if device == "cuda" else "float32"
    accuracy = [C.check_accuracy(f"ORT {name} vs PyTorch, {device}", y, ref, precision)
                for name, y in (("built-in", y_builtin), ("kit", y_kit))]

    fns = {"PyTorch eager": eager, "ORT built-in DeformConv": C.ort_call(builtin, feeds),
           "ORT kit kernels": C.ort_call(kit, feeds)}
    if device == "cuda":
        m16 = copy.deepcopy(model).half()  # Module.half() converts in place: the float32 model stays float32
        x16 = xd.half()
        accuracy.append(C.check_accuracy("PyTorch fp16 vs fp32, cuda", eager(m16, x16), ref, "float16"))
        fns["PyTorch eager fp16"] = lambda: eager(m16, x16)
    ms = C.interleaved(fns, args.repeat, args.warmup, C.synchronizer(device))
    reason = C.tensorrt_available()
    if reason is None:
        import onnx

        from dcnkit.runtime.ort_rewrite import rewrite_deform_conv
        from dcnkit.runtime.tensorrt import TensorRTRunner

        kit_model = rewrite_deform_conv(onnx.load(path))[0].SerializeToString()
        for label, src in (("kit plugins", kit_model), ("TensorRT's DeformConv", path)):
            for prec in (None, "fp16"):
                with TensorRTRunner(src, precision=prec) as r:
                    ms[f"TensorRT {prec or 'fp32'} ({label})"] = C.interleaved(
                        {"t": lambda: r.run(feeds)}, args.repeat, args.warmup)["t"]
    ort_dev = "CPU" if providers == ["CPUExecutionProvider"] else "CUDA EP"
    print(f"ResNet-50 with DCNv2 in layer3 + layer4 ({count} deformable layers), input {tuple(x.shape)}, device "
          f"{device}, ORT {ort.__version__} on {ort_dev}, {args.threads} threads, fastest of {args.repeat} rounds")
    if reason is not None:
        print(f"TensorRT skipped: {reason}")
    base = ms["PyTorch eager"]
    C.print_table(["runtime", "ms", "vs PyTorch eager"], [[k, f"{v:.1f}", f"{v / base:.2f}x"] for k, v in ms.items()])
    C.write_json(args, {"device": device, "threads": args.threads, "ms": ms, "accuracy": accuracy})
    return ms


if __name__ == "__main__":
    main()
