"""Checks for chapter 13, the compiler: the tracer's recording of one backend call, the fusion rule, the
generator of one pointwise group's loop, and the guard check.

Each piece is judged by what it must make true, not by its likeness to the course's own:

- record: the graph of seven backend calls, written out here by hand (which buffer each operand is, through
  which view, what each write comes after); then steps recorded by it, compiled and replayed, give the eager
  step's losses and gradients in float64;
- can_join: no grouping it makes has a member the loop cannot compute (a value read before it is made, or
  from another row, a product, a reduction across rows), which a few hand-made cases and every group of the
  programs below show; the programs compiled with it give the eager numbers; and on a GPT training step it
  lets at least a third of the elementwise ops and reductions share a loop;
- pointwise_source: the kernel, compiled by Numba, computes numpy's values for each formula; run as Python,
  with its rows taken in a shuffled order, it still does (each row stands alone), and its outermost loop is a
  `prange` whose length grows with the rows (the threads share the rows);
- guard: calls that may replay pass; each change is refused, with a sentence that names the argument and
  what it was and is (by meaning: the numbers and names in it, not its wording); a compiled step with it
  replays equal calls and captures a new shape again.
"""

import contextlib
import io
import math
import re

import numpy as np

from course_lib.checks import CheckFailed, assert_close, assert_equal, exercise, fmt, require, rng

# ---- programs to compile: a step, or a function of tensors, run eagerly and compiled ------------------------


def _mlp(seed, sizes, dtype=np.float64):
    from course_lib import tensor as T
    from course_lib.compiler import capturable
    T.manual_seed(seed)
    model = T.nn.Sequential(T.nn.Linear(sizes[0], sizes[1], dtype=dtype), T.nn.ReLU(),
                            T.nn.Linear(sizes[1], sizes[2], dtype=dtype))
    return model, capturable.Adam(model.parameters(), lr=0.05)


