"""Placeholder: being written (deform_conv2d)."""


def deform_conv2d(input, offset, weight, bias=None, stride=1, padding=0, dilation=1, mask=None):
    raise NotImplementedError("deform_conv2d: being written")
