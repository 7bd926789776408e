"""Loading: an ONNX file, its bytes or a ModelProto -> our Graph. The onnx package parses the protobuf."""

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .ir import Graph, Node, Value


def _shape(type_proto):
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in type_proto.tensor_type.shape.dim)


def _dtype(type_proto):
    """The numpy dtype of a tensor type; object for sequences, maps and optionals; None if unknown."""
    if not type_proto.HasField("tensor_type"):
        return np.dtype(object)
    if type_proto.tensor_type.elem_type == 0:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(type_proto.tensor_type.elem_type))
    except (KeyError, TypeError, ValueError):
        return np.dtype(object)  # a type numpy lacks (string, float8, int4...): refused by validation


def _value(vi):
    return Value(vi.name, _shape(vi.type), _dtype(vi.type))


def _attr(a):
    """An attribute's Python value; tensors become numpy arrays, subgraphs stay GraphProtos."""
    v = helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode() for s in v]
    return v


def as_model(model):
    """A ModelProto from a path, bytes or a ModelProto."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model))
    raise TypeError(f"expected a path, bytes or an onnx.ModelProto, got {type(model).__name__}")


def free_names(graph):
    """The values a graph reads but does not define (a subgraph's reads from the graph around it)."""
    defined = {v.name for v in graph.inputs} | set(graph.initializers) | {""}
    defined |= {o for n in graph.nodes for o in n.outputs}
    read = [i for n in graph.nodes for i in n.inputs] + [v.name for v in graph.outputs]
    return list(dict.fromkeys(i for i in read if i not in defined))


def _node(n, opsets):
    """A NodeProto as a Node. A subgraph attribute (If's branches, Loop's and Scan's body) becomes a
    Graph, and the values it reads from outside become extra inputs of the node, named in the
    attribute `_outer`, so that the schedule runs their producers first and keeps them alive."""
    attrs = {a.name: _attr(a) for a in n.attribute}
    outer = []
    for k, v in attrs.items():
        if isinstance(v, onnx.GraphProto):
            attrs[k] = graph_from_proto(v, opsets)
            outer += [x for x in free_names(attrs[k]) if x not in outer]
    node = Node(n.op_type, list(n.input) + outer, list(n.output), attrs, n.name, n.domain)
    if outer:
        node.attrs["_outer"] = outer
    return node


def graph_from_proto(g, opsets):
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    nodes = [_node(n, opsets) for n in g.node]
    inputs = [_value(v) for v in g.input if v.name not in inits]
    return Graph(nodes, inputs, [_value(v) for v in g.output], inits, opsets, g.name or "graph")


def load(model):
    """Parse a model (path, bytes or ModelProto) into a Graph."""
    m = as_model(model)
    opsets = {(o.domain or ""): o.version for o in m.opset_import}
    return graph_from_proto(m.graph, opsets)


def to_onnx(graph):
    """Our Graph back to a ModelProto (to check a pass with onnxruntime, or to save it)."""
    def vi(v):
        if v.dtype is None:
            return helper.make_empty_tensor_value_info(v.name)
        shape = None if v.shape is None else [d if isinstance(d, (int, str)) else None for d in v.shape]
        return helper.make_tensor_value_info(v.name, helper.np_dtype_to_tensor_dtype(v.dtype), shape)

    opsets = [helper.make_opsetid(d, v) for d, v in graph.opsets.items()]
    return helper.make_model(_graph_proto(graph, vi), opset_imports=opsets, ir_version=10)


def _graph_proto(graph, vi):
    nodes = []
    for n in graph.nodes:
        outer = n.attrs.get("_outer", [])
        attrs = {k: (numpy_helper.from_array(np.asarray(a)) if isinstance(a, np.ndarray) else
                     _graph_proto(a, vi) if isinstance(a, Graph) else a)
                 for k, a in n.attrs.items() if k != "_outer"}
        inputs = n.inputs[:len(n.inputs) - len(outer)]            # the outer values are not ONNX inputs
        nodes.append(helper.make_node(n.op_type, inputs, n.outputs, name=n.name, domain=n.domain, **attrs))
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in graph.initializers.items()]
    return helper.make_graph(nodes, graph.name, [vi(v) for v in graph.inputs], [vi(v) for v in graph.outputs], inits)
