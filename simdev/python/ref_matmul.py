"""Example reference for scenarios/data/neff/matmul_small.neff (x[128,256] @ y[256,128] in
float16 -> output0[128,128] float16): bind it with
``simdev --reference matmul_small.neff=ref_matmul.py:matmul``."""


def matmul(x, y):
    """output0 = x @ y in the inputs' dtype."""
    return {"output0": (x @ y).astype(x.dtype)}
