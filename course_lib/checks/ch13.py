"""Checks for chapter 13, the compiler: the tracer's recording of one backend call, the fusion rule, the
generator of one pointwise group's loop, and the guard check.

The oracles: each case's answer written out by hand (which buffer an input is, whether a node may join,
what a guard must say), numpy's evaluation of a kernel's formulas, and, for the pieces a compiled step
runs, the eager library's own step in float64: a step compiled with your piece must give the eager step's
losses and gradients within 1e-12.
"""

import numpy as np

from course_lib.checks import CheckFailed, assert_close, assert_equal, exercise, fmt, require, rng

# ---- shared: a small training step, eager against compiled --------------------------------------------------


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


def compiled_matches_eager(pieces, what, steps=7):
    """A digits-like MLP step compiled with `pieces` against the same step run eagerly, in float64: every
    loss and every gradient equal within 1e-12. Returns how many calls were replayed."""
    import contextlib
    import io

    from course_lib import tensor as T
    from course_lib.compiler import compile as compile_step

    seed, sizes = int(rng().integers(0, 1000)), [int(v) for v in rng().integers(3, 9, 3)]
    eager_model, eager_opt = _mlp(seed, sizes)
    model, opt = _mlp(seed, sizes)
    step = compile_step(_mlp_step, pieces=pieces, verbose=False)
    batch = int(rng().integers(3, 8))
    with contextlib.redirect_stdout(io.StringIO()):
        for k in range(steps):
            x = rng().normal(size=(batch, sizes[0]))
            y = rng().integers(0, sizes[2], batch)
            expected = _mlp_step(eager_model, eager_opt, T.Tensor(x), y).item()
            got = step(model, opt, T.Tensor(x), y).item()
            assert_close(got, expected, what=f"the loss of call {k + 1} of a step compiled with your {what}",
                         rtol=1e-12, atol=1e-12)
    for (name, p), q in zip(eager_model.named_parameters(), model.parameters()):
        assert_close(q.grad.numpy(), p.grad.numpy(), what=f"the gradient of {name} after {steps} compiled calls",
                     rtol=1e-9, atol=1e-12)
    require(step.stats.replays > 0, f"a step compiled with your {what} never replayed (it ran eagerly: "
            f"{step.eager_reason})")
    return step.stats.replays


# ---- 1. recording one backend call ------------------------------------------------------------------------


def _td(array, shape=None, strides=None, offset=0):
    from course_lib.tensor.tensor_data import TensorData
    return TensorData(array, array.shape if shape is None else shape, strides, offset)


def _record_scenario(record, values):
    """Seven backend calls recorded into a fresh tracer, as the capture of a step makes them. Returns the
    tracer, the nodes in call order, and the arrays whose later change the graph must not see."""
    from course_lib.compiler.ir import INPUT, STATE
    from course_lib.compiler.trace import Tracer
    from course_lib.tensor.backend import get_backend

    n, m, x, w, c, extra = values
    numpy = get_backend("numpy")
    tracer = Tracer(numpy)
    x_mem, w_mem = x.copy(), w.copy()
    tracer.buffer(INPUT, x_mem, "x")
    tracer.buffer(STATE, w_mem, "w")
    const_mem, extra_mem = np.array([c]), extra.copy()
    xv = _td(x_mem, (n, m))
    wt = _td(w_mem, (n, m), (1, n))                      # w is (m, n): its transpose, a view
    nodes = []

    def call(kind, op, inputs, out, into=False, **attrs):
        node = record(tracer, kind, op, inputs, out, into, attrs)
        nodes.append(node)

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
    return tracer, nodes, (const_mem, extra_mem)


def _summary(tracer, nodes):
    """Each node as plain data: kind, op, its inputs and output (buffer's kind and first-seen number, view),
    into, after (a node's position), dim; and each constant buffer's values."""
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


