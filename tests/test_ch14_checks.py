"""Chapter 14's checks pass on the course's pieces and on correct ones written another way, and reject the
usual mistakes, including pieces whose numbers are right but which break what the chapter teaches: a
block manager that frees a shared block under its other users, paged attention that gathers a sequence's
cache into one array, a scheduler that preempts the oldest request or throws away its output (greedy
recomputation gives the same tokens back), an int8 product that makes the float32 matrix.
"""

import collections
import hashlib
import math

import numba
import numpy as np
import pytest
from checking import expect_failure, expect_pass

from course_lib.checks import ch14 as check
from course_lib.serve import acceptance, int8, scheduler
from course_lib.serve.blocks import BlockManager
from course_lib.serve.paged_attention import paged_attention
from course_lib.serve.sequence import blocks_for


def _stub(*args, **kwargs):
    raise NotImplementedError


# ---- 1. the block manager -------------------------------------------------------------------------------

class PrefixDigests:
    """Correct, written another way: a block is known by a sha256 chain of its tokens, blocks are handed out
    from the highest number down, and sharing counts users in a Counter."""

    def __init__(self, num_blocks, block_size):
        self.bs, self.pool = block_size, list(range(num_blocks))
        self.users, self.known, self.digest = collections.Counter(), {}, {}
        self.tables, self.held = {}, {}

    def num_free(self):
        return len(self.pool)

    def block_table(self, seq_id):
        return list(self.tables[seq_id])

    def _digest(self, previous, tokens):
        return hashlib.sha256(f"{previous}|{list(tokens)}".encode()).hexdigest()

    def _note_full(self, seq_id, i):
        prev = self.digest[self.tables[seq_id][i - 1]] if i else ""
        d = self._digest(prev, self.held[seq_id][i * self.bs:(i + 1) * self.bs])
        self.digest[self.tables[seq_id][i]] = d
        if d not in self.known:
            self.known[d] = self.tables[seq_id][i]

    def allocate(self, seq_id, tokens):
        found, prev = [], ""
        while len(found) < (len(tokens) - 1) // self.bs:
            i = len(found)
            prev = self._digest(prev, tokens[i * self.bs:(i + 1) * self.bs])
            if prev not in self.known:
                break
            found.append(self.known[prev])
        fresh = blocks_for(len(tokens), self.bs) - len(found)
        if fresh > len(self.pool):
            return None
        new = [self.pool.pop() for _ in range(fresh)]
        self.users.update(found + new)
        self.tables[seq_id], self.held[seq_id] = found + new, list(tokens)
        for i in range(len(found), len(tokens) // self.bs):
            self._note_full(seq_id, i)
        return len(found) * self.bs

    def append(self, seq_id, token):
        if len(self.held[seq_id]) % self.bs == 0:
            if not self.pool:
                return False
            self.tables[seq_id].append(self.pool.pop())
            self.users[self.tables[seq_id][-1]] += 1
        self.held[seq_id].append(token)
        if len(self.held[seq_id]) % self.bs == 0:
            self._note_full(seq_id, len(self.tables[seq_id]) - 1)
        return True

    def free(self, seq_id):
        for block in self.tables.pop(seq_id):
            self.users[block] -= 1
            if not self.users[block]:
                d = self.digest.pop(block, None)
                if self.known.get(d) == block:
                    del self.known[d]
                self.pool.insert(0, block)
        del self.held[seq_id]


class FreesSharedBlocks(BlockManager):
    """Right tables and cached counts, but a block goes back to the pool with its first leaver."""

    def free(self, seq_id):
        for block in self.tables.pop(seq_id):
            if block not in self.free_blocks:
                self.free_blocks.append(block)
                self.users[block] = 0
                h = self.hash_of.pop(block, None)
                self.block_of.pop(h, None)
        del self.tokens[seq_id]


class UnchainedHash(BlockManager):
    """Each block hashed on its own tokens: equal blocks after different starts are shared too."""

    def _hash(self, seq_id, i):
        return hash(tuple(self.tokens[seq_id][i * self.block_size:(i + 1) * self.block_size]))

    def allocate(self, seq_id, tokens):
        bs = self.block_size
        hits = []
        for i in range((len(tokens) - 1) // bs):
            h = hash(tuple(tokens[i * bs:(i + 1) * bs]))
            if h not in self.block_of:
                break
            hits.append(self.block_of[h])
        if blocks_for(len(tokens), bs) - len(hits) > len(self.free_blocks):
            return None
        for block in hits:
            self.users[block] += 1
        table = hits + [self.free_blocks.pop() for _ in range(blocks_for(len(tokens), bs) - len(hits))]
        for block in table[len(hits):]:
            self.users[block] = 1
        self.tables[seq_id], self.tokens[seq_id] = table, list(tokens)
        for i in range(len(hits), len(tokens) // bs):
            self._register(seq_id, i)
        return len(hits) * bs


class SharesTheLastToken(BlockManager):
    """Shares every full block of the prompt, the one holding its last token too."""

    def allocate(self, seq_id, tokens):
        bs = self.block_size
        hits, previous = [], None
        for i in range(len(tokens) // bs):
            h = hash((previous, tuple(tokens[i * bs:(i + 1) * bs])))
            if h not in self.block_of:
                break
            hits.append(self.block_of[h])
            previous = h
        if blocks_for(len(tokens), bs) - len(hits) > len(self.free_blocks):
            return None
        for block in hits:
            self.users[block] += 1
        table = hits + [self.free_blocks.pop() for _ in range(blocks_for(len(tokens), bs) - len(hits))]
        for block in table[len(hits):]:
            self.users[block] = 1
        self.tables[seq_id], self.tokens[seq_id] = table, list(tokens)
        for i in range(len(hits), len(tokens) // bs):
            self._register(seq_id, i)
        return len(hits) * bs


class NeverShares(BlockManager):
    def allocate(self, seq_id, tokens):
        if blocks_for(len(tokens), self.block_size) > len(self.free_blocks):
            return None
        self.tables[seq_id] = [self.free_blocks.pop() for _ in range(blocks_for(len(tokens), self.block_size))]
        for block in self.tables[seq_id]:
            self.users[block] = 1
        self.tokens[seq_id] = list(tokens)
        return 0


class TakesBlocksBeforeCounting(BlockManager):
    """Takes the blocks one by one and runs out half way: the blocks it took stay taken."""

    def allocate(self, seq_id, tokens):
        need = blocks_for(len(tokens), self.block_size)
        taken = []
        for _ in range(need):
            if not self.free_blocks:
                return None
            taken.append(self.free_blocks.pop())
        self.free_blocks.extend(reversed(taken))
        return super().allocate(seq_id, tokens)


def test_block_manager():
    expect_pass(check.block_manager, BlockManager)
    expect_pass(check.block_manager, PrefixDigests)
    expect_failure(check.block_manager, _stub, match="not implemented yet")
    expect_failure(check.block_manager, FreesSharedBlocks, match="last user leaves")
    expect_failure(check.block_manager, UnchainedHash, match="equal hashes mean equal prefixes")
    expect_failure(check.block_manager, SharesTheLastToken, match="last token")
    expect_failure(check.block_manager, NeverShares, match="chained hash")
    expect_failure(check.block_manager, TakesBlocksBeforeCounting, match="allocate returned None")


# ---- 2. paged attention ------------------------------------------------------------------------------------

def paged_by_blocks(q, k_cache, v_cache, block_tables, context_lens, out, scale):
    """Correct, written another way: numpy, one block of keys at a time (its scores as a small matrix), merged
    into a running max and sum; never more than one block of a sequence at once."""
    bs = k_cache.shape[1]
    for i in range(q.shape[0]):
        n = context_lens[i]
        m = np.full(q.shape[1], -np.inf)
        l, acc = np.zeros(q.shape[1]), np.zeros(q.shape[1:])
        for b in range(blocks_for(n, bs)):
            used = min(bs, n - b * bs)
            k, v = k_cache[block_tables[i, b], :used], v_cache[block_tables[i, b], :used]   # (used, H, d)
            s = np.einsum("hd,phd->hp", q[i], k) * scale
            m_new = np.maximum(m, s.max(1))
            w = np.exp(s - m_new[:, None])
            l = l * np.exp(m - m_new) + w.sum(1)
            acc = acc * np.exp(m - m_new)[:, None] + np.einsum("hp,phd->hd", w, v)
            m = m_new
        out[i] = acc / l[:, None]


def gathers_the_cache(q, k_cache, v_cache, block_tables, context_lens, out, scale, shift=0, use_scale=True):
    """The right numbers (shift=0, use_scale) through a copy of each sequence's keys and values."""
    bs, (N, H, d) = k_cache.shape[1], q.shape
    for i in range(N):
        n = max(context_lens[i] + shift, 1)
        table = block_tables[i, :blocks_for(n, bs)]
        k = k_cache[table].reshape(-1, H, d)[:n]
        v = v_cache[table].reshape(-1, H, d)[:n]
        s = np.einsum("hd,phd->hp", q[i], k) * (scale if use_scale else 1.0)
        w = np.exp(s - s.max(1, keepdims=True))
        out[i] = np.einsum("hp,phd->hd", w / w.sum(1, keepdims=True), v)


@numba.njit(cache=True)
def two_passes(q, k_cache, v_cache, block_tables, context_lens, out, scale):
    """Correct, written another way: Numba, no prange, the max in a first pass and the sums in a second."""
    N, H, d = q.shape
    bs = k_cache.shape[1]
    for i in range(N):
        for h in range(H):
            top = -np.inf
            for p in range(context_lens[i]):
                s = 0.0
                for c in range(d):
                    s += q[i, h, c] * k_cache[block_tables[i, p // bs], p % bs, h, c]
                top = max(top, s * scale)
            total = 0.0
            for c in range(d):
                out[i, h, c] = 0.0
            for p in range(context_lens[i]):
                b, o = block_tables[i, p // bs], p % bs
                s = 0.0
                for c in range(d):
                    s += q[i, h, c] * k_cache[b, o, h, c]
                w = math.exp(s * scale - top)
                total += w
                for c in range(d):
                    out[i, h, c] += w * v_cache[b, o, h, c]
            for c in range(d):
                out[i, h, c] /= total


def test_paged_attention():
    expect_pass(check.paged_attention, paged_attention)
    expect_pass(check.paged_attention, paged_by_blocks)
    expect_pass(check.paged_attention, two_passes)
    expect_failure(check.paged_attention, _stub, match="not implemented yet")
    expect_failure(check.paged_attention, gathers_the_cache, match="its keys alone are")
    expect_failure(check.paged_attention, lambda *a: gathers_the_cache(*a, use_scale=False), match="scale the scores")
    expect_failure(check.paged_attention, lambda *a: gathers_the_cache(*a, shift=-1), match="the last one included")


# ---- 3. the scheduler ---------------------------------------------------------------------------------------

def schedule_differently(waiting, running, blocks, max_tokens):
    """Correct, written another way: count what the running need first, preempt from the back until it fits,
    then give the slots; admission with an explicit budget of computed tokens."""
    running[:] = [s for s in running if not (s.finished and blocks.free(s.id) is None)]
    victims = []
    while running:
        need = sum(1 for s in running if len(blocks.block_table(s.id)) * blocks.block_size == len(blocks.tokens[s.id]))
        if need <= blocks.num_free():
            break
        victim = running.pop()
        blocks.free(victim.id)
        victim.computed = 0
        victims.append(victim)
    waiting.extendleft(victims)        # extendleft reverses: the oldest victim ends up first
    for s in running:
        assert blocks.append(s.id, s.tokens[-1])
    batch = list(running)
    if victims:
        return batch
    spent = len(batch)
    while waiting:
        head = waiting[0]
        if spent + len(head.tokens) > max_tokens:
            break
        got = blocks.allocate(head.id, head.tokens)
        if got is None:
            break
        head.computed = got
        spent += len(head.tokens) - got
        running.append(waiting.popleft())
        batch.append(head)
    return batch


def preempts_the_oldest(waiting, running, blocks, max_tokens):
    """The right outputs (greedy recomputation gives the same tokens back), the wrong victim."""
    for seq in [s for s in running if s.finished]:
        blocks.free(seq.id)
        running.remove(seq)
    batch, preempted = [], False
    for seq in list(running):
        if seq not in running:
            continue
        while not blocks.append(seq.id, seq.tokens[-1]):
            oldest = running.pop(0)
            if oldest in batch:
                batch.remove(oldest)
            blocks.free(oldest.id)
            oldest.computed = 0
            waiting.appendleft(oldest)
            preempted = True
            if oldest is seq:
                break
        else:
            batch.append(seq)
    if not preempted:
        budget = max_tokens - len(batch)
        while waiting and len(waiting[0].tokens) <= budget:
            cached = blocks.allocate(waiting[0].id, waiting[0].tokens)
            if cached is None:
                break
            seq = waiting.popleft()
            seq.computed = cached
            running.append(seq)
            batch.append(seq)
            budget -= len(seq.tokens) - cached
    return batch


def forgets_the_output(waiting, running, blocks, max_tokens):
    """The right outputs too (greedy regenerates them), but a preempted sequence restarts from its prompt."""
    before = [s for s in running if not s.finished]
    batch = scheduler.schedule(waiting, running, blocks, max_tokens)
    for s in before:
        if s in waiting:
            s.output.clear()
    return batch


def never_retires(waiting, running, blocks, max_tokens):
    finished = [s for s in running if s.finished]
    running[:] = [s for s in running if not s.finished]
    batch = scheduler.schedule(waiting, running, blocks, max_tokens)
    running[:0] = finished
    return batch


def static_admission(waiting, running, blocks, max_tokens):
    """Admits only when nothing runs: no prefill beside a decode."""
    if any(not s.finished for s in running):
        return scheduler.schedule(collections.deque(), running, blocks, max_tokens)
    return scheduler.schedule(waiting, running, blocks, max_tokens)


def keeps_computed(waiting, running, blocks, max_tokens):
    """Preempts the newest, but leaves its computed count: it would skip tokens whose blocks are gone."""
    computed = {s.id: s.computed for s in running}
    batch = scheduler.schedule(waiting, running, blocks, max_tokens)
    for s in waiting:
        if s.id in computed:
            s.computed = computed[s.id]
    return batch


def test_schedule():
    expect_pass(check.schedule, scheduler.schedule)
    expect_pass(check.schedule, schedule_differently)
    expect_failure(check.schedule, _stub, match="not implemented yet")
    expect_failure(check.schedule, preempts_the_oldest, match="preempt the newest")
    expect_failure(check.schedule, forgets_the_output, match="keeps every generated token")
    expect_failure(check.schedule, never_retires, match="retire the finished")
    expect_failure(check.schedule, static_admission, match="in the same step as the decodes")
    expect_failure(check.schedule, keeps_computed, match="compute all its tokens again")


# ---- 4. the acceptance rule ------------------------------------------------------------------------------

def accept_by_ratio(p, q, drafted, rng):
    """Correct, written another way: the ratio itself, and the leftover sampled by its cumulative sum."""
    for i, x in enumerate(drafted):
        if rng.uniform() < min(1.0, p[i, x] / q[i, x]):
            continue
        left = np.clip(p[i] - q[i], 0, None)
        pick = int(np.searchsorted(np.cumsum(left / left.sum()), rng.uniform(), side="right"))
        return [int(t) for t in drafted[:i]] + [min(pick, len(left) - 1)]
    pick = int(np.searchsorted(np.cumsum(p[-1]), rng.uniform(), side="right"))
    return [int(t) for t in drafted] + [min(pick, p.shape[1] - 1)]


def rule(p, q, drafted, rng, ratio="p/q", resample="leftover", bonus=True):
    out = []
    for i, x in enumerate(drafted):
        keep = {"p/q": p[i, x] / q[i, x], "q/p": q[i, x] / max(p[i, x], 1e-300), "always": 1.0}[ratio]
        if rng.random() < keep:
            out.append(int(x))
            continue
        dist = {"leftover": np.maximum(p[i] - q[i], 0), "p": p[i], "q": q[i]}[resample]
        out.append(int(rng.choice(len(dist), p=dist / dist.sum())))
        return out
    if bonus:
        out.append(int(rng.choice(p.shape[1], p=p[-1])))
    return out


def test_speculative_accept():
    expect_pass(check.speculative_accept, acceptance.accept)
    expect_pass(check.speculative_accept, accept_by_ratio)
    expect_failure(check.speculative_accept, _stub, match="not implemented yet")
    expect_failure(check.speculative_accept, lambda *a: rule(*a, ratio="q/p"))
    expect_failure(check.speculative_accept, lambda *a: rule(*a, resample="p"), match="does not follow the target")
    expect_failure(check.speculative_accept, lambda *a: rule(*a, resample="q"))
    expect_failure(check.speculative_accept, lambda *a: rule(*a, ratio="always"), match="greedy drafts")
    expect_failure(check.speculative_accept, lambda *a: rule(*a, bonus=False), match="add the target's next token")


# ---- 5. int8 -------------------------------------------------------------------------------------------------

def quantize_differently(w):
    """Correct, written another way: the steps of each row, and rounding half away from zero."""
    step = (np.max(np.abs(w), axis=1, keepdims=True) / 127).astype(np.float32)
    step[step == 0] = 1
    q = np.sign(w) * np.floor(np.abs(w) / step + 0.5)
    return q.astype(np.int8), step[:, 0]


def matmul_in_slices(x, q, scale, out):
    """Correct, written another way: numpy, 8 output channels at a time (a small float copy of 8 rows)."""
    for j in range(0, q.shape[0], 8):
        out[:, j:j + 8] = (x @ q[j:j + 8].T.astype(np.float32)) * scale[j:j + 8]


def matmul_dequantized(x, q, scale, out):
    """The right numbers, and the float32 matrix int8 was meant to avoid."""
    out[:] = x @ (q.astype(np.float32) * scale[:, None]).T


def per_tensor(w):
    s = np.float32(np.abs(w).max() / 127)
    return np.clip(np.rint(w / s), -127, 127).astype(np.int8), np.full(w.shape[0], s, np.float32)


def truncating(w):
    q, s = int8.quantize(w)
    return (w / s[:, None]).astype(np.int8), s


def test_int8_linear():
    expect_pass(check.int8_linear, int8.quantize, int8.int8_matmul)
    expect_pass(check.int8_linear, quantize_differently, matmul_in_slices)
    expect_failure(check.int8_linear, _stub, int8.int8_matmul, match="not implemented yet")
    expect_failure(check.int8_linear, int8.quantize, matmul_dequantized, match="whose float32 copy")
    expect_failure(check.int8_linear, per_tensor, int8.int8_matmul, match="each row its own scale")
    expect_failure(check.int8_linear, truncating, int8.int8_matmul, match="round to the nearest")
    expect_failure(check.int8_linear, lambda w: (int8.quantize(w)[0], int8.quantize(w)[1].astype(np.float64)),
                   int8.int8_matmul, match="one float32 scale per output channel")
    expect_failure(check.int8_linear, int8.quantize, lambda x, q, s, out: matmul_in_slices(x, q, np.ones_like(s), out),
                   match="scale[j], once")


@pytest.mark.parametrize("seed", [1, 2])
def test_the_oracle_of_the_block_manager_agrees_with_the_course(seed, monkeypatch):
    monkeypatch.setenv("COURSE_CHECK_SEED", str(seed))
    expect_pass(check.block_manager, BlockManager)
