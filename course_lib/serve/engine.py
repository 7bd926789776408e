"""The engine: a queue of requests, a scheduler, a block manager and a paged model, one step at a time.

    engine = Engine(model)                          # model: a PagedGPT
    seq = engine.add(prompt_ids, max_tokens=32)     # greedy unless temperature > 0
    while engine.has_work():
        for seq, token in engine.step():            # every sequence of the step gives one token
            ...

Each step: the scheduler picks the batch (serve/scheduler.py), the model runs every picked sequence's
uncomputed tokens in one flat batch (serve/model.py), and each sequence samples one token from the logits
of its last position. `timeline` keeps, per step, who ran and how many tokens each computed: the
batch-slot picture of the lesson and the chapter's closing cells is drawn from it.

The scheduler and the block manager are passed in (`schedule=`, `block_manager=`), so the engine runs the
course's or yours. `Engine.static(model, batch_size)` is static batching on the same model and cache, for
comparison: a batch is admitted whole when the last one is done, and its finished sequences wait idle.
"""

import collections
import time

import numpy as np

from course_lib.serve.model import batch_inputs
from course_lib.serve.sequence import Sequence, blocks_for


def softmax(logits, temperature):
    z = logits.astype(np.float64) / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def sample(logits, seq):
    """Greedy (temperature 0) or sampled with a generator seeded by the request and its position, so that
    a sequence samples the same token whatever batch it runs in."""
    if seq.temperature == 0:
        return int(np.argmax(logits))
    rng = np.random.default_rng([seq.seed, len(seq)])
    return int(rng.choice(len(logits), p=softmax(logits, seq.temperature)))


class Unshared:
    """A block manager seen through a veil: every token is tagged with its sequence, so no two sequences'
    blocks ever hash alike and nothing is shared. The engine's `prefix_sharing=False`."""

    def __init__(self, blocks):
        self.blocks = blocks

    def allocate(self, seq_id, tokens):
        return self.blocks.allocate(seq_id, [(seq_id, t) for t in tokens])

    def append(self, seq_id, token):
        return self.blocks.append(seq_id, (seq_id, token))

    def __getattr__(self, name):
        return getattr(self.blocks, name)


def static_schedule(batch_size):
    """Static batching as a schedule: admit up to batch_size waiting sequences when nothing runs (their
    whole length reserved at once), and keep the batch until every one of them is done."""

    def schedule(waiting, running, blocks, max_tokens):
        if running and all(s.finished for s in running):
            for seq in running:
                blocks.free(seq.id)
            running.clear()
        if not running:
            while waiting and len(running) < batch_size:
                seq = waiting[0]
                if blocks.num_free() < blocks_for(len(seq.prompt) + seq.max_tokens, blocks.block_size):
                    break
                seq.computed = blocks.allocate(seq.id, seq.tokens)
                waiting.popleft()
                running.append(seq)
            return list(running)
        batch = [s for s in running if not s.finished]
        for seq in batch:
            if not blocks.append(seq.id, seq.tokens[-1]):
                raise RuntimeError("static batching reserved too little")
        return batch

    return schedule