@exercise
def record(your_record):
    """Seven backend calls (a zip that reads an input and a transposed view of state, a map that reads a
    reshape of a value made before, a constant used twice and then changed by the library, two writes into
    a scratch buffer, a reduction of it), then a compiled float64 step that records with your function."""
    from course_lib.compiler import Pieces
    from course_lib.compiler.ir import CONST, SCRATCH, TEMP
    from course_lib.compiler.trace import record as course_record

    n, m = (int(v) for v in rng().integers(2, 7, 2))
    values = (n, m, rng().normal(size=n * m), rng().normal(size=m * n), float(rng().uniform(0.5, 2.0)),
              rng().normal(size=3))
    tracer, nodes, changed = _record_scenario(your_record, values)
    require(len(tracer.nodes) == 8 and all(a is b for a, b in zip(tracer.nodes, nodes)),
            f"after 7 recorded calls (and one fill) tracer.nodes holds {len(tracer.nodes)} nodes; each call must "
            "append its node to tracer.nodes (and return it)",
            hint="the node's number is len(tracer.nodes) before you append it")
    add, exp, mul, mul2, fill, write1, write2, total = nodes
    x_ref, wt_ref = add.inputs
    kinds = [r.buffer.kind for r in add.inputs]
    require(kinds == ["input", "state"],
            f"the first call reads the input x and a transposed view of the state w; your node's inputs are "
            f"buffers of kinds {kinds}",
            hint="look each input up by its memory, tracer.by_storage[id(td.storage)]: x.T is a new TensorData "
                 "object over the same memory, so looking it up by the TensorData finds nothing")
    assert_equal((wt_ref.view.shape, wt_ref.view.strides), ((n, m), (1, n)), "the view the first call reads w through",
                 hint="record the view the call read (View.of(td)): shape, strides and offset")
    require(exp.inputs[0].buffer is add.out.buffer,
            f"the second call reads the first call's output through a reshape; your node reads "
            f"{exp.inputs[0].buffer!r} instead of the first node's output buffer {add.out.buffer!r}",
            hint="a value made by an earlier node is found by its memory too (the reshape shares it)")
    require(add.out.buffer.kind == TEMP and add.out.buffer.producer is add and exp.out.buffer.producer is exp,
            "each node's output must be a new temp buffer whose producer is that node",
            hint="tracer.buffer(TEMP, out.storage), then set buf.producer = node")
    const = mul.inputs[1].buffer
    require(const.kind == CONST, f"the third call reads a number made outside the step's ops; your node reads it "
            f"as a {const.kind} buffer", hint="memory the graph does not know yet is a new constant")
    require(const.value is not None and float(np.asarray(const.value).reshape(-1)[0]) == values[4],
            f"the constant the step used was {values[4]!r}; after the library wrote 99.0 into that memory your "
            f"graph holds {fmt(const.value)}",
            hint="copy a constant's values when you first see it (np.array(td.storage)): the library reuses memory")
    require(mul2.inputs[1].buffer is const, "the fourth call reads the same constant memory again; your node made a "
            "second buffer for it", hint="look the memory up before making a buffer: one memory, one buffer")
    require(write1.out.buffer.kind == SCRATCH and write1.out.buffer is fill.out.buffer,
            f"the fifth call writes into a view of a scratch buffer (zeros the library made, `into`); your node's "
            f"output is {write1.out.buffer!r}, not that buffer",
            hint="with `into`, the output memory is already a buffer: tracer.by_storage[id(out.storage)]")
    require(write1.attrs.get("into") is True and write1.attrs.get("after") is fill and write2.attrs.get("after") is write1,
            "a write into a scratch buffer must say so (attrs['into'] = True) and name the node that wrote it "
            "before (attrs['after'] = the buffer's producer), so the writes keep their order",
            hint="read buf.producer before you set it to the new node")
    assert_equal((write2.out.view.offset, write2.out.view.shape), (n * m, (3,)),
                 "the view the sixth call writes through (offset, shape)", hint="the output's view is View.of(out)")
    require(total.inputs[0].buffer is fill.out.buffer and total.out.buffer.producer is total,
            "the last call reads the scratch buffer the writes filled")
    reference, ref_nodes, _ = _record_scenario(course_record, values)
    for k, (yours, expected) in enumerate(zip(_summary(tracer, nodes), _summary(reference, ref_nodes))):
        assert_equal(yours, expected, f"node {k} (kind, op, inputs as (buffer, shape, strides, offset), output, "
                     "into, after, dim)")
    replays = compiled_matches_eager(Pieces(record=your_record), "record")
    del changed
    return f"7 calls of random sizes, and {replays} replays of a compiled step equal to eager (float64)"


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


