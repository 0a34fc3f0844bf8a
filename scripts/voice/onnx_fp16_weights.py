#!/usr/bin/env python3
"""Halve a Piper voice model for carrying: float32 initializers are stored as float16 and cast back to float32 by a
Cast node in front of their users, so the graph still computes in float32 (only the weights are rounded). The copy
also gets a second output, `durations` ([1, 1, phonemes], float32): the rounded-up per-phoneme durations in
decoder frames of 256 samples at 22.05 kHz that the VITS graph computes (the output of its one `Ceil` node) and
uses to expand the phonemes, so a render tells where each phoneme id is in its audio (render_ids.py stores them).

    python scripts/voice/onnx_fp16_weights.py IN.onnx OUT.onnx     # needs the PyPI package onnx
"""
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper


def main(src, dst, min_elems=1024):
    m = onnx.load(src)
    g = m.graph
    new_inits, casts, n = [], [], 0
    for init in g.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and int(np.prod(init.dims)) >= min_elems:
            arr = numpy_helper.to_array(init).astype(np.float16)
            h = numpy_helper.from_array(arr, init.name + "__fp16")
            new_inits.append(h)
            casts.append(helper.make_node("Cast", [h.name], [init.name], to=onnx.TensorProto.FLOAT,
                                          name=init.name + "__cast"))
            n += 1
        else:
            new_inits.append(init)
    del g.initializer[:]
    g.initializer.extend(new_inits)
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(casts + nodes)
    ceil = [nd for nd in nodes if nd.op_type == "Ceil"]
    if len(ceil) != 1:
        raise SystemExit(f"expected one Ceil node (the VITS durations), found {len(ceil)}")
    g.node.append(helper.make_node("Identity", [ceil[0].output[0]], ["durations"], name="durations__out"))
    g.output.append(helper.make_tensor_value_info("durations", onnx.TensorProto.FLOAT, None))
    onnx.save(m, dst)
    print(f"{n} initializers stored as float16 -> {dst}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