class Engine:
    KEEP = 100_000     # the most steps (and finished sequences) a long-running engine remembers

    def __init__(self, model, schedule=None, block_manager=None, max_tokens=None, prefix_sharing=True,
                 clock=time.perf_counter):
        if schedule is None:
            from course_lib.serve.scheduler import schedule
        if block_manager is None:
            from course_lib.serve.blocks import BlockManager as block_manager
        self.model, self.schedule, self.clock = model, schedule, clock
        self.blocks = block_manager(model.num_blocks, model.block_size)
        if not prefix_sharing:
            self.blocks = Unshared(self.blocks)
        self.max_context = model.config.block_size
        self.max_tokens = max_tokens or 2 * self.max_context   # tokens per step
        self.waiting, self.running = collections.deque(), []
        self.ids = 0
        self.timeline = []            # per step: [(seq id, tokens computed, "prefill" or "decode")]
        self.prefill_tokens = 0       # prompt tokens computed (cached ones are not)
        self.peak = {"blocks": 0}     # the cache when most blocks were held: see `step`
        self.finished = []

    @classmethod
    def static(cls, model, batch_size, **kwargs):
        return cls(model, schedule=static_schedule(batch_size), **kwargs)

    def add(self, prompt, max_tokens, temperature=0.0, seed=0, arrival=None):
        """Queue a request; returns its Sequence. A request longer than the model's context, or one that
        could not fit in the whole cache alone, is refused with a ValueError."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("the prompt is empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if len(prompt) + max_tokens > self.max_context:
            raise ValueError(f"the prompt ({len(prompt)} tokens) and max_tokens ({max_tokens}) exceed the "
                             f"model's context of {self.max_context} tokens")
        if blocks_for(len(prompt) + max_tokens, self.model.block_size) > self.model.num_blocks:
            raise ValueError("the request needs more blocks than the whole cache holds")
        seq = Sequence(self.ids, prompt, max_tokens, temperature=temperature, seed=seed,
                       arrival=self.clock() if arrival is None else arrival)
        self.ids += 1
        self.waiting.append(seq)
        return seq

    def cancel(self, seq):
        """The client went away: a waiting request leaves now, a running one at the next step (its blocks
        are freed then, by the scheduler's retirement)."""
        seq.cancelled = True
        if seq in self.waiting:
            self.waiting.remove(seq)

    def has_work(self):
        return bool(self.waiting) or any(not s.finished for s in self.running)

    def blocks_in_use(self):
        return self.model.num_blocks - self.blocks.num_free()

    def step(self):
        """One scheduling decision and one model call. Returns [(sequence, new token)]."""
        batch = self.schedule(self.waiting, self.running, self.blocks, self.max_tokens)
        held, bs = self.blocks_in_use(), self.model.block_size
        if held > self.peak["blocks"]:
            # the empty ends of last blocks are the only unused slots (shared blocks are full)
            tails = sum(len(self.blocks.block_table(s.id)) * bs - len(s) for s in self.running if not s.finished)
            self.peak = {"blocks": held, "reserved": held * bs, "used": held * bs - tails,
                         "running": len(self.running), "tokens": sum(len(s) for s in self.running)}
        self.timeline.append([(s.id, len(s) - s.computed, "prefill" if s.computed < len(s) - 1 else "decode")
                              for s in batch])
        if len(self.timeline) > self.KEEP:
            del self.timeline[:self.KEEP // 2]
            del self.finished[:max(0, len(self.finished) - self.KEEP // 2)]
        if not batch:
            return []
        self.prefill_tokens += sum(len(s) - s.computed for s in batch if s.computed < len(s) - 1)
        logits = self.model.forward(*batch_inputs(batch, self.blocks, self.model.block_size))
        now, out = self.clock(), []
        for seq, row in zip(batch, logits):
            token = sample(row, seq)
            seq.output.append(token)
            seq.computed = len(seq) - 1
            if seq.first_token_at is None:
                seq.first_token_at = now
            if seq.finished:
                seq.done_at = now
                self.finished.append(seq)
            out.append((seq, token))
        return out

    def run(self, requests):
        """Serve a trace: requests is [(arrival seconds, prompt ids, max_tokens)], sorted by arrival. While
        nothing can run, the engine's clock skips ahead to the next arrival instead of sleeping. Returns
        the sequences in the order of the trace."""
        real = self.clock
        start, skipped = real(), 0.0
        now = lambda: real() - start + skipped
        pending, seqs = collections.deque(requests), []
        while pending or self.has_work():
            while pending and pending[0][0] <= now():
                arrival, prompt, max_tokens = pending.popleft()
                seqs.append(self.add(prompt, max_tokens, arrival=arrival))
            if not self.has_work():
                skipped += pending[0][0] - now()
                continue
            self.clock = now                  # first and last tokens are stamped on the trace's clock
            try:
                self.step()
            finally:
                self.clock = real
        self.schedule(self.waiting, self.running, self.blocks, self.max_tokens)   # retire the last ones
        return seqs