def _rule_cases():
    """(name, group's nodes, candidate, whether it may join, the hint if your answer differs)."""
    p1, p2 = (int(v) for v in rng().integers(2, 5, 2))
    R, n = p1 * p2, int(rng().integers(2, 9))
    while n == R:
        n = int(rng().integers(2, 9))
    s = int(rng().integers(2, 7))
    mk = _Maker()
    x = mk.source("input", (R, n))
    a = mk.node("map", "exp", [x], (R, n))
    a_out = a.out
    cases = []
    cases.append(("an elementwise op on a value of the group, same shape", [a],
                  mk.node("zip", "mul", [a_out, mk.source("input", (R, n))], (R, n)), True,
                  "a chain of elementwise ops of one shape is the plain case: it joins"))
    cases.append(("a reshape of a value of the group that keeps the last dim", [a],
                  mk.node("map", "neg", [mk.ref(a_out.buffer, (p1, p2, n))], (p1, p2, n)), True,
                  f"compare rows, not shapes (rows_of): ({R}, {n}) and ({p1}, {p2}, {n}) are the same {R} rows of "
                  f"{n}, with every element in its place, so a loop over one serves the other"))
    cases.append(("a bias row added to a value of the group (broadcast, made outside)", [a],
                  mk.node("zip", "add", [a_out, mk.source("state", (n,))], (R, n)), True,
                  "a value made outside the group may be read through any view (here a row for every row)"))
    cases.append(("a product by a constant number", [a], mk.node("zip", "mul", [a_out, mk.source("const", ())], (R, n)), True,
                  "a constant is read from outside: it does not stop the node from joining"))
    cases.append(("a reduction over the last dim of the group's shape", [a],
                  mk.node("reduce", "sum", [a_out], (R, 1), dim=1), True,
                  "a reduction over the last dim of a value of the group's shape joins: each row folds its own values"))
    cases.append(("a reduction over dim 0", [a], mk.node("reduce", "sum", [a_out], (1, n), dim=0), False,
                  "only a reduction over the LAST dim joins (one row at a time); node.attrs['dim'] says which dim"))
    r = mk.node("reduce", "max", [a_out], (R, 1), dim=1)
    cases.append(("a per-row value computed from the reduction", [a, r],
                  mk.node("zip", "div", [r.out, mk.source("const", ())], (R, 1)), True,
                  "in a group with a reduction, a node with one value per row ((rows, 1)) is a row member: it joins"))
    cases.append(("a value of the row shape in a group without a reduction", [a],
                  mk.node("map", "neg", [mk.source("input", (R, 1))], (R, 1)), False,
                  "a row-shaped node only joins a group that has a reduction (group.reduces)"))
    cases.append(("x - max(x): a vec node that reads the group's row value, broadcast", [a, r],
                  mk.node("zip", "sub", [a_out, r.out], (R, n)), True,
                  "a vec node may read a row value of the group at its row (COL): softmax's x - max joins"))
    sq = mk.node("map", "exp", [mk.source("input", (s, s))], (s, s))
    transposed = mk.ref(sq.out.buffer, (s, s), (1, s))
    cases.append(("a value of the group read through a transpose", [sq],
                  mk.node("zip", "add", [sq.out, transposed], (s, s)), False,
                  "a value made inside the group must be read where it lies (read_kind FULL, offset 0): element "
                  "(i, j) of a transpose was made by another row, maybe not yet"))
    shifted = mk.ref(a_out.buffer, (R, n), (n, 1), 1)
    cases.append(("a value of the group read one element further on (a view with offset 1)", [a],
                  mk.node("map", "neg", [shifted], (R, n)), False,
                  "a value made inside the group is read at the element's own index: the view must also start at "
                  "offset 0 (ref.view.offset)"))
    cases.append(("a node of another shape", [a], mk.node("map", "neg", [mk.source("input", (n, R))], (n, R)), False,
                  "a node joins only if it has the group's rows (or one value per row, in a group with a reduction)"))
    cases.append(("a product", [a], mk.node("matmul", "", [a_out, mk.source("state", (n, s))], (R, s)), False,
                  "products stay with BLAS: only fusable nodes join (use fusable(node))"))
    cases.append(("a copy into a view of a scratch buffer", [a],
                  mk.node("map", "id", [a_out], (R, n), into=True), False,
                  "a write into a view (attrs['into']) runs alone: fusable(node) is False for it"))
    late = mk.node("matmul", "", [mk.source("input", (R, s)), mk.source("state", (s, n))], (R, n), node_id=a.id + 50)
    cases.append(("a value made by a group that starts after this one", [a],
                  mk.node("zip", "add", [a_out, late.out], (R, n), node_id=a.id + 60), False,
                  "a value made outside must exist when the group starts: its producer's group must start before "
                  "the group's first node (producer.start < group.first)"))
    early = mk.node("matmul", "", [mk.source("input", (R, s)), mk.source("state", (s, n))], (R, n), node_id=a.id - 1)
    cases.append(("a value made by a group that started before this one", [a],
                  mk.node("zip", "add", [a_out, early.out], (R, n), node_id=a.id + 61), True,
                  "a value made by an earlier group is ready when this group starts: it may be read"))
    mm = mk.node("matmul", "", [mk.source("input", (R, s)), mk.source("state", (s, n))], (R, n))
    cases.append(("a node offered to a group of a product", [mm],
                  mk.node("map", "relu", [mm.out], (R, n)), False,
                  "a group that starts with a node that cannot be fused takes nothing (group.fusable)"))
    return cases


