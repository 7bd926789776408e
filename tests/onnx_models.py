"""A small ONNX model written by hand, for tests that compare the course's engine with onnxruntime."""

import numpy as np
from onnx import helper, numpy_helper


def onnx_model(nodes, inputs, outputs, consts, opset=17):
    """A model of `nodes`; inputs are (name, element type, shape), outputs (name, element type), consts
    {name: array} become initializers."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
