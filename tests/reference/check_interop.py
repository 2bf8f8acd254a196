#!/usr/bin/python3
"""check_interop.py FILE: reads a safetensors file written by cddp with NumPy alone and checks
every value (the file comes from `test_checkpoint --write-interop FILE`)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

tensors, meta = safetensors_np.load(sys.argv[1])
assert sorted(tensors) == ["labels", "scalar", "weights"], sorted(tensors)
w = tensors["weights"]
assert w.dtype == np.float32 and w.shape == (2, 3), (w.dtype, w.shape)
assert np.array_equal(w, np.array([[1.5, -2.25, 3.0], [0.0, 1e-3, -7.0]], dtype=np.float32)), w
labels = tensors["labels"]
assert labels.dtype == np.int64 and labels.tolist() == [-5, 0, 1 << 40], labels
s = tensors["scalar"]
assert s.dtype == np.int32 and s.shape == () and int(s) == 42, s
assert meta == {"writer": "cddp", "epoch": "7"}, meta
print("ok: NumPy read every tensor and the metadata cddp wrote")