@exercise
def can_join(your_can_join):
    """The fusion rule on 17 hand-made cases of random sizes, each with its answer written out, then a
    compiled float64 step grouped by your rule (a rule that fuses too much gives wrong numbers)."""
    from course_lib.compiler import Pieces
    from course_lib.compiler.fuse import Group

    for name, members, candidate, expected, hint in _rule_cases():
        group = Group(members[0])
        for m in members[1:]:
            group.add(m)
        answer = your_can_join(group, candidate)
        require(isinstance(answer, (bool, np.bool_)), f"can_join must return True or False; it returned {answer!r} "
                f"for the case: {name}")
        require(bool(answer) == expected,
                f"case: {name}\n  your rule says {bool(answer)}, it should say {expected}\n"
                f"  the group: {group}\n  the node: {candidate!r}", hint=hint)
    replays = compiled_matches_eager(Pieces(can_join=your_can_join), "can_join")
    return f"17 cases, and {replays} replays of a compiled step equal to eager (float64)"


# ---- 3. the loop of one pointwise group ------------------------------------------------------------------------


def _kernels():
    """Seven kernel descriptions, one idea each (their shapes are drawn per run; their text is fixed, so
    Numba compiles each once and keeps it on disk)."""
    from course_lib.compiler.codegen import Kernel, Load, Step
    from course_lib.compiler.fuse import COL, FULL, ONE, ROW

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


@exercise
def pointwise_source(your_pointwise_source):
    """Seven kernel descriptions (one per idea: FULL, ROW, COL and ONE loads, constants, two outputs, float32
    with a where, a one-hot), each compiled with Numba from your source and run on random shapes, against
    numpy's evaluation of the same formulas."""
    from course_lib.compiler import kernels

    for name, kernel in _kernels().items():
        source = your_pointwise_source(kernel)
        require(isinstance(source, str) and "def kernel(" in source,
                f"for the kernel with {name}, your generator must return the source of `def kernel(...)`; it "
                f"returned {fmt(source)}")
        require("prange(" in source, f"for the kernel with {name}: the rows must be a prange loop (the threads share "
                "them); your source has no prange", hint="for r in prange(R):")
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
                             hint="FULL reads in[r * n + j], ROW in[j], COL in[r], ONE in[0]; out k holds kernel.stores[k]")
    return "7 kernels, each at 3 random sizes"


# ---- 4. the guard check ------------------------------------------------------------------------------------


@exercise
def guard(your_guard):
    """Twelve calls against a step captured with (model, optimizer, a float32 tensor, an int64 array, 0.5, 1,
    None): the same kinds of arguments must pass; each change must be named, argument by argument."""
    import torch

    from course_lib import tensor as T
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
        for k, v in change.items():
            args[int(k[1:])] = v
        return tuple(args)

    other_model, other_opt = model()
    passing = [("new tensors of the captured shapes and dtypes", again()),
               ("a torch tensor where a numpy array was captured (same shape and dtype)",
                again(a3=torch.from_numpy(rng().integers(0, 2, B))))]
    failing = [
        ("the tensor has another shape", again(a2=T.Tensor(rng().normal(size=(B + 1, 3)), dtype=np.float32)), 2,
         [f"({B + 1}, 3)", f"({B}, 3)"]),
        ("the tensor has another dtype", again(a2=T.Tensor(rng().normal(size=(B, 3)), dtype=np.float64)), 2,
         ["float64", "float32"]),
        ("the integer array has another shape", again(a3=rng().integers(0, 2, B + 2)), 3, [f"({B + 2},)"]),
        ("the integer array has another dtype", again(a3=rng().integers(0, 2, B).astype(np.int32)), 3, ["int32"]),
        ("a tensor where an array was captured", again(a3=T.Tensor(rng().normal(size=(B,)))), 3, []),
        ("another model, equal but not the same object", again(a0=other_model), 0, []),
        ("another optimizer", again(a1=other_opt), 1, []),
        ("another number", again(a4=0.25), 4, ["0.25", "0.5"]),
        ("1.0 where 1 was captured (equal, but another type)", again(a5=1.0), 5, []),
        ("True where 1 was captured", again(a5=True), 5, []),
    ]
    for name, args in passing:
        answer = your_guard(expected, args)
        require(answer is None, f"{name}: your guard refused the call ({answer!r}); it must return None",
                hint="arrays are compared by shape and dtype only: their values change at every call")
    for name, args, k, words in failing:
        answer = your_guard(expected, args)
        require(isinstance(answer, str) and answer,
                f"{name} (argument {k}): your guard returned {answer!r}; it must return a sentence naming the "
                "difference", hint="return None only when every argument matches")
        require(f"argument {k}" in answer, f"{name}: your message {answer!r} must name the argument (\"argument {k}\")")
        for w in words:
            require(w in answer, f"{name}: your message {answer!r} should say both what was captured and what "
                    f"this call passes (it lacks {w!r})")
    short = your_guard(expected, captured[:-1])
    require(isinstance(short, str) and "argument" in short,
            f"a call with one argument fewer: your guard returned {short!r}; it must say the counts differ")
    return "2 calls that pass and 11 that are refused, each named"
