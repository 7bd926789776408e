"""Checks for chapter 14, serving: the block manager, paged attention, the scheduler's step, the
speculative acceptance rule and weight-only int8.

The oracles are written another way: a block manager that knows blocks by their whole prefix (a tuple of
tokens, no hash); attention over each sequence's keys gathered into one contiguous array, in float64;
chapter 04's GPT in PyTorch, float64, generating each request alone; the target's distribution itself,
against which many seeded draws of your rule are tested; numpy's float64 product with the dequantized
weights. And the property each piece exists for is checked too: a shared block survives until its last
user leaves; attention never copies a sequence's cache (tracemalloc sees every array numpy or Numba
allocates); the scheduler preempts the newest request and loses no token; int8 weights take a quarter of
the bytes, and the kernel never makes the float32 matrix.
"""

import itertools
import math

import numpy as np
import torch

from course_lib.checks import CheckFailed, assert_close, assert_equal, exercise, fmt, require, rng
from course_lib.memory import peak_bytes
from course_lib.serve.sequence import blocks_for

# ---- 1. the block manager ---------------------------------------------------------------------------


class _Prefixes:
    """The oracle: each block is known by the whole prefix it ends (a tuple of tokens), no hashing."""

    def __init__(self, num_blocks, block_size):
        self.bs, self.free = block_size, num_blocks
        self.ids = itertools.count()
        self.registered, self.key, self.users, self.tables, self.tokens = {}, {}, {}, {}, {}

    def _new(self):
        self.free -= 1
        block = next(self.ids)
        self.users[block] = 1
        return block

    def _register(self, seq, i):
        key = tuple(self.tokens[seq][:(i + 1) * self.bs])
        self.key[self.tables[seq][i]] = key
        self.registered.setdefault(key, self.tables[seq][i])

    def allocate(self, seq, tokens):
        hits = []
        for i in range((len(tokens) - 1) // self.bs):
            block = self.registered.get(tuple(tokens[:(i + 1) * self.bs]))
            if block is None:
                break
            hits.append(block)
        if blocks_for(len(tokens), self.bs) - len(hits) > self.free:
            return None
        for block in hits:
            self.users[block] += 1
        self.tables[seq] = hits + [self._new() for _ in range(blocks_for(len(tokens), self.bs) - len(hits))]
        self.tokens[seq] = list(tokens)
        for i in range(len(hits), len(tokens) // self.bs):
            self._register(seq, i)
        return len(hits) * self.bs

    def append(self, seq, token):
        if len(self.tokens[seq]) == len(self.tables[seq]) * self.bs:
            if not self.free:
                return False
            self.tables[seq].append(self._new())
        self.tokens[seq].append(token)
        if len(self.tokens[seq]) % self.bs == 0:
            self._register(seq, len(self.tables[seq]) - 1)
        return True

    def free_seq(self, seq):
        for block in self.tables.pop(seq):
            self.users[block] -= 1
            if self.users[block] == 0:
                self.free += 1
                key = self.key.pop(block, None)
                if self.registered.get(key) == block:
                    del self.registered[key]
        del self.tokens[seq]


def _compare_blocks(mine, oracle, what):
    """Free counts, table lengths, and the same sharing: two table entries are one block in yours exactly
    when they are one block in the oracle, and no block is both held and free."""
    require(mine.num_free() == oracle.free,
            f"{what}: num_free() is {mine.num_free()}, expected {oracle.free}.",
            hint="a block goes back to the pool only when its last user leaves, and a shared block is taken once, "
                 "however many sequences hold it")
    to_oracle, to_mine = {}, {}
    for seq, table in oracle.tables.items():
        try:
            yours = list(mine.block_table(seq))
        except Exception as e:
            raise CheckFailed(f"{what}: block_table({seq}) raised {type(e).__name__}: {e}") from None
        require(len(yours) == len(table),
                f"{what}: sequence {seq} holds {len(oracle.tokens[seq])} tokens in {len(yours)} blocks; "
                f"blocks of {oracle.bs} hold them in {len(table)}.",
                hint="a sequence takes a new block only when its last one is full")
        for i, (a, b) in enumerate(zip(yours, table)):
            if to_oracle.setdefault(a, b) != b or to_mine.setdefault(b, a) != a:
                shared = to_oracle[a] != b
                require(False, f"{what}: block {i} of sequence {seq} is block {a} in your tables, which "
                        + ("another sequence holds with a different prefix: two sequences share a block only when "
                           "all their tokens up to its end are equal" if shared else
                           "should be the block that another sequence with the same prefix already holds"),
                        hint="a block's hash chains the hash of the block before it, so equal hashes mean equal "
                             "prefixes" if shared else "look the prompt's full blocks up by their chained hash, "
                                                      "from the first block on")
    require(len(to_mine) + mine.num_free() == oracle.free + len(to_oracle),
            f"{what}: {len(to_mine)} blocks are held and {mine.num_free()} free, but {len(to_mine) + mine.num_free()} "
            f"is not the {oracle.free + len(to_oracle)} blocks the oracle counts.",
            hint="a block is either free or held, never both, and none goes missing")


def _manager_story(cls):
    """The fixed cases, with block_size 4: sharing, the chained hash, the last token, freeing, no room."""
    bs = 4
    m, o = cls(12, bs), _Prefixes(12, bs)
    a = list(rng().integers(0, 50, 10))
    story = [("allocate", 0, a, "a 10-token prompt"),
             ("allocate", 1, a[:8] + [77, 78, 79], "a prompt that starts with the first 8 tokens of sequence 0"),
             ("allocate", 2, [99] + a[1:10], "a prompt equal to sequence 0's but for its first token"),
             ("allocate", 3, a[:8], "the first 8 tokens of sequence 0 as a whole prompt (its last token is "
                                    "always computed)"),
             ("free", 0, None, "sequence 0 leaves while sequences 1 and 3 share its first blocks"),
             ("allocate", 4, a[:9], "a prompt of sequence 0's first 9 tokens, after sequence 0 left"),
             ("append", 2, 5, "sequence 2 grows by one token, into its partly full last block"),
             ("append", 2, 6, "sequence 2 grows by one token, filling its last block"),
             ("append", 2, 7, "sequence 2 grows by one token: a new block"),
             ("allocate", 5, [99] + a[1:10] + [5, 6, 7, 8], "a prompt that starts with sequence 2's 12 tokens, "
                                                               "whose third block filled as it grew"),
             ("allocate", 6, list(rng().integers(100, 200, 30)), "a 30-token prompt: 8 blocks, more than are free"),
             ("free", 1, None, "sequence 1 leaves"), ("free", 3, None, "sequence 3 leaves"),
             ("free", 4, None, "sequence 4, the last user of sequence 0's first blocks, leaves"),
             ("allocate", 6, list(rng().integers(100, 200, 30)), "a 30-token prompt, once enough blocks are free")]
    for op, seq, arg, what in story:
        _step(m, o, op, seq, arg, f"after {what}")


def _step(m, o, op, seq, arg, what):
    if op == "allocate":
        arg = [int(t) for t in arg]
        got, expected = m.allocate(seq, list(arg)), o.allocate(seq, list(arg))
        require(got == expected, f"{what}: allocate returned {fmt(got)}, expected {fmt(expected)} "
                                 f"({'not enough free blocks' if expected is None else 'tokens already in the cache'}).",
                hint="with too few free blocks allocate changes nothing and returns None" if expected is None else
                "count the cached tokens of the leading full blocks found by their chained hash, and never share "
                "the block that holds the prompt's last token: its logits must be computed")
    elif op == "append":
        got, expected = m.append(seq, arg), o.append(seq, arg)
        require(bool(got) == expected, f"{what}: append returned {got}, expected {expected}.",
                hint="append takes a new block only when the last one is full, and returns False when none is free")
    else:
        m.free(seq)
        o.free_seq(seq)
    _compare_blocks(m, o, what)


def _manager_random(cls):
    """Random traffic on a small vocabulary, so prompts often share prefixes: allocate, append, free."""
    bs, n = int(rng().integers(2, 6)), int(rng().integers(10, 30))
    m, o = cls(n, bs), _Prefixes(n, bs)
    stems = [list(rng().integers(0, 3, 12)) for _ in range(3)]
    ids = itertools.count(100)
    for _ in range(80):
        live = list(o.tables)
        r = rng().random()
        if r < 0.4 or not live:
            tail = list(rng().integers(0, 3, int(rng().integers(0, 5))))
            prompt = stems[int(rng().integers(0, 3))][:int(rng().integers(1, 13))] + tail
            if prompt:
                _step(m, o, "allocate", next(ids), prompt, f"random traffic (block_size {bs}, {n} blocks), allocate")
        elif r < 0.8:
            _step(m, o, "append", live[int(rng().integers(0, len(live)))], int(rng().integers(0, 3)),
                  f"random traffic (block_size {bs}, {n} blocks), append")
        else:
            _step(m, o, "free", live[int(rng().integers(0, len(live)))], None,
                  f"random traffic (block_size {bs}, {n} blocks), free")


@exercise
def block_manager(your_BlockManager):
    """Your class against a manager that knows blocks by their whole prefix, op by op."""
    _manager_story(your_BlockManager)
    for _ in range(4):
        _manager_random(your_BlockManager)
    return "15 fixed steps (sharing, the chain, the last token, freeing, no room) and 4 x 80 random ones"


# ---- 2. paged attention -----------------------------------------------------------------------------


def _contiguous_attention(q, k_seq, v_seq, n, scale):
    """Attention of one query (H, d) on the first n keys (n, H, d) of its sequence, float64."""
    s = np.einsum("hd,phd->hp", q, k_seq[:n]) * scale
    w = np.exp(s - s.max(1, keepdims=True))
    return np.einsum("hp,phd->hd", w / w.sum(1, keepdims=True), v_seq[:n])


def _paged_case(lens, block_size, H, d, prefill, dtype=np.float64):
    """A ragged batch in a cache whose blocks are shuffled; every slot no sequence owns holds NaN."""
    need = [blocks_for(n, block_size) for n in lens]
    num_blocks = sum(need) + 3
    order = rng().permutation(num_blocks)
    k_cache = np.full((num_blocks, block_size, H, d), np.nan, dtype)
    v_cache = np.full((num_blocks, block_size, H, d), np.nan, dtype)
    keys, values, tables, start = [], [], [], 0
    for n, nb in zip(lens, need):
        table = order[start:start + nb]
        start += nb
        k, v = rng().uniform(-2, 2, (n, H, d)), rng().uniform(-2, 2, (n, H, d))
        for p in range(n):
            k_cache[table[p // block_size], p % block_size] = k[p]
            v_cache[table[p // block_size], p % block_size] = v[p]
        keys.append(k)
        values.append(v)
        tables.append(table)
    rows, ctx, owner = [], [], []
    for s, n in enumerate(lens):
        queries = range(max(1, n - 4), n + 1) if prefill else [n]     # a prefill's last few tokens, or one decode
        for c in queries:
            rows.append(tables[s])
            ctx.append(c)
            owner.append(s)
    width = max(need) + 1
    block_tables = np.full((len(rows), width), -1, np.int32)
    for i, t in enumerate(rows):
        block_tables[i, :len(t)] = t
    q = rng().uniform(-1, 1, (len(rows), H, d)).astype(dtype)
    return q, k_cache, v_cache, block_tables, np.array(ctx, np.int64), keys, values, owner


@exercise
def paged_attention(your_paged_attention):
    """Ragged batches in shuffled blocks against contiguous attention in float64, float32 too; then the memory
    one call allocates for a 6,000-token sequence."""
    cases = [([5, 1, 12], 4, 2, 3, False), ([7, 8, 9, 3], 3, 3, 5, True), ([13], 1, 1, 2, False),
             ([10, 4], 5, 2, 4, True)]
    for _ in range(2):
        S = int(rng().integers(2, 7))
        cases.append((list(rng().integers(1, 40, S)), int(rng().choice([3, 5, 7])), int(rng().integers(1, 4)),
                      int(rng().integers(2, 9)), bool(rng().integers(0, 2))))
    for lens, bs, H, d, prefill in cases:
        q, kc, vc, tables, ctx, keys, values, owner = _paged_case(lens, bs, H, d, prefill)
        scale = 1 / math.sqrt(d)
        out = np.full(q.shape, np.nan)
        your_paged_attention(q, kc, vc, tables, ctx, out, scale)
        expected = np.stack([_contiguous_attention(q[i], keys[s], values[s], c, scale)
                             for i, (s, c) in enumerate(zip(owner, ctx))])
        what = f"out for sequences of lengths {lens} in blocks of {bs} (H = {H}, d = {d}, " \
               f"{'several queries each, as in a prefill' if prefill else 'one query each'})"
        if np.isnan(out).any():
            first = tuple(int(i) for i in np.argwhere(np.isnan(out))[0])
            raise CheckFailed(f"{what}: NaN at index {first}. Every slot of the cache that no position of the "
                              f"sequence owns holds NaN, so a NaN means you read past context_lens[i] or through "
                              f"a wrong block, or never wrote out.",
                              hint="query i reads positions 0 .. context_lens[i] - 1; position p is in block "
                                   "table[p // block_size], at p % block_size")
        assert_close(out, expected, what=what, rtol=1e-9, atol=1e-11, mistakes={
            "scale the scores by `scale` before the softmax": np.stack(
                [_contiguous_attention(q[i], keys[s], values[s], c, 1.0) for i, (s, c) in enumerate(zip(owner, ctx))]),
            "query i sees context_lens[i] positions, the last one included": np.stack(
                [_contiguous_attention(q[i], keys[s], values[s], max(c - 1, 1), scale)
                 for i, (s, c) in enumerate(zip(owner, ctx))])})
    q, kc, vc, tables, ctx, keys, values, owner = _paged_case([23, 9], 5, 2, 4, False, np.float32)
    out = np.full(q.shape, np.nan, np.float32)
    your_paged_attention(q, kc, vc, tables, ctx, out, np.float32(0.5))
    expected = np.stack([_contiguous_attention(q[i].astype(float), keys[s], values[s], c, 0.5)
                         for i, (s, c) in enumerate(zip(owner, ctx))])
    require(out.dtype == np.float32, "float32 inputs must give float32 outputs")
    assert_close(out, expected, what="out in float32", rtol=0, atol=1e-4)
    _paged_memory(your_paged_attention)
    return f"{len(cases)} ragged batches (block sizes that divide no length, one-token blocks, prefill rows), float32, memory"


def _paged_memory(kernel):
    n, bs, H, d = 6000, 16, 2, 16
    q, kc, vc, tables, ctx, *_ = _paged_case([n, 7], bs, H, d, False)
    out = np.empty(q.shape)
    kernel(q, kc, vc, tables, ctx, out, 0.25)
    peak = peak_bytes(lambda: kernel(q, kc, vc, tables, ctx, out, 0.25), warm_up=False)
    one = n * H * d * 8
    require(peak < one // 8,
            f"your kernel allocated {peak / 1e6:.2f} MB at its peak for one call with a {n}-token sequence; its keys "
            f"alone are {one / 1e6:.2f} MB.",
            hint="paged attention reads each key and value where its block holds it, through the table, and folds "
                 "it into an online softmax (chapter 10): no copy of a sequence's keys, values or scores")


# ---- 3. the scheduler's step --------------------------------------------------------------------------


def _tiny_gpt(seed, vocab=23, n_layer=2, n_embd=16, n_head=2, block_size=64):
    from course_lib.gpt.model import GPT, GPTConfig

    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(vocab_size=vocab, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                        sdpa=False))      # attention written out: a second way, and quick at these sizes
    with torch.no_grad():
        for p in gpt.parameters():                 # larger weights than the initialization: varied argmaxes
            p.normal_(0, 0.5)
    return gpt.double().eval()


def _alone(gpt, prompt, n):
    """The oracle: chapter 04's GPT in PyTorch, float64, generating greedily for this request alone."""
    from course_lib.gpt.generate import generate

    return generate(gpt, torch.tensor([prompt]), n, temperature=0)[0, len(prompt):].tolist()


class _Watched:
    """The engine's step with your schedule, and every property a scheduler owes, checked around it."""

    def __init__(self, engine, your_schedule):
        self.engine, self.schedule, self.steps, self.preempted = engine, your_schedule, 0, 0

    def __call__(self, waiting, running, blocks, max_tokens):
        before = [s for s in running if not s.finished]
        outputs = {s.id: list(s.output) for s in list(waiting) + list(running)}
        finished = [s for s in running if s.finished]
        batch = self.schedule(waiting, running, blocks, max_tokens)
        self.steps += 1
        require(isinstance(batch, list), f"schedule must return the list of this step's sequences, got {fmt(batch)}")
        for s in finished:
            require(s not in running and s.id not in blocks.tables,
                    f"step {self.steps}: sequence {s.id} finished at the last step, but it is still "
                    + ("running" if s in running else "holding its blocks") + ".",
                    hint="retire the finished sequences first, at every step: out of `running`, and their blocks "
                         "freed, so that the next ones can use them at once")
        for s in batch:
            require(s in running and not s.finished, f"step {self.steps}: sequence {s.id} is in the batch but "
                    + ("finished" if s.finished else "not in `running`") + ".")
            require(s.id in blocks.tables and len(blocks.tokens[s.id]) == len(s),
                    f"step {self.steps}: sequence {s.id} runs with {len(s)} tokens, but the block manager holds "
                    f"{len(blocks.tokens.get(s.id, []))} of them.",
                    hint="before a decode, append the sequence's newest token to the block manager, so that its "
                         "key and value have a slot")
        preempted = [s for s in before if s not in running]
        self.preempted += len(preempted)
        if preempted:
            require(preempted == before[len(before) - len(preempted):],
                    f"step {self.steps}: you preempted sequences {[s.id for s in preempted]} of the running "
                    f"{[s.id for s in before]} (admission order).",
                    hint="when the cache is full, preempt the newest running sequence, the one that has done the "
                         "least work, and again the next newest if needed")
            require(list(waiting)[:len(preempted)] == preempted,
                    f"step {self.steps}: the preempted sequences {[s.id for s in preempted]} are not at the head "
                    f"of the waiting queue, oldest first: {[s.id for s in waiting]}.",
                    hint="a preempted sequence comes back before any newer request, or it could starve")
            for s in preempted:
                require(s.id not in blocks.tables and s.computed == 0,
                        f"step {self.steps}: preempted sequence {s.id} still "
                        + ("holds its blocks" if s.id in blocks.tables else f"counts {s.computed} computed tokens") + ".",
                        hint="preemption by recomputation frees every block of the sequence, and it will compute "
                             "all its tokens again")
            admitted = [s for s in batch if s not in before]
            require(not admitted, f"step {self.steps}: you preempted {[s.id for s in preempted]} and admitted "
                    f"{[s.id for s in admitted]} in the same step.",
                    hint="a step that had to preempt has no room to admit anyone")
        for s in list(waiting) + list(running):
            require(s.output == outputs.get(s.id, s.output),
                    f"step {self.steps}: sequence {s.id} had output {outputs[s.id]} and now has {s.output}.",
                    hint="recomputation keeps every generated token: a preempted sequence comes back with its "
                         "prompt and its output so far, and only their keys and values are computed again")
        computed = sum(len(s) - s.computed for s in batch)
        require(computed <= max_tokens, f"step {self.steps}: the batch computes {computed} tokens, more than "
                                        f"max_tokens = {max_tokens}.",
                hint="a new sequence costs its tokens less its cached ones; admit it only while the budget lasts")
        if waiting and not preempted and waiting[0] not in before:
            head = waiting[0]
            spare = max_tokens - computed
            fits = len(head.tokens) <= spare and blocks.num_free() >= blocks_for(len(head.tokens), blocks.block_size)
            require(not fits, f"step {self.steps}: sequence {head.id} waits, yet {blocks.num_free()} blocks are free "
                              f"and {spare} tokens of the step's budget are left for its {len(head.tokens)} tokens.",
                    hint="admit waiting sequences, first come first served, as long as their blocks fit and the "
                         "budget lasts, in the same step as the decodes")
        return batch


def _serve(your_schedule, gpt, requests, num_blocks, block_size, max_tokens, arrivals=None, max_steps=3000):
    from course_lib.serve.engine import Engine
    from course_lib.serve.model import PagedGPT

    model = PagedGPT.from_gpt(gpt, num_blocks, block_size, dtype=np.float64)
    engine = Engine(model, max_tokens=max_tokens)
    watched = _Watched(engine, your_schedule)
    engine.schedule = watched
    arrivals = arrivals or [0] * len(requests)
    seqs, step = [], 0
    while len(seqs) < len(requests) or engine.has_work():
        while len(seqs) < len(requests) and arrivals[len(seqs)] <= step:
            seqs.append(engine.add(*requests[len(seqs)]))
        engine.step()
        step += 1
        require(step < max_steps, f"after {max_steps} steps, requests {[s.id for s in seqs if not s.finished]} "
                                  f"are still not done (of {len(requests)}).",
                hint="every step must make progress: admit waiting requests when blocks are free, and preempt only "
                     "when a running sequence cannot get a block")
    engine.step()            # the last retirement
    return engine, seqs, watched


@exercise
def schedule(your_schedule):
    """Your step in the course's engine: mixed batches, a full cache (preemptions), shared prefixes; every
    request's greedy output against chapter 04's GPT run alone, float64."""
    gpt = _tiny_gpt(int(rng().integers(0, 1000)))
    # 1. a decode and a new prompt in one step
    engine, seqs, _ = _serve(your_schedule, gpt, [([1, 2, 3], 3), ([4, 5, 6, 7], 2)], 20, 4, 64, arrivals=[0, 1])
    require(any({s for s, _, kind in step if kind == "decode"} and {s for s, _, kind in step if kind == "prefill"}
                for step in engine.timeline),
            "a request that arrived while another was decoding waited for it to finish: no step ran a prefill "
            "and a decode together.", hint="admission happens at every step, beside the running sequences' decodes")
    # 2. a cache too small for everyone at once, prompts with a common start, and a small token budget
    stem = list(rng().integers(0, 23, 9))
    requests = []
    for i in range(9):
        prompt = (stem[:int(rng().integers(4, 10))] if i % 2 else []) + list(rng().integers(0, 23, int(rng().integers(2, 9))))
        requests.append((prompt, int(rng().integers(4, 18))))
    engine, seqs, watched = _serve(your_schedule, gpt, requests, 12, 3, 24,
                                   arrivals=sorted(int(a) for a in rng().integers(0, 12, 9)))
    for seq, (prompt, n) in zip(seqs, requests):
        assert_equal(seq.output, _alone(gpt, prompt, n), what=f"the output of request {seq.id} (prompt {prompt})",
                     hint="each request must give what it gives alone: a preempted one resumes from all its "
                          "tokens, and its keys and values are recomputed, not reused from freed blocks")
    require(engine.blocks.num_free() == 12, f"after every request finished, {12 - engine.blocks.num_free()} of 12 "
                                            f"blocks are still held.", hint="retire finished sequences, freeing their blocks")
    require(watched.preempted > 0, "the small cache never filled: no preemption happened, so nothing was tested there.")
    return f"2 traces, {len(requests) + 2} requests, preemptions included, every output equal to the request run alone"


# ---- 4. the acceptance rule ---------------------------------------------------------------------------


def _dist(v, rows):
    p = rng().dirichlet(np.full(v, 0.6), rows)
    return p


def _chi2_pvalue(counts, probs):
    from scipy.stats import chisquare

    keep = probs > 0
    if (counts[~keep] > 0).any():
        return 0.0
    expected = probs[keep] * counts.sum()
    return float(chisquare(counts[keep], expected).pvalue)


@exercise
def speculative_accept(your_accept):
    """Greedy cases (one-hot distributions), then 8,000 seeded draws on a 6-token vocabulary: every emitted
    token's distribution against the target's, by a chi-square test; then speculative decoding with your rule
    against the target alone, greedy."""
    V, k = 6, 3
    for agree in [0, k, 1] + [int(a) for a in rng().integers(0, k + 1, 3)]:     # greedy: p and q one-hot
        tp, tq = [int(t) for t in rng().integers(0, V, k + 1)], [int(t) for t in rng().integers(0, V, k)]
        tq[:agree] = tp[:agree]
        if agree < k and tq[agree] == tp[agree]:
            tq[agree] = (tp[agree] + 1) % V            # the first disagreement, where it was meant
        p, q = np.eye(V)[tp], np.eye(V)[tq]
        got = your_accept(p, q, np.array(tq), np.random.default_rng(int(rng().integers(1 << 30))))
        first_miss = next((i for i in range(k) if tq[i] != tp[i]), k)
        expected = [int(t) for t in tp[:first_miss + 1]]
        assert_equal([int(t) for t in got], expected,
                     what=f"the emitted tokens for greedy drafts {tq} and target argmaxes {tp}",
                     hint="keep drafts while they equal the target's choice; at the first one that differs emit the "
                          "target's token and stop; if all are kept, add the target's next token")
    p, q = _dist(V, k + 1), _dist(V, k)
    q[0, np.argmax(p[0])] = 0.0                       # the draft never proposes the target's favourite here
    q[0] /= q[0].sum()
    draws = np.random.default_rng(int(rng().integers(1 << 30)))
    counts, lengths = np.zeros((k + 1, V)), np.zeros(k + 2)
    n = 8000
    cumulative = q.cumsum(1)
    all_drafts = np.minimum((draws.random((n, k, 1)) > cumulative[None]).sum(2), V - 1)   # each row from q_i
    for drafted in all_drafts:
        out = your_accept(p, q, drafted.copy(), draws)
        require(1 <= len(out) <= k + 1, f"your rule emitted {len(out)} tokens for {k} drafts; it emits between "
                                        f"1 and {k + 1}.", hint="the kept drafts, then exactly one more token")
        for j, t in enumerate(out):
            counts[j, int(t)] += 1
        lengths[len(out)] += 1
    kept = np.minimum(p[:k], q).sum(1)                # the chance that draft i is kept, given the ones before
    expected_lengths = np.array([0.0] + [np.prod(kept[:j]) * (1 - kept[j]) for j in range(k)] + [np.prod(kept)])
    pv = _chi2_pvalue(lengths, expected_lengths)
    require(pv > 1e-6, f"the number of tokens your rule emits per call does not follow the acceptance rule: "
                       f"{fmt(lengths[1:] / n, 3)} of the calls emitted 1 .. {k + 1} tokens, where "
                       f"{fmt(expected_lengths[1:], 3)} is expected (chi-square p-value {pv:.1e} over {n} calls).",
            hint="draft i is kept with probability min(1, p_i(x) / q_i(x)); the first rejection ends the call with one "
                 "token from the leftover; after k kept drafts one more token comes from p_k")
    for j in range(k + 1):
        pv = _chi2_pvalue(counts[j], p[j])
        require(pv > 1e-6, f"the {j + 1}th emitted token does not follow the target's distribution p_{j}: its "
                           f"frequencies {fmt(counts[j] / counts[j].sum(), 3)}, the target's {fmt(p[j], 3)} "
                           f"(chi-square p-value {pv:.1e} over {int(counts[j].sum())} draws).",
                hint="keep a draft with probability min(1, p/q); after a rejection sample from the leftover "
                     "max(p - q, 0), normalized, not from p or q; after k kept drafts sample one token from p_k")
    # greedy speculative decoding through the course's loop equals the target alone
    from course_lib.serve.model import PagedGPT
    from course_lib.serve.speculative import plain_generate, speculative_generate

    target = PagedGPT.from_gpt(_tiny_gpt(int(rng().integers(1000))), 8, 8, np.float64)
    draft = PagedGPT.from_gpt(_tiny_gpt(int(rng().integers(1000)), n_layer=1, n_embd=8), 8, 8, np.float64)
    prompt = [int(t) for t in rng().integers(0, 23, 5)]
    alone = plain_generate(target, prompt, 30)
    spec, stats = speculative_generate(target, draft, prompt, 30, 4, your_accept)
    assert_equal(spec, alone, what="greedy speculative decoding with your rule, 30 tokens",
                 hint="greedy decoding is the one-hot case: the output must be the target's own")
    return f"6 greedy cases, {n} draws of {k} drafts (every emitted position tested), and a greedy decode"


# ---- 5. weight-only int8 ---------------------------------------------------------------------------


def _int8_loss(quantize, matmul):
    """Validation loss of the chapter's small target GPT, float32 and with int8 weights on your pieces."""
    from course_lib.serve.model import PagedGPT
    from course_lib.serve.models import load_pair
    from course_lib.serve.speculative import Contiguous

    pair = load_pair()
    model = PagedGPT.from_gpt(pair.target, 32, 16)
    val = pair.val.numpy()

    def loss(m):
        run, total = Contiguous(m), 0.0
        for start in (0, 9000, 18000, 27000):
            w = val[start:start + 257]
            logits = run(w[:-1], 0).astype(np.float64)
            logits -= logits.max(1, keepdims=True)
            total -= (logits[np.arange(256), w[1:]] - np.log(np.exp(logits).sum(1))).sum()
        return total / (4 * 256)

    return loss(model), loss(model.quantized(quantize, matmul)), model


@exercise
def int8_linear(your_quantize, your_int8_matmul):
    """quantize: per-channel error bounds, int8 and the bytes; int8_matmul against numpy float64 on the
    dequantized weights, and the memory it allocates; both in the chapter's GPT: validation loss within 1%."""
    shapes = [(5, 7), (1, 3), (33, 130), (64, 200)] + [tuple(int(s) for s in rng().integers(1, 90, 2)) for _ in range(2)]
    for out_f, in_f in shapes:
        w = rng().normal(0, 0.1, (out_f, in_f)).astype(np.float32)
        w[0, 0] = 3.0                                  # one large weight: its row's scale is large
        if out_f > 2:
            w[2] = 0.0                                 # an all-zero row
        q, s = your_quantize(w)
        q, s = np.asarray(q), np.asarray(s)
        require(q.dtype == np.int8 and q.shape == w.shape, f"quantize must return int8 weights of shape {w.shape}; "
                                                           f"got {q.dtype} {q.shape}")
        require(s.shape == (out_f,) and s.dtype == np.float32,
                f"quantize must return one float32 scale per output channel, shape ({out_f},); got {s.dtype} {s.shape}",
                hint="per output channel: one scale per row of the (out, in) weight")
        err = np.abs(w.astype(np.float64) - q * s[:, None].astype(np.float64))
        bound = s[:, None] / 2 * (1 + 1e-5) + 1e-12
        bad = np.argwhere(err > bound)
        if len(bad):
            i, j = bad[0]
            require(False, f"quantize, weight ({out_f}, {in_f}): w[{i}, {j}] = {w[i, j]:.6g} comes back as "
                           f"{q[i, j]} * {s[i]:.6g} = {q[i, j] * s[i]:.6g}, off by {err[i, j]:.3g}, more than half "
                           f"a step ({s[i] / 2:.3g}).",
                    hint="round to the nearest integer (truncation loses up to a whole step), and choose each row's "
                         "scale so that its largest |w| maps to 127")
        nonzero = np.abs(w).max(1) > 0
        require((np.abs(q[nonzero]).max(1) == 127).all(),
                "quantize: some row's largest |q| is not 127, so that row uses fewer than the 255 levels int8 has.",
                hint="give each row its own scale, from its own largest |w|: one scale for the whole matrix "
                     "leaves the rows of small weights a few levels")
    w = rng().normal(0, 0.05, (96, 128)).astype(np.float32)
    q, s = your_quantize(w)
    ratio = (np.asarray(q).nbytes + np.asarray(s).nbytes) / w.nbytes
    require(ratio <= 0.27, f"a (96, 128) weight takes {ratio:.1%} of its float32 bytes once quantized; at most 27%.")
    for n, k, m in [(1, 7, 5), (3, 130, 33), (1, 64, 200), (5, 9, 1), (int(rng().integers(1, 9)), 77, 41)]:
        x = rng().normal(0, 1, (n, k)).astype(np.float32)
        wq = rng().integers(-127, 128, (m, k)).astype(np.int8)
        sc = rng().uniform(0.001, 0.05, m).astype(np.float32)
        out = np.full((n, m), np.nan, np.float32)
        your_int8_matmul(x, wq, sc, out)
        expected = x.astype(np.float64) @ (wq * sc[:, None].astype(np.float64)).T
        mag = np.abs(x).astype(np.float64) @ (np.abs(wq) * sc[:, None]).T.astype(np.float64) + 1e-6
        assert_close(out / mag, expected / mag, what=f"int8_matmul of x ({n}, {k}) by int8 weights ({m}, {k}), "
                     "relative to the size of each sum", rtol=1e-5, atol=1e-5, mistakes={
                         "multiply each output channel j by scale[j], once": (x @ wq.T.astype(np.float64)) / mag,
                         "the weight is (out, in): out = x @ dequantized.T": np.zeros_like(expected)})
    _int8_memory(your_int8_matmul)
    float_loss, int8_loss, _ = _int8_loss(your_quantize, your_int8_matmul)
    require(abs(int8_loss - float_loss) <= 0.01 * float_loss,
            f"the chapter's GPT with your int8 weights has validation loss {int8_loss:.4f}, against {float_loss:.4f} "
            f"in float32: {abs(int8_loss / float_loss - 1):.2%} apart, more than 1%.")
    return "6 weights (a zero row, an outlier), 5 products, memory, and the GPT's validation loss within 1%"


def _int8_memory(kernel):
    m, k = 512, 1024
    x = rng().normal(0, 1, (1, k)).astype(np.float32)
    wq = rng().integers(-127, 128, (m, k)).astype(np.int8)
    sc = rng().uniform(0.001, 0.05, m).astype(np.float32)
    out = np.empty((1, m), np.float32)
    kernel(x, wq, sc, out)
    peak = peak_bytes(lambda: kernel(x, wq, sc, out), warm_up=False)
    require(peak < m * k * 4 // 8,
            f"your int8_matmul allocated {peak / 1e6:.2f} MB at its peak for a ({m}, {k}) weight, whose float32 copy "
            f"would be {m * k * 4 / 1e6:.2f} MB (its int8 form {m * k / 1e6:.2f} MB).",
            hint="dequantize each weight as the loop reads it, and apply the row's scale to the sum: a float copy of "
                 "the matrix gives back the bytes int8 saved")