def _mlp_step(model, optimizer, x, y):
    from course_lib import tensor as T
    loss = T.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def _split_step(model, optimizer, x, y):
    """A step whose values are views: two slices of one product (views at an offset), a cat (writes into
    views of zeros the library made), and the slices' backward (more writes into views of zeros)."""
    from course_lib import tensor as T
    h = model(x)
    k = h.shape[1] // 2
    a, b = h[:, :k], h[:, k:]
    loss = T.cross_entropy(T.cat([a * b, a + b.relu()], dim=-1), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def _rows_program(x, w):
    """A forward with each case a fusion rule must get right: a value read through a transpose right after
    it is made, a reduction across rows, a value made by a product that runs after the first ops, the
    passes of a softmax and of a layer norm over each row, and a reshape that keeps the last dim."""
    a = (x * 1.5).exp()
    t = (a + a.T).tanh()
    across = a.sum(0)
    c = (a - 0.5) * (x @ w)
    e = (c - c.max(-1, keepdim=True)).exp()
    soft = e / e.sum(-1, keepdim=True)
    d = c - c.mean(-1, keepdim=True)
    norm = d / ((d * d).mean(-1, keepdim=True) + 1e-5).sqrt()
    return t, across, soft, norm.reshape(2, x.shape[0] // 2, x.shape[1]) * 2.0 + 1.0


def _never(group, node):
    return False


def _training_calls(sizes, steps):
    """A seed for the models' weights, and `steps` random batches (x, integer targets) for them."""
    seed = int(rng().integers(0, 1000))
    batch = int(rng().integers(3, 8))
    calls = []
    for _ in range(steps):
        calls.append((rng().normal(size=(batch, sizes[0])), rng().integers(0, sizes[-1], batch)))
    return seed, calls


def _replays(step, what, program):
    require(step.stats.replays > 0, f"the {program} compiled with your {what} never replayed: it ran eagerly "
            f"({step.eager_reason})", hint="a compiled step replays once two captures agree; a graph that changes "
            "from one capture to the next, or whose constants do, is never trusted")
    return step.stats.replays


def _compile(fn, pieces):
    from course_lib.compiler import compile as compile_step
    return compile_step(fn, pieces=pieces, verbose=False)


def _run(call, what, program):
    """call(), with an error of the compiler (or of a kernel) said as a failed check on your piece."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return call()
    except CheckFailed:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the compiled program raised, said with its program
        raise CheckFailed(f"compiling or replaying the {program} with your {what} failed: {type(e).__name__}: "
                          f"{str(e)[:600]}") from e


def training_steps_match_eager(pieces, what, step_fn=_mlp_step, program="MLP training step", steps=7, sizes=None):
    """A small MLP's training step (`step_fn`), compiled with `pieces`, against the same step run eagerly,
    in float64: every loss and every gradient equal within 1e-12. Returns how many calls were replayed."""
    from course_lib import tensor as T

    sizes = sizes or [int(v) for v in rng().integers(3, 9, 3)]
    seed, calls = _training_calls(sizes, steps)
    eager_model, eager_opt = _mlp(seed, sizes)
    model, opt = _mlp(seed, sizes)
    step = _compile(step_fn, pieces)
    for k, (x, y) in enumerate(calls):
        expected = step_fn(eager_model, eager_opt, T.Tensor(x), y).item()
        got = _run(lambda: step(model, opt, T.Tensor(x), y).item(), what, program)
        assert_close(got, expected, what=f"the loss of call {k + 1} of the {program} compiled with your {what}",
                     rtol=1e-12, atol=1e-12)
    for (name, p), q in zip(eager_model.named_parameters(), model.parameters()):
        assert_close(q.grad.numpy(), p.grad.numpy(), what=f"the gradient of {name} after {steps} calls of the "
                     f"{program} compiled with your {what}", rtol=1e-9, atol=1e-12)
    return _replays(step, what, program)


def rows_program_matches_eager(pieces, what, calls=4):
    """`_rows_program` compiled with `pieces` against eager, in float64, on a square input of even size."""
    from course_lib import tensor as T

    size = 2 * int(rng().integers(2, 5))
    w = T.Tensor(rng().normal(size=(size, size)))
    step = _compile(_rows_program, pieces)
    names = ("(a + a.T).tanh()", "a.sum(0)", "the softmax", "the layer norm, reshaped")
    program = "forward of section-by-section cases"
    for k in range(calls):
        x = T.Tensor(rng().uniform(-1, 1, size=(size, size)))
        expected = _rows_program(x, w)
        got = _run(lambda: step(x, w), what, program)
        for name, g, e in zip(names, got, expected):
            assert_close(g.numpy(), e.numpy(), what=f"{name}, call {k + 1} of a {program} compiled with your {what}",
                         rtol=1e-12, atol=1e-12)
    return _replays(step, what, program)


# ---- 1. recording one backend call ------------------------------------------------------------------------


def _td(array, shape=None, strides=None, offset=0):
    from course_lib.tensor.tensor_data import TensorData
    return TensorData(array, array.shape if shape is None else shape, strides, offset)


def _record_scenario(record, values):
    """Seven backend calls recorded into a fresh tracer, as the capture of a step makes them (and one fill of
    a scratch buffer, the tracer's own). Returns the tracer and the nodes in call order."""
    from course_lib.compiler.ir import INPUT, STATE
    from course_lib.compiler.trace import Tracer
    from course_lib.tensor.backend import get_backend

    n, m, x, w, c, extra = values
    numpy = get_backend("numpy")
    tracer = Tracer(numpy, record)
    x_mem, w_mem = x.copy(), w.copy()
    tracer.buffer(INPUT, x_mem, "x")
    tracer.buffer(STATE, w_mem, "w")
    const_mem, extra_mem = np.array([c]), extra.copy()
    xv = _td(x_mem, (n, m))
    wt = _td(w_mem, (n, m), (1, n))                      # w is (m, n): its transpose, a view
    nodes = []

    def call(kind, op, inputs, out, into=False, **attrs):
        nodes.append(record(tracer, kind, op, inputs, out, into, attrs))

    a = numpy.zip("add", xv, wt)
    call("zip", "add", (xv, wt), a)
    flat = _td(a.storage, (n * m,))                      # a reshape: the same memory, another view
    b = numpy.map("exp", flat)
    call("map", "exp", (flat,), b)
    cst = _td(const_mem, ())
    d = numpy.zip("mul", b, cst)
    call("zip", "mul", (b, cst), d)
    const_mem[0] = 99.0                                  # the library reuses memory: the graph keeps the value it saw
    e = numpy.zip("mul", d, cst)
    call("zip", "mul", (d, cst), e)
    scratch = np.zeros(n * m + 3)
    tracer.fill_scratch(scratch)
    nodes.append(tracer.nodes[-1])
    first = _td(scratch, (n * m,))
    numpy.map("id", e, out=first)
    call("map", "id", (e,), first, True)
    second = _td(scratch, (3,), (1,), n * m)
    numpy.map("id", _td(extra_mem), out=second)
    call("map", "id", (_td(extra_mem),), second, True)
    extra_mem[:] = -1.0
    s = numpy.reduce("sum", _td(scratch), 0)
    call("reduce", "sum", (_td(scratch),), s, dim=0)
    return tracer, nodes


def _summary(nodes):
    """Each node as plain data: kind, op, its inputs and output as (buffer's kind and number in order of first
    appearance, shape, strides, offset), into, after (a node's position), dim."""
    seen = {}

    def buf(b):
        if b is None:
            return None
        if b.id not in seen:
            seen[b.id] = len(seen)
        return (b.kind, seen[b.id])

    position = {id(n): k for k, n in enumerate(nodes)}
    out = []
    for n in nodes:
        after = n.attrs.get("after")
        out.append((n.kind, n.op, tuple((buf(r.buffer), tuple(r.view.shape), tuple(r.view.strides), r.view.offset)
                                        for r in n.inputs),
                    (buf(n.out.buffer), tuple(n.out.view.shape), tuple(n.out.view.strides), n.out.view.offset),
                    bool(n.attrs.get("into")), None if after is None else position.get(id(after), "?"),
                    n.attrs.get("dim")))
    return out


def _expected_summary(n, m):
    """The graph of `_record_scenario`, written out by hand: five memories seen once each (x, w, a constant,
    the extra values, the scratch buffer), one temp per fresh output, the two writes chained after the fill."""
    I, S, C, TMP, X = "input", "state", "const", "temp", "scratch"
    full, flat = ((n, m), (m, 1), 0), ((n * m,), (1,), 0)
    return [
        ("zip", "add", (((I, 0), *full), ((S, 1), (n, m), (1, n), 0)), ((TMP, 2), *full), False, None, None),
        ("map", "exp", (((TMP, 2), *flat),), ((TMP, 3), *flat), False, None, None),
        ("zip", "mul", (((TMP, 3), *flat), ((C, 4), (), (), 0)), ((TMP, 5), *flat), False, None, None),
        ("zip", "mul", (((TMP, 5), *flat), ((C, 4), (), (), 0)), ((TMP, 6), *flat), False, None, None),
        ("fill", "", (), ((X, 7), (n * m + 3,), (1,), 0), False, None, None),
        ("map", "id", (((TMP, 6), *flat),), ((X, 7), *flat), True, 4, None),
        ("map", "id", (((C, 8), (3,), (1,), 0),), ((X, 7), (3,), (1,), n * m), True, 5, None),
        ("reduce", "sum", (((X, 7), (n * m + 3,), (1,), 0),), ((TMP, 9), (1,), (1,), 0), False, None, 0),
    ]


@exercise
def record(your_record):
    """Seven backend calls (a zip that reads an input and a transposed view of state, a map that reads a
    reshape of a value made before, a constant used twice and then changed by the library, two writes into
    a scratch buffer, a reduction of it) against their graph written out by hand; then two float64 training
    steps recorded with your function, compiled and replayed, against the same steps run eagerly."""
    from course_lib.compiler import Pieces
    from course_lib.compiler.ir import CONST, SCRATCH, TEMP

    n, m = (int(v) for v in rng().integers(2, 7, 2))
    values = (n, m, rng().normal(size=n * m), rng().normal(size=m * n), float(rng().uniform(0.5, 2.0)),
              rng().normal(size=3))
    tracer, nodes = _record_scenario(your_record, values)
    require(len(tracer.nodes) == 8 and all(a is b for a, b in zip(tracer.nodes, nodes)),
            f"after 7 recorded calls (and one fill) tracer.nodes holds {len(tracer.nodes)} nodes, not the 8 the "
            "calls returned, in order", hint="each call's node belongs to the graph once, in call order, and is "
            "what record returns")
    add, exp, mul, mul2, fill, write1, write2, total = nodes
    kinds = [r.buffer.kind for r in add.inputs]
    require(kinds == ["input", "state"],
            f"the first call reads the input x and a transposed view of the state w; your node's inputs are "
            f"buffers of kinds {kinds}",
            hint="x.T is a new TensorData over the same memory: the graph knows values by their memory, not by "
                 "the objects that view it (lesson 13, section 3)")
    require(exp.inputs[0].buffer is add.out.buffer,
            f"the second call reads the first call's output through a reshape; your node reads "
            f"{exp.inputs[0].buffer!r} instead of the first node's output buffer {add.out.buffer!r}",
            hint="a reshape is another view of the same memory, so it is the same buffer")
    require(add.out.buffer.kind == TEMP and add.out.buffer.producer is add and exp.out.buffer.producer is exp,
            "each fresh output must be a new temp buffer that names its node as its producer",
            hint="fusion and the memory plan find a value's maker through its buffer")
    const = mul.inputs[1].buffer
    require(const.kind == CONST, f"the third call reads a number made outside the step's ops; your node reads it "
            f"as a {const.kind} buffer", hint="memory that no recorded op made comes from outside: a constant")
    require(const.value is not None and float(np.asarray(const.value).reshape(-1)[0]) == values[4],
            f"the constant the step used was {values[4]!r}; after the library wrote 99.0 into that memory your "
            f"graph holds {fmt(const.value)}",
            hint="the library reuses memory, so a constant's values must be kept as they were when it was read")
    require(mul2.inputs[1].buffer is const, "the fourth call reads the same constant memory again; your node made a "
            "second buffer for it", hint="one memory, one buffer: look a memory up before making a buffer for it")
    require(write1.out.buffer.kind == SCRATCH and write1.out.buffer is fill.out.buffer,
            f"the fifth call writes into a view of a scratch buffer (zeros the library made, `into`); your node's "
            f"output is {write1.out.buffer!r}, not that buffer",
            hint="a write into existing memory makes no new buffer: its memory is already one of the graph's")
    require(write1.attrs.get("into") is True and write1.attrs.get("after") is fill and write2.attrs.get("after") is write1,
            "a write into a scratch buffer must say so (attrs 'into') and name the node that wrote that buffer "
            "before it (attrs 'after'), so the writes keep their order",
            hint="the buffer's producer is its latest writer until this write takes its place")
    expected = _expected_summary(n, m)
    for k, (yours, want) in enumerate(zip(_summary(nodes), expected)):
        assert_equal(yours, want, f"node {k} (kind, op, inputs as ((buffer kind, number), shape, strides, offset), "
                     "output, into, after, dim)", hint="each operand is the buffer of its memory, read through the "
                     "view the call read")
    replays = training_steps_match_eager(Pieces(record=your_record), "record")
    sizes = [int(rng().integers(3, 7)), int(rng().integers(3, 7)), 2 * int(rng().integers(2, 5))]
    replays += training_steps_match_eager(Pieces(record=your_record, can_join=_never), "record", _split_step,
                                          "training step of slices and a cat", steps=6, sizes=sizes)
    return (f"7 calls of random sizes against their graph written by hand, and {replays} replays of two compiled "
            "steps equal to eager (float64)")


# ---- 2. the fusion rule -------------------------------------------------------------------------------------


class _Maker:
    """Hand-made nodes and buffers for the rule's cases."""

    def __init__(self):
        self.count = 0

    def buffer(self, kind, shape):
        from course_lib.compiler.ir import Buffer
        self.count += 1
        return Buffer(self.count, kind, np.zeros(max(int(np.prod(shape)), 1)), f"{kind[0]}{self.count}")

    def ref(self, buf, shape=None, strides=None, offset=0):
        from course_lib.compiler.ir import Ref, View
        shape = buf.shape if shape is None else tuple(shape)
        view = View.natural(shape) if strides is None else View(shape, tuple(strides), offset)
        return Ref(buf, view)

    def source(self, kind, shape):
        buf = self.buffer(kind, shape)
        buf.shape = tuple(shape)
        return self.ref(buf)

    def node(self, kind, op, inputs, shape, node_id=None, **attrs):
        from course_lib.compiler.ir import TEMP, Node
        buf = self.buffer(TEMP, shape)
        buf.shape = tuple(shape)
        self.count += 1
        node = Node(self.count if node_id is None else node_id, kind, op, list(inputs), self.ref(buf), attrs)
        node.start = node.id
        buf.producer = node
        return node


def _refused_cases():
    """(name, group's nodes, candidate, why no loop can compute it): nodes every correct rule refuses."""
    p1, p2 = (int(v) for v in rng().integers(2, 5, 2))
    R, n = p1 * p2, int(rng().integers(2, 9))
    while n == R:
        n = int(rng().integers(2, 9))
    s = int(rng().integers(2, 7))
    mk = _Maker()
    a = mk.node("map", "exp", [mk.source("input", (R, n))], (R, n))
    sq = mk.node("map", "exp", [mk.source("input", (s, s))], (s, s))
    late = mk.node("matmul", "", [mk.source("input", (R, s)), mk.source("state", (s, n))], (R, n), node_id=a.id + 50)
    mm = mk.node("matmul", "", [mk.source("input", (R, s)), mk.source("state", (s, n))], (R, n))
    return [
        ("a value of the group read through a transpose", [sq],
         mk.node("zip", "add", [sq.out, mk.ref(sq.out.buffer, (s, s), (1, s))], (s, s)),
         "element (i, j) of a transpose was made by row j of the loop, maybe not yet"),
        ("a value of the group read one element further on (a view at offset 1)", [a],
         mk.node("map", "neg", [mk.ref(a.out.buffer, (R, n), (n, 1), 1)], (R, n)),
         "the element one further on is made after the one the loop is at"),
        ("a reduction over dim 0 of a value of the group", [a], mk.node("reduce", "sum", [a.out], (1, n), dim=0),
         "a sum down the columns needs every row, and a loop makes one row at a time"),
        ("a product", [a], mk.node("matmul", "", [a.out, mk.source("state", (n, n))], (R, n)),
         "a product is not an elementwise op: it reads whole rows and columns (it stays with BLAS)"),
        ("a copy into a view of a scratch buffer", [a], mk.node("map", "id", [a.out], (R, n), into=True),
         "a write into a view of existing memory runs alone, in order with the other writes"),
        ("a value made by a group that starts after this one", [a],
         mk.node("zip", "add", [a.out, late.out], (R, n), node_id=a.id + 60),
         "the group runs at its first node's place, before the value exists"),
        ("a node of another shape", [a], mk.node("map", "neg", [mk.source("input", (n, R))], (n, R)),
         f"({n}, {R}) has {n} rows of {R}, the loop {R} rows of {n}"),
        ("a node offered to the group of a product", [mm], mk.node("map", "relu", [mm.out], (R, n)),
         "a group that starts with a product is that product's launch: it takes nothing"),
    ]


def _group_problem(group, first_of):
    """Why the loop of `group` cannot compute one of its members, or None. first_of: node id -> the first
    node id of its group (where that group runs). What a loop over rows of one shape can compute: elementwise
    ops and last-dim reductions with its rows (or one value per row, where a row was reduced); a value made
    inside, at the element being made; a value made outside, by a group that runs earlier."""
    from course_lib.compiler.fuse import COL, FULL, fusable, read_kind, rows_of

    if len(group.nodes) < 2:
        return None
    head = group.nodes[0]
    loop = tuple(head.inputs[0].shape) if head.kind == "reduce" else tuple(head.shape)
    rows = rows_of(loop)
    reduces = False
    members = {id(m) for m in group.nodes}
    for node in group.nodes:
        label = f"{node.label()} {tuple(node.shape)}" + (f" ({node.scope})" if node.scope else "")
        if not fusable(node) or (node.kind == "reduce" and node.attrs.get("dim") != len(node.inputs[0].shape) - 1):
            return f"{label} joined a group of {head.label()}, but it is not an elementwise op or a last-dim reduction"
        if node.kind == "reduce":
            own, per_row = tuple(node.inputs[0].shape), False
            if rows_of(own) != rows:
                return f"{label} reduces rows of another shape than the group's loop {loop}"
            reduces = True
        elif rows_of(node.shape) == rows:
            own, per_row = tuple(node.shape), False
        elif reduces and rows_of(node.shape) == (rows[0], 1):
            own, per_row = tuple(node.shape), True
        else:
            return f"{label} joined a loop over {loop}: it has neither the loop's rows nor one value per reduced row"
        for ref in node.inputs:
            maker = ref.buffer.producer
            if maker is not None and id(maker) in members:
                made_per_row = rows_of(maker.shape) != rows
                at_element = FULL if per_row or not made_per_row else COL
                if ref.view.offset != 0 or read_kind(ref, own) != at_element:
                    return (f"{label} reads {ref}, made inside the group, through another view than the element "
                            "the loop is making")
            elif maker is not None and first_of.get(maker.id, -1) > first_of[group.nodes[0].id]:
                return f"{label} reads {ref}, which a group that runs later makes"
    return None


def _check_grouping(groups, program):
    first_of = {n.id: g.nodes[0].id for g in groups for n in g.nodes}
    for g in groups:
        problem = _group_problem(g, first_of)
        require(problem is None, f"in the {program}, your rule made a group no loop can compute: {problem}\n"
                f"  the group: {g}", hint="a value of a group is made one element at a time, in row order, at the "
                "group's place in the step (lesson 13, section 6)")


def _gpt_step_groups(rule):
    """The groups of a small GPT's training step (captured once, float64) under `rule`, and the step's nodes
    that a loop can hold: elementwise ops and reductions."""
    import torch

    from course_lib.capstone import GPT
    from course_lib.compiler import Pieces, trace
    from course_lib.compiler.build import prune
    from course_lib.compiler.capturable import CAPTURABLE
    from course_lib.compiler.fuse import fusable, group_nodes
    from course_lib.gpt.model import GPT as TorchGPT
    from course_lib.gpt.model import GPTConfig
    from course_lib.gpt.trainer import TrainConfig, configure_optimizer, train_step

    heads = int(rng().integers(2, 4))
    config = GPTConfig(vocab_size=int(rng().integers(11, 30)), block_size=9, n_layer=2, n_head=heads,
                       n_embd=heads * int(rng().integers(3, 7)), dropout=0.0)
    torch.manual_seed(int(rng().integers(0, 1000)))
    model = GPT.from_torch(TorchGPT(config).double())
    optimizer = configure_optimizer(model, TrainConfig(), CAPTURABLE)
    batch = [rng().integers(0, config.vocab_size, (2, 8)) for _ in range(2)]
    train_step(model, optimizer, *batch, 1.0, CAPTURABLE)          # the optimizer makes its state
    course_record = Pieces().record                                 # capture as the course does
    graph, _ = trace.capture(train_step, (model, optimizer, *batch, 1.0, CAPTURABLE), course_record)
    nodes, _ = prune(graph)
    return group_nodes(nodes, rule), [n for n in nodes if fusable(n)]


def _captured_groups(fn, args, rule):
    from course_lib.compiler import Pieces, trace
    from course_lib.compiler.build import prune
    from course_lib.compiler.fuse import group_nodes

    graph, _ = trace.capture(fn, args, Pieces().record)            # capture as the course does
    nodes, _ = prune(graph)
    return group_nodes(nodes, rule)


SHARE = 1 / 3   # of a GPT step's elementwise ops and reductions, at least, must share a loop with another op


@exercise
def can_join(your_can_join):
    """Eight hand-made nodes that no loop can compute (each must be refused); every group your rule makes in
    three programs (an MLP's training step, a forward of the lesson's cases, a GPT's training step) must be
    one loop can compute; the first two, compiled with your rule, give the eager numbers (float64); and on the
    GPT step at least a third of the elementwise ops and reductions share a loop."""
    from course_lib import tensor as T
    from course_lib.compiler import Pieces
    from course_lib.compiler.fuse import Group

    for name, members, candidate, why in _refused_cases():
        group = Group(members[0])
        for m in members[1:]:
            group.add(m)
        answer = your_can_join(group, candidate)
        require(isinstance(answer, (bool, np.bool_)), f"can_join must return True or False; it returned {answer!r} "
                f"for the case: {name}")
        require(not answer, f"case: {name}\n  your rule lets it join; no loop can compute it: {why}\n"
                f"  the group: {group}\n  the node: {candidate!r}")
    sizes = [int(v) for v in rng().integers(3, 9, 3)]
    model, opt = _mlp(0, sizes)
    x, y = T.Tensor(rng().normal(size=(5, sizes[0]))), rng().integers(0, sizes[2], 5)
    _mlp_step(model, opt, x, y)
    _check_grouping(_captured_groups(_mlp_step, (model, opt, x, y), your_can_join), "MLP training step")
    size = 2 * int(rng().integers(2, 5))
    square = [T.Tensor(rng().normal(size=(size, size))) for _ in range(2)]
    _check_grouping(_captured_groups(_rows_program, square, your_can_join), "forward of the lesson's cases")
    groups, loopable = _gpt_step_groups(your_can_join)
    _check_grouping(groups, "GPT training step")
    shared = sum(len(g.nodes) for g in groups if len(g.nodes) > 1)
    if shared < SHARE * len(loopable):
        launches = {}
        for g in groups:
            for scope in {n.scope for n in g.nodes if n.scope}:
                launches[scope] = launches.get(scope, 0) + 1
        split = ", ".join(f"{s} in {k} launches" for s, k in sorted(launches.items(), key=lambda kv: -kv[1])[:4])
        raise CheckFailed(f"your rule lets {shared} of the GPT step's {len(loopable)} elementwise ops and reductions "
                          f"share a loop ({shared / len(loopable):.0%}); the compiler needs at least "
                          f"{SHARE:.0%} to be worth it. The library ops split most: {split}\n"
                          "  hint: a chain of elementwise ops of one shape is the plain case that joins; a bias or a "
                          "constant read from outside does not stop a node (lesson 13, section 6)")
    replays = training_steps_match_eager(Pieces(can_join=your_can_join), "can_join")
    replays += rows_program_matches_eager(Pieces(can_join=your_can_join), "can_join")
    return (f"8 nodes refused, every group of 3 programs computable, {shared / len(loopable):.0%} of a GPT step's "
            f"loop ops sharing a loop, and {replays} replays equal to eager (float64)")


# ---- 3. the loop of one pointwise group ------------------------------------------------------------------------


def _kernels():
    """Seven kernel descriptions, one idea each (their shapes are drawn per run; their text is fixed, so
    Numba compiles each once and keeps it on disk)."""
    from course_lib.compiler.fuse import COL, FULL, ONE, ROW
    from course_lib.compiler.lower import Kernel, Load, Step

    def k(loads, steps, stores, dtype="float64"):
        return Kernel((0, 0), [Load(kind, None, dt or dtype) for kind, dt in loads],
                      [Step(name, op, args, dtype) for name, op, args in steps], stores)

    L, T, C = "load", "temp", "const"
    return {
        "FULL loads only": k([(FULL, None), (FULL, None)], [
            ("t0", "mul", ((L, 0), (L, 1))), ("t1", "exp", ((T, "t0"),))], ["t1"]),
        "a ROW load (a bias: the same n values in every row)": k([(FULL, None), (ROW, None)], [
            ("t0", "add", ((L, 0), (L, 1))), ("t1", "sigmoid", ((T, "t0"),))], ["t1"]),
        "a COL load (one value per row: x - max)": k([(FULL, None), (COL, None)], [
            ("t0", "sub", ((L, 0), (L, 1))), ("t1", "exp", ((T, "t0"),))], ["t1"]),
        "a ONE load and constants": k([(FULL, None), (ONE, None)], [
            ("t0", "mul", ((L, 0), (C, 0.5))), ("t1", "div", ((T, "t0"), (L, 1))),
            ("t2", "add", ((T, "t1"), (C, -3.0)))], ["t2"]),
        "two outputs, in the order of kernel.stores": k([(FULL, None), (ROW, None)], [
            ("t0", "add", ((L, 0), (L, 1))), ("t1", "relu", ((T, "t0"),)), ("t2", "step", ((T, "t0"),))],
            ["t2", "t1"]),
        "float32, a where and a comparison": k([(FULL, None), (FULL, None), (COL, None)], [
            ("t0", "gt", ((L, 0), (L, 2))), ("t1", "mul", ((L, 1), (C, 2.0))),
            ("t2", "where", ((T, "t0"), (T, "t1"), (L, 0))), ("t3", "max", ((T, "t2"), (L, 2)))], ["t3", "t0"],
            "float32"),
        "a one-hot from integer targets (a COL load of int64, and the column j)": k([(COL, "int64")], [
            ("t0", "one_hot", ((L, 0),))], ["t0"], "float32"),
    }


_NUMPY = {"mul": np.multiply, "add": np.add, "sub": np.subtract, "div": np.divide, "exp": np.exp,
          "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0),
          "step": lambda x: (x > 0).astype(x.dtype), "gt": lambda x, y: (x > y).astype(x.dtype),
          "max": np.maximum, "where": lambda c, a, b: np.where(c != 0, a, b)}


def _evaluate(kernel, arrays, R, n):
    """What each store should hold, by numpy on whole (R, n) arrays in float64."""
    from course_lib.compiler.fuse import COL, FULL, ONE, ROW
    values, full = {}, []
    for load, a in zip(kernel.loads, arrays):
        a = a.astype(np.float64)
        full.append({FULL: lambda: a[:R * n].reshape(R, n), ROW: lambda: np.broadcast_to(a[:n], (R, n)),
                     COL: lambda: np.broadcast_to(a[:R, None], (R, n)), ONE: lambda: np.full((R, n), a[0])}[load.kind]())
    for step in kernel.steps:
        args = [full[i] if w == "load" else values[i] if w == "temp" else np.float64(i) for w, i in step.args]
        if step.op == "one_hot":
            values[step.name] = (args[0] == np.arange(n)[None, :]).astype(np.float64)
        else:
            values[step.name] = _NUMPY[step.op](*args) * np.ones((R, n))
    return [values[name] for name in kernel.stores]


def _arrays_for(kernel, R, n):
    from course_lib.compiler.fuse import COL, FULL, ONE, ROW
    out = []
    for load in kernel.loads:
        size = {FULL: R * n, ROW: n, COL: R, ONE: 1}[load.kind]
        if load.dtype == "int64":
            out.append(rng().integers(0, n, size).astype(np.int64))
        else:
            out.append(rng().uniform(-2, 2, size).astype(load.dtype))
    return out


def _run_as_python(source, kernel, R, n):
    """Run the kernel's source as plain Python, its `prange` loops taken in a shuffled order, on random inputs.
    Returns (outputs, inputs, loops): loops are (kind, length, depth) of each loop started, depth 0 the
    outermost."""
    from course_lib.compiler import scalar

    loops, depth, order = [], [0], np.random.default_rng(int(rng().integers(0, 2**31)))

    def counted(kind):
        def loop(*args):
            items = list(range(*args))
            if kind == "prange":
                order.shuffle(items)
            loops.append((kind, len(items), depth[0]))

            def walk():
                depth[0] += 1
                try:
                    yield from items
                finally:
                    depth[0] -= 1
            return walk()
        return loop

    scope = {"np": np, "prange": counted("prange"), "range": counted("range"), "F32": np.float32,
             "F64": np.float64, **{name: getattr(scalar, name) for name in
                                   ("vexp", "vsigmoid", "vrelu", "vmax", "vgelu", "vgelu_grad")}}
    exec(compile(source, "<your kernel>", "exec"), scope)
    arrays = _arrays_for(kernel, R, n)
    outs = [np.full(R * n, np.nan, dtype=kernel.steps[0].dtype) for _ in kernel.stores]
    with np.errstate(all="ignore"):
        scope["kernel"](*outs, *arrays, R, n)
    return outs, arrays, loops


def _rows_spread(name, source, kernel, n):
    """The kernel's outermost loops are prange loops whose length grows with R, and its rows stand alone:
    taken in any order, they give numpy's values. Returns nothing; raises CheckFailed."""
    lengths = []
    for R in (6, 12):
        outs, arrays, loops = _run_as_python(source, kernel, R, n)
        outer = [(kind, length) for kind, length, depth in loops if depth == 0]
        require(outer and all(kind == "prange" for kind, _ in outer),
                f"the kernel with {name}: its outermost loop is {'a serial ' + outer[0][0] if outer else 'missing'}"
                f" (loops started, as (kind, length, depth): {loops[:4]}{' ...' if len(loops) > 4 else ''}); the "
                "threads can only share work that the outermost loop hands out",
                hint="Numba gives the iterations of a prange to the threads; a prange inside a serial loop starts "
                     "and stops them once per outer iteration (lesson 13, section 7)")
        lengths.append(sum(length for _, length in outer))
        for k, (got, want) in enumerate(zip(outs, _evaluate(kernel, arrays, R, n))):
            assert_close(got.reshape(R, n), want, what=f"output {k} of the kernel with {name}, run with its rows in a "
                         f"shuffled order (R={R}, n={n})", rtol=1e-5 if kernel.steps[0].dtype == "float32" else 1e-12,
                         atol=1e-5 if kernel.steps[0].dtype == "float32" else 1e-12,
                         hint="the threads run the rows in any order, so no row may use what another row left")
    require(lengths[1] >= 1.5 * lengths[0],
            f"the kernel with {name}: its parallel loop has {lengths[0]} iterations for 6 rows and {lengths[1]} for "
            "12 rows: it does not hand out the rows, so a tall tensor still runs on few threads",
            hint="rows are many (768 in the GPT) and columns few: spread what grows")


@exercise
def pointwise_source(your_pointwise_source):
    """Seven kernel descriptions (one per idea: FULL, ROW, COL and ONE loads, constants, two outputs, float32
    with a where, a one-hot), each compiled with Numba from your source and run on random shapes against
    numpy's evaluation of the same formulas; and each run as Python with its rows in a shuffled order, whose
    outermost loop must be a prange that grows with the rows."""
    from course_lib.compiler import kernels

    for name, kernel in _kernels().items():
        source = your_pointwise_source(kernel)
        require(isinstance(source, str) and "def kernel(" in source,
                f"for the kernel with {name}, your generator must return the source of `def kernel(...)`; it "
                f"returned {fmt(source)}")
        text = kernels.module_text(source, parallel=False, reduces=False)
        try:
            fn = kernels.load(text, name)
        except kernels.KernelError as e:
            raise CheckFailed(f"the kernel with {name} is not valid Python:\n{e}") from None
        for R, n in [(1, 1), (int(rng().integers(2, 9)), int(rng().integers(2, 9))),
                     (int(rng().integers(10, 40)), int(rng().integers(2, 6)))]:
            arrays = _arrays_for(kernel, R, n)
            outs = [np.full(R * n, np.nan, dtype=kernel.steps[0].dtype) for _ in kernel.stores]
            try:
                fn(*outs, *arrays, R, n)
            except Exception as e:  # noqa: BLE001 - Numba's typing errors name the line
                raise CheckFailed(f"the kernel with {name} failed for R={R}, n={n}: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:300]}\n{kernels.numbered(source)}") from None
            expected = _evaluate(kernel, arrays, R, n)
            tol = 1e-5 if kernel.steps[0].dtype == "float32" else 1e-12
            for k, (got, want) in enumerate(zip(outs, expected)):
                assert_close(got.reshape(R, n), want, what=f"output {k} ({kernel.stores[k]}) of the kernel with {name}, "
                             f"R={R} rows of n={n}", rtol=tol, atol=tol,
                             inputs={f"in{j}": a for j, a in enumerate(arrays)},
                             hint="each kind of load is read at its own place for the element (r, j): a whole row, "
                                  "the shared row, one value per row, one value; and out k holds store k")
        _rows_spread(name, source, kernel, int(rng().integers(2, 5)))
    return "7 kernels, each at 3 random sizes, and each spread over the rows with its rows independent"


# ---- 4. the guard check ------------------------------------------------------------------------------------

_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def _names_argument(message, k):
    """The message says which argument: 'argument 2', 'arg #2', 'args[2]', 'position 2' or 'the third'."""
    text = message.lower()
    by_number = re.search(rf"\b(?:arg(?:ument)?s?|param(?:eter)?|input|position)\s*(?:#|no\.?|number)?\s*\[?\s*{k}\b",
                          text)
    return bool(by_number) or re.search(rf"\b{_ORDINALS[k]}\b", text) is not None


def _says_shape(message, shape):
    """The shape's sizes appear in order, as a tuple, a list or 6x3."""
    numbers = r"\D{1,3}".join(str(s) for s in shape)
    return re.search(rf"(?<!\d){numbers}(?!\d)", message) is not None


def _says_number(message, value):
    found = [float(v) for v in re.findall(r"(?<![\w.])-?\d+(?:\.\d*)?(?:e-?\d+)?", message)]
    return any(math.isclose(f, value) for f in found)


def _says_dtype(message, dtype):
    d = np.dtype(dtype)
    return any(word in message for word in (d.name, d.str[1:]))


@exercise
def guard(your_guard):
    """Calls against a step captured with (model, optimizer, a float32 tensor, an int64 array, 0.5, 1, None):
    three that may replay must pass; eleven that changed must be refused with a sentence that names the
    argument and says what it was and is (checked by the numbers and names in it, not its wording); then a
    compiled step with your guard replays equal calls and captures a new shape again."""
    import torch

    from course_lib import tensor as T
    from course_lib.compiler import Pieces
    from course_lib.compiler.capturable import Adam
    from course_lib.compiler.guards import describe

    def model():
        m = T.nn.Linear(3, 2)
        return m, Adam(m.parameters())

    B = int(rng().integers(2, 9))
    m, opt = model()
    x = T.Tensor(rng().normal(size=(B, 3)), dtype=np.float32)
    y = rng().integers(0, 2, B)
    captured = (m, opt, x, y, 0.5, 1, None)
    expected = describe(captured)

    def again(**change):
        args = [m, opt, T.Tensor(rng().normal(size=(B, 3)), dtype=np.float32), rng().integers(0, 2, B), 0.5, 1, None]
        for key, v in change.items():
            args[int(key[1:])] = v
        return tuple(args)

    other_model, other_opt = model()
    passing = [("new tensors of the captured shapes and dtypes", again()),
               ("a torch tensor where a numpy array was captured (same shape and dtype)",
                again(a3=torch.from_numpy(rng().integers(0, 2, B)))),
               ("an equal number, another object", again(a4=float(np.float64(0.25) * 2)))]
    kind_words = (("tensor",), ("array", "numpy"))

    def shapes(new, old):
        return lambda msg: _says_shape(msg, new) and _says_shape(msg, old), f"both shapes, {new} and {old}"

    def dtypes(new, old):
        return lambda msg: _says_dtype(msg, new) and _says_dtype(msg, old), f"both dtypes, {new} and {old}"

    def kinds(msg):
        low = msg.lower()
        return all(any(w in low for w in words) for words in kind_words)

    failing = [
        ("the tensor has another shape", again(a2=T.Tensor(rng().normal(size=(B + 1, 3)), dtype=np.float32)), 2,
         *shapes((B + 1, 3), (B, 3))),
        ("the tensor has another dtype", again(a2=T.Tensor(rng().normal(size=(B, 3)), dtype=np.float64)), 2,
         *dtypes("float64", "float32")),
        ("a numpy array where a tensor was captured (same shape and dtype)",
         again(a2=rng().normal(size=(B, 3)).astype(np.float32)), 2, kinds, "both kinds, an array and a tensor"),
        ("the integer array has another shape", again(a3=rng().integers(0, 2, B + 2)), 3, *shapes((B + 2,), (B,))),
        ("the integer array has another dtype", again(a3=rng().integers(0, 2, B).astype(np.int32)), 3,
         *dtypes("int32", "int64")),
        ("a tensor where an array was captured", again(a3=T.Tensor(rng().normal(size=(B,)))), 3, kinds,
         "both kinds, a tensor and an array"),
        ("another model, equal but not the same object", again(a0=other_model), 0, None, ""),
        ("another optimizer", again(a1=other_opt), 1, None, ""),
        ("another number", again(a4=0.25), 4, lambda msg: _says_number(msg, 0.25) and _says_number(msg, 0.5),
         "both values, 0.25 and 0.5"),
        ("1.0 where 1 was captured (equal, but another type)", again(a5=1.0), 5,
         lambda msg: "float" in msg and "int" in msg or "1.0" in msg, "the new value or both types"),
        ("True where 1 was captured", again(a5=True), 5, lambda msg: "True" in msg or "bool" in msg,
         "the new value or its type"),
    ]
    for name, args in passing:
        answer = your_guard(expected, args)
        require(answer is None, f"{name}: your guard refused the call ({answer!r}); it must return None",
                hint="a replay needs what the kernels and the plan were made for, and no more: the values of "
                     "tensors and arrays change at every call")
    for name, args, k, says, what in failing:
        answer = your_guard(expected, args)
        require(isinstance(answer, str) and answer,
                f"{name} (argument {k}): your guard returned {answer!r}; it must return a sentence naming the "
                "difference", hint="a call may replay only if every entry of the capture matches it")
        require(_names_argument(answer, k), f"{name}: your message {answer!r} does not say which argument differs "
                f"(argument {k}, counted from 0)")
        if says is not None:
            require(says(answer), f"{name}: your message {answer!r} should say what was captured and what this call "
                    f"passes: {what}")
    short = your_guard(expected, captured[:-1])
    require(isinstance(short, str) and _says_number(short, 7) and _says_number(short, 6),
            f"a call with one argument fewer: your guard returned {short!r}; it must say the counts differ (7, 6)")
    sizes = [int(v) for v in rng().integers(3, 9, 3)]
    model_, opt_ = _mlp(1, sizes)
    step = _compile(_mlp_step, Pieces(guard=your_guard))
    for rows in (5, 5, 5, 5, 5, 4):
        _run(lambda: step(model_, opt_, T.Tensor(rng().normal(size=(rows, sizes[0]))),
                          rng().integers(0, sizes[2], rows)), "guard", "MLP training step")
    require(step.stats.replays >= 2 and len(step.programs) == 1 and step.pending is not None,
            f"a compiled MLP step with your guard, called 5 times with a batch of 5 then with a batch of 4: it "
            f"replayed {step.stats.replays} calls (2 expected) and holds {len(step.programs)} program(s), "
            f"{'with' if step.pending is not None else 'without'} a new capture pending (one expected)")
    return "3 calls that pass and 12 that are refused, each named by meaning; a compiled step replays and recaptures"
