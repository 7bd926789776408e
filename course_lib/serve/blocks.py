"""The KV cache's bookkeeping: fixed-size blocks, one block table per sequence, and shared prefixes.

The cache is `num_blocks` blocks of `block_size` positions each (serve/model.py holds the arrays). A
sequence owns a list of blocks, its block table: position p of the sequence lives in block
`table[p // block_size]` at offset `p % block_size`. Blocks are taken one at a time as a sequence grows,
so a sequence reserves at most one partly empty block, never room for its longest possible length.

Two prompts that start alike share the blocks of their common start. A full block is known by a hash of
its tokens chained with the hash of the block before it, so equal hashes mean equal prefixes, not just
equal blocks. A shared block counts its users, and goes back to the free pool when the last one leaves.
"""

from course_lib.serve.sequence import blocks_for


class BlockManager:
    """The course's answer to exercise 14.1 (`block_manager`): read it once your check passes.

    allocate(seq_id, tokens) -> tokens already cached (None: not enough free blocks, nothing changed)
    append(seq_id, token)    -> False when the sequence needs a new block and none is free
    free(seq_id), block_table(seq_id), num_free()
    """

    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks))[::-1]   # pop() hands out block 0 first
        self.users = [0] * num_blocks                      # how many sequences hold each block
        self.hash_of = {}                                  # block -> its hash, for full blocks
        self.block_of = {}                                 # hash -> the block registered under it
        self.tables = {}                                   # seq_id -> [block, ...]
        self.tokens = {}                                   # seq_id -> the tokens it holds

    def num_free(self):
        return len(self.free_blocks)

    def block_table(self, seq_id):
        return self.tables[seq_id]

    def _hash(self, seq_id, i):
        """The chained hash of block i of the sequence (its predecessor's hash, then its tokens)."""
        previous = self.hash_of[self.tables[seq_id][i - 1]] if i else None
        return hash((previous, tuple(self.tokens[seq_id][i * self.block_size:(i + 1) * self.block_size])))

    def _register(self, seq_id, i):
        """Block i of the sequence is full: make it findable, unless an equal block already is."""
        block = self.tables[seq_id][i]
        h = self._hash(seq_id, i)
        self.hash_of[block] = h
        self.block_of.setdefault(h, block)

    def allocate(self, seq_id, tokens):
        bs = self.block_size
        shareable = (len(tokens) - 1) // bs          # full blocks without the last token (always computed)
        hits, previous = [], None
        for i in range(shareable):
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
        for i in range(len(hits), len(tokens) // bs):  # the new full blocks
            self._register(seq_id, i)
        return len(hits) * bs

    def append(self, seq_id, token):
        table, held = self.tables[seq_id], self.tokens[seq_id]
        if len(held) == len(table) * self.block_size:  # the last block is full: take a new one
            if not self.free_blocks:
                return False
            block = self.free_blocks.pop()
            self.users[block] = 1
            table.append(block)
        held.append(token)
        if len(held) % self.block_size == 0:
            self._register(seq_id, len(table) - 1)
        return True

    def free(self, seq_id):
        for block in self.tables.pop(seq_id):
            self.users[block] -= 1
            if self.users[block] == 0:                 # its last user left
                h = self.hash_of.pop(block, None)
                if self.block_of.get(h) == block:
                    del self.block_of[h]
                self.free_blocks.append(block)
        del self.tokens[seq_id]
