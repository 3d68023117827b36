"""Placeholder: being written (ort_session)."""


def ort_session(model, providers=None, **options):
    raise NotImplementedError("ort_session: being written")
