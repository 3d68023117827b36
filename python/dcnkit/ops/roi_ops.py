"""Placeholder: being written (roi_align, deform_roi_pool, deform_psroi_pool)."""


def roi_align(input, boxes, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False, pool_mode="avg"):
    raise NotImplementedError("roi_align: being written")


def deform_roi_pool(input, rois, offset, output_size, spatial_scale=1.0, sampling_ratio=0, gamma=0.1):
    raise NotImplementedError("deform_roi_pool: being written")


def deform_psroi_pool(input, rois, trans, spatial_scale, output_size, output_dim, group_size=1,
                      part_size=None, sample_per_part=4, trans_std=0.0):
    raise NotImplementedError("deform_psroi_pool: being written")
