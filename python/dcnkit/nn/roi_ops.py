"""Placeholder: being written."""
import torch.nn as nn


class RoIAlign(nn.Module):
    pass


class DeformRoIPool(nn.Module):
    pass


class DeformRoIPoolPack(nn.Module):
    pass


class ModulatedDeformRoIPoolPack(nn.Module):
    pass


class DeformPSRoIPool(nn.Module):
    pass
