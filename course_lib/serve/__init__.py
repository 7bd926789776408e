"""Chapter 14: serving chapter 04's GPT, as vLLM does, on CPU.

- `sequence`         a request as the engine sees it (tokens, how many are cached, when it is done)
- `blocks`           the KV cache's blocks, block tables, reference counts and shared prefixes
- `paged_attention`  attention read through the block tables, one Numba task per query, all its heads
- `scheduler`        continuous batching: retire, preempt the newest, admit, at every step
- `acceptance`       speculative sampling's acceptance rule
- `int8`             per-channel int8 weights and a product that dequantizes as it reads
- `model`            the GPT as numpy arrays with a paged cache, running a flat batch of tokens
- `engine`           a queue, a scheduler, a block manager and the model, one step at a time
- `speculative`      speculative decoding of one sequence with a draft model
- `models`           the chapter's target and draft GPTs (the small pair ships as small_pair.npz)
- `server`, `cli`    an OpenAI-compatible HTTP server with streaming, and `course serve`
- `draw`             pictures: batch slots step by step, a block table over the cache
"""
