#!/usr/bin/env python3
"""npy_fixtures.py DIR: .npy files written by NumPy itself, for test_npy.c.

Every kind cddp reads, 5 samples of shape (2, 3), element j (counted over the whole array) being
  bool: j % 3 == 0;  unsigned: j * 7 % 251;  signed: j * 7 % 251 - 125;  floating: that / 4
(exact in every one of them), named by NumPy's dtype code (i1.npy, u8.npy, f2.npy, b1.npy, ...);
the same float32 array in format versions 2.0 and 3.0; a 1-D label array and a 4-D image
array; values outside int32's and int64's ranges; what cddp must refuse, each made the way a user
would make it; .npz archives (np.savez, np.savez_compressed); and safetensors files.
"""
import json
import os
import struct
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def path(name):
    return os.path.join(out, name)


j = np.arange(5 * 2 * 3).reshape(5, 2, 3)
for code in ["b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8"]:
    if code == "b1":
        x = j % 3 == 0
    elif code[0] == "u":
        x = (j * 7 % 251).astype("<" + code)
    elif code[0] == "i":
        x = (j * 7 % 251 - 125).astype("<" + code)
    else:
        x = ((j * 7 % 251 - 125) / 4).astype("<" + code)
    np.save(path(code + ".npy"), x)

f4 = ((j * 7 % 251 - 125) / 4).astype(np.float32)
for v in [(2, 0), (3, 0)]:
    with open(path("v%d.npy" % v[0]), "wb") as f:
        np.lib.format.write_array(f, f4, version=v)
np.save(path("labels.npy"), np.array([3, 1, 4, 1, 5], dtype=np.int64))
np.save(path("images.npy"), (j * 7 % 251).astype(np.uint8).reshape(5, 1, 2, 3))
np.save(path("count4.npy"), np.zeros((4, 2), dtype=np.float32))

# Out of range: sample 1 of each.
big = np.zeros((3, 2), dtype=np.uint64)
big[1, 1] = 2**63
np.save(path("u8_big.npy"), big)
wide = np.zeros((3, 2), dtype=np.int64)
wide[1, 0] = -(2**40)
np.save(path("i8_wide.npy"), wide)
u4 = np.zeros((3,), dtype=np.uint32)
u4[1] = 2**32 - 1
np.save(path("u4_big.npy"), u4)

# Refused.
np.save(path("big_endian.npy"), f4.astype(">f4"))
np.save(path("fortran.npy"), np.asfortranarray(np.ones((4, 3), dtype=np.float32)))
np.save(path("structured.npy"), np.zeros(3, dtype=[("a", "<f4"), ("b", "<i8")]))
np.save(path("objects.npy"), np.array([1, "a", None], dtype=object), allow_pickle=True)
np.save(path("complex.npy"), np.ones(3, dtype=np.complex64))
np.save(path("strings.npy"), np.array(["ab", "cd"]))
np.save(path("longdouble.npy"), np.ones(3, dtype=np.longdouble))
np.save(path("scalar.npy"), np.float32(3))
np.save(path("empty.npy"), np.zeros((0, 3), dtype=np.float32))
np.save(path("no_elements.npy"), np.zeros((5, 0), dtype=np.float32))
np.save(path("dims5.npy"), np.zeros((2, 1, 1, 1, 2), dtype=np.float32))
with open(path("two.npy"), "wb") as f:
    np.save(f, f4)
    np.save(f, f4)

# Archives: np.savez stores its arrays, np.savez_compressed deflates them; the same images and
# labels in each (keyword names), and an archive whose array is in Fortran order.
labels = np.array([3, 1, 4, 1, 5], dtype=np.int64)
images = (j * 7 % 251).astype(np.uint8).reshape(5, 1, 2, 3)
np.savez(path("stored.npz"), images=images, labels=labels)
np.savez_compressed(path("compressed.npz"), images=images, labels=labels)
np.savez(path("fortran.npz"), x=np.asfortranarray(np.ones((4, 3), dtype=np.float32)))

# safetensors files, laid out as safetensors' save_file lays them (an 8-byte header length, the
# JSON header padded with spaces to 8 bytes, the tensors' bytes back to back): images (U8) and
# labels (I64); the floating fixture's values as BF16 (float32's top half: exact for them) and
# F16; an 8-bit float cddp does not read; and a file whose tensor's span does not fit its shape.


def save_safetensors(name, tensors, span_fix=0):
    header, blobs, off = {}, [], 0
    for key, (dtype, raw, shape) in tensors.items():
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw) + span_fix]}
        off += len(raw)
        blobs.append(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path(name), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


bf16 = (f4.view(np.uint32) >> 16).astype("<u2")
save_safetensors("tensors.safetensors", {
    "images": ("U8", images.tobytes(), images.shape),
    "labels": ("I64", labels.tobytes(), labels.shape),
    "bf16": ("BF16", bf16.tobytes(), bf16.shape),
    "f16": ("F16", f4.astype("<f2").tobytes(), f4.shape),
    "f8": ("F8_E4M3", bytes(5), (5,)),
})
save_safetensors("bad_span.safetensors", {"x": ("F32", f4.tobytes(), f4.shape)}, span_fix=-4)
