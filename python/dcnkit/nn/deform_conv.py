"""Placeholder: being written."""
import torch.nn as nn


class DeformConv2d(nn.Module):
    pass


class ModulatedDeformConv2d(nn.Module):
    pass


class DeformConv2dPack(nn.Module):
    pass


class ModulatedDeformConv2dPack(nn.Module):
    pass
