"""Chapter 04's GPT as a server runs it: numpy arrays, a paged KV cache, and a flat batch of tokens.

    model = PagedGPT.from_gpt(gpt, num_blocks=256, block_size=16)
    logits = model.forward(tokens, positions, slots, tables, context_lens, rows)

A step's batch is flat: the tokens of every scheduled sequence one after the other (a prefill brings many,
a decode one), each with its position in its sequence, its slot in the cache (block * block_size + offset,
where its key and value are written) and its sequence's block table. The matrix products run once over
all the tokens of the step, whoever they belong to; only attention looks at sequences, through the tables.
`rows` picks the tokens whose logits are wanted: the last of each sequence when serving.

The linear layers are pluggable: float (numpy's BLAS) or int8 (`quantized`, with a quantizer and an
int8 kernel such as those of serve/int8.py). The attention kernel is too (`attention=`), with the
signature of serve/paged_attention.py.
"""

import math

import numpy as np


class FloatLinear:
    """y = x W^T + b with numpy's BLAS."""

    def __init__(self, w, b):
        self.w, self.b = w, b

    def __call__(self, x):
        y = x @ self.w.T
        return y + self.b if self.b is not None else y

    def nbytes(self, bias=True):
        return self.w.nbytes + (self.b.nbytes if self.b is not None and bias else 0)


class Int8Linear:
    """y = x (q * scale)^T + b, where `matmul(x, q, scale, out)` dequantizes as it reads."""

    def __init__(self, w, b, quantize, matmul):
        self.q, self.scale = quantize(w)
        self.b, self.matmul = b, matmul

    def __call__(self, x):
        out = np.empty((x.shape[0], self.q.shape[0]), x.dtype)
        self.matmul(np.ascontiguousarray(x), self.q, self.scale, out)
        return out + self.b if self.b is not None else out

    def rows(self, ids):
        """Rows of the dequantized matrix (an embedding lookup)."""
        return self.q[ids] * self.scale[ids, None]

    def nbytes(self, bias=True):
        return self.q.nbytes + self.scale.nbytes + (self.b.nbytes if self.b is not None and bias else 0)


def layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * g
    return y + b if b is not None else y


def gelu_tanh(x):
    # x * x * x, not x ** 3: on float32, numpy's power calls pow for every element, about 60 ns each,
    # which made this line a third of a decode step's time
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


