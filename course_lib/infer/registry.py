"""The op registry: (op name, opset) -> a numpy kernel. Adding an op is one small decorated function.

    @register("Relu", since=6)
    def relu(x):
        return np.maximum(x, 0)

A kernel takes the node's inputs as positional numpy arrays (None for a left-out optional
input) and its attributes as keyword arguments, and returns an array or a tuple of arrays.
When several versions of an op exist, the one with the highest `since` <= the model's opset wins.

`override` is the registry's declared plug-in point: inside its block, a kernel of your own runs an op in
place of the course's, and leaving the block puts back exactly what was there (chapter 09's payoff runs
the learner's gemm, softmax and reshape this way, course_lib/yours/infer.py):

    with override({"Gemm": my_gemm}):
        y = run_graph(graph, feeds)       # every Gemm node runs my_gemm
"""

import contextlib
import inspect

KERNELS = {}  # (domain, op_type) -> [(since, function, accepted attribute names or None for any)]
_OVERRIDES = {}  # (domain, op_type) -> (function, accepted attribute names): what `override` put in


class Unsupported(NotImplementedError):
    """The engine has no kernel for this op, opset, attribute or dtype. Never a wrong answer."""


def _attribute_names(fn):
    """The kernel's keyword-only parameters (the ONNX attributes it accepts), or None when it takes any.
    A numpy ufunc takes none; before numpy 2.3 (Colab ships 2.1) ufuncs have no signature to read."""
    try:
        params = inspect.signature(fn).parameters.values()
    except ValueError:
        return set()
    return None if any(p.kind is p.VAR_KEYWORD for p in params) else {p.name for p in params if p.kind is p.KEYWORD_ONLY}


def register(op_type, since=1, domain=""):
    def add(fn):
        names = _attribute_names(fn)
        versions = KERNELS.setdefault((domain, op_type), [])
        versions.append((since, fn, names))
        versions.sort(key=lambda v: v[0])
        return fn
    return add


def lookup(op_type, opset, domain=""):
    """The kernel for `op_type` at `opset`, as (function, accepted attribute names); raises Unsupported."""
    if domain == "ai.onnx":
        domain = ""
    versions = KERNELS.get((domain, op_type))
    if not versions:
        raise Unsupported(f"unknown op {op_type!r}" + (f" in domain {domain!r}" if domain else ""))
    usable = [v for v in versions if v[0] <= opset]
    if not usable:
        raise Unsupported(f"op {op_type!r} has no kernel for opset {opset} (the oldest is opset {versions[0][0]})")
    if (domain, op_type) in _OVERRIDES and usable[-1] is versions[-1]:
        return _OVERRIDES[(domain, op_type)]
    return usable[-1][1], usable[-1][2]


@contextlib.contextmanager
def override(kernels, domain=""):
    """Inside the block, kernels[op_type] runs `op_type` wherever the op's newest version would (an older
    opset keeps its own kernel: the given one implements the op as its newest version defines it).

    Only an op the registry knows can be overridden (a misspelt name raises KeyError instead of doing
    nothing). Blocks nest, the innermost wins, and leaving a block, by an exception too, restores the
    overrides that stood before it."""
    domain = "" if domain == "ai.onnx" else domain
    unknown = [op for op in kernels if (domain, op) not in KERNELS]
    if unknown:
        raise KeyError(f"override: the registry has no op {', '.join(map(repr, unknown))}"
                       + (f" in domain {domain!r}" if domain else "") + "; register it first")
    keys = [(domain, op) for op in kernels]
    saved = {key: _OVERRIDES.get(key) for key in keys}
    _OVERRIDES.update({(domain, op): (fn, _attribute_names(fn)) for op, fn in kernels.items()})
    try:
        yield
    finally:
        for key, before in saved.items():
            if before is None:
                _OVERRIDES.pop(key, None)
            else:
                _OVERRIDES[key] = before


def bind(graph, node):
    """The kernel for `node` of `graph`, and the keyword arguments to call it with: the node's
    attributes, plus `_n_outputs` (how many outputs the node has) for the kernels that take it."""
    fn, accepted = lookup(node.op_type, graph.opsets.get(node.domain or "", graph.opset), node.domain)
    attrs = dict(node.attrs)
    if accepted is None or "_n_outputs" in accepted:
        attrs["_n_outputs"] = len(node.outputs)
    return fn, attrs


def supported_ops():
    return sorted(op if not d else f"{d}.{op}" for d, op in KERNELS)


def run_node(graph, node, env):
    """Run one node on the values in `env` (a dict name -> array); returns a tuple of outputs."""
    fn, attrs = bind(graph, node)
    out = fn(*[env[i] if i else None for i in node.inputs], **attrs)
    return out if isinstance(out, tuple) else (out,)