class PagedGPT:
    """The weights of a chapter 04 GPT (bias=True, tanh GELU) and a paged KV cache for them."""

    def __init__(self, params, config, num_blocks, block_size, dtype=np.float32, attention=None):
        if attention is None:
            from course_lib.serve.paged_attention import paged_attention as attention
        self.config, self.dtype, self.attention = config, dtype, attention
        self.n_head, self.head_dim = config.n_head, config.n_embd // config.n_head
        self.block_size, self.num_blocks = block_size, num_blocks
        p = {name: t.astype(dtype) for name, t in params.items()}
        self.params = p
        self.wte, self.wpe = p["transformer.wte.weight"], p["transformer.wpe.weight"]
        self.head = FloatLinear(self.wte, None)
        self.layers = []
        for i in range(config.n_layer):
            pre = f"transformer.h.{i}."
            self.layers.append({
                "ln_1": (p[pre + "ln_1.weight"], p.get(pre + "ln_1.bias")),
                "c_attn": FloatLinear(p[pre + "attn.c_attn.weight"], p.get(pre + "attn.c_attn.bias")),
                "attn_proj": FloatLinear(p[pre + "attn.c_proj.weight"], p.get(pre + "attn.c_proj.bias")),
                "ln_2": (p[pre + "ln_2.weight"], p.get(pre + "ln_2.bias")),
                "c_fc": FloatLinear(p[pre + "mlp.c_fc.weight"], p.get(pre + "mlp.c_fc.bias")),
                "mlp_proj": FloatLinear(p[pre + "mlp.c_proj.weight"], p.get(pre + "mlp.c_proj.bias")),
            })
        self.ln_f = (p["transformer.ln_f.weight"], p.get("transformer.ln_f.bias"))
        shape = (config.n_layer, num_blocks, block_size, self.n_head, self.head_dim)
        self.k_cache, self.v_cache = np.zeros(shape, dtype), np.zeros(shape, dtype)

    @classmethod
    def from_gpt(cls, gpt, num_blocks, block_size, dtype=np.float32, attention=None):
        """From a chapter 04 GPT (PyTorch): its weights copied out as numpy arrays."""
        params = {name: t.detach().cpu().numpy() for name, t in gpt.state_dict().items()}
        return cls(params, gpt.config, num_blocks, block_size, dtype, attention)

    def quantized(self, quantize, matmul):
        """The same model with every weight matrix in int8 (the embeddings too: a lookup dequantizes
        the rows it reads), on a cache of its own."""
        q = PagedGPT(self.params, self.config, self.num_blocks, self.block_size, self.dtype, self.attention)
        for layer in q.layers:
            for name in ("c_attn", "attn_proj", "c_fc", "mlp_proj"):
                layer[name] = Int8Linear(layer[name].w, layer[name].b, quantize, matmul)
        q.head = Int8Linear(self.wte, None, quantize, matmul)
        q.wpe_q = Int8Linear(self.wpe, None, quantize, matmul)
        return q

    def weight_bytes(self, matrices_only=False):
        """Bytes of the weights as this model stores them: the weight matrices (with their scales when int8),
        and unless matrices_only, the biases and layer norms too (float32 either way)."""
        n = self.head.nbytes() + (self.wpe_q.nbytes() if hasattr(self, "wpe_q") else self.wpe.nbytes)
        for layer in self.layers:
            n += sum(v.nbytes(bias=not matrices_only) for k, v in layer.items() if not k.startswith("ln"))
            if not matrices_only:
                n += sum(a.nbytes for k in ("ln_1", "ln_2") for a in layer[k] if a is not None)
        return n + (0 if matrices_only else sum(a.nbytes for a in self.ln_f if a is not None))

    def embed(self, tokens, positions):
        if isinstance(self.head, Int8Linear):
            return self.head.rows(tokens) + self.wpe_q.rows(positions)
        return self.wte[tokens] + self.wpe[positions]

    def forward(self, tokens, positions, slots, tables, context_lens, rows):
        """Logits (len(rows), vocab) of the batch's tokens `rows`, after writing every token's key and
        value into its slot. tokens, positions, slots, context_lens (N,); tables (N, max blocks)."""
        H, d = self.n_head, self.head_dim
        N = len(tokens)
        x = self.embed(tokens, positions).astype(self.dtype)                 # (N, C)
        scale = self.dtype(1.0 / math.sqrt(d))
        for i, layer in enumerate(self.layers):
            qkv = layer["c_attn"](layer_norm(x, *layer["ln_1"]))                # (N, 3C)
            q, k, v = (qkv[:, j * H * d:(j + 1) * H * d].reshape(N, H, d) for j in range(3))
            self.k_cache[i].reshape(-1, H, d)[slots] = k                       # into the blocks
            self.v_cache[i].reshape(-1, H, d)[slots] = v
            y = np.empty((N, H, d), self.dtype)
            self.attention(np.ascontiguousarray(q), self.k_cache[i], self.v_cache[i], tables, context_lens, y, scale)
            x = x + layer["attn_proj"](y.reshape(N, H * d))
            x = x + layer["mlp_proj"](gelu_tanh(layer["c_fc"](layer_norm(x, *layer["ln_2"]))))
        return self.head(layer_norm(x[rows], *self.ln_f))


def batch_inputs(seqs, blocks, block_size):
    """The flat inputs of `PagedGPT.forward` for sequences that each run tokens[computed:], and the row of
    each sequence's last token. blocks: the BlockManager that holds their tables."""
    tokens, positions, slots, table_rows, lens, rows = [], [], [], [], [], []
    for seq in seqs:
        table = blocks.block_table(seq.id)
        all_tokens = seq.tokens
        for pos in range(seq.computed, len(all_tokens)):
            tokens.append(all_tokens[pos])
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
            table_rows.append(table)
            lens.append(pos + 1)
        rows.append(len(tokens) - 1)
    width = max(len(t) for t in table_rows)
    tables = np.full((len(tokens), width), -1, np.int32)
    for i, t in enumerate(table_rows):
        tables[i, :len(t)] = t
    as_int = lambda a: np.asarray(a, np.int64)
    return as_int(tokens), as_int(positions), as_int(slots), tables, as_int(lens), as_int(rows)
