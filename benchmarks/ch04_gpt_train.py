"""Train the course GPT with nanoGPT's README CPU configuration on the course corpus.

Configuration (nanoGPT README, "I only have a macbook"): 4 layers, 4 heads, 128 embedding,
block 64, batch 12, 2000 iterations, lr 1e-3 decaying to 1e-4 at 2000 (100 warmup), dropout 0,
eval_iters 20; char-level pydoc_data corpus, 90/10 split.

Peers:
  - nanoGPT itself, same configuration and corpus on the course machine: val loss 1.40 at about
    58 ms per iteration (median). Recorded figure, not rerun here.
  - Hugging Face transformers' GPT2LMHeadModel with the same shapes, timed side by side in this run
    on the same batches with the same optimizer, steps interleaved (step time only; `--peer-iters`, 0 to skip).

    python benchmarks/ch04_gpt_train.py [--iters 2000] [--threads 2] [--peer-iters 200]
"""

import argparse
import time

import torch
import torch.nn.functional as F

from course_lib.data import load_text
from course_lib.gpt import TrainConfig, configure_optimizer, estimate_loss, make_get_batch, train, train_step
from course_lib.gpt.model import GPT, GPTConfig
from course_lib.gpt.tokenizers import CharTokenizer

NANOGPT_VAL, NANOGPT_MS = 1.40, 58.0


class HFGPT2(torch.nn.Module):
    """transformers.GPT2LMHeadModel behind the course's (logits, loss) interface."""

    def __init__(self, config):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        hc = GPT2Config(vocab_size=config.vocab_size, n_positions=config.block_size, n_embd=config.n_embd,
                        n_layer=config.n_layer, n_head=config.n_head, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        self.gpt2 = GPT2LMHeadModel(hc)

    def forward(self, idx, targets):
        logits = self.gpt2(idx).logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def median_step_ms(models, get_batch, cfg, steps):
    """Median ms per training step of each model, their steps interleaved so load hits both alike."""
    opts = [configure_optimizer(m, cfg) for m in models]
    times = [[] for _ in models]
    for _ in range(steps):
        x, y = get_batch("train")
        for model, opt, ts in zip(models, opts, times):
            t0 = time.perf_counter()
            train_step(model, opt, x, y, cfg.grad_clip)
            ts.append(1000 * (time.perf_counter() - t0))
    return [sorted(ts[10:])[len(ts[10:]) // 2] for ts in times]


def run_training(config, cfg, ids):
    """The README run: train from scratch, print the evaluations, val loss and ms/iter."""
    torch.manual_seed(1337)
    model = GPT(config)
    print(f"course GPT: {model.num_params() / 1e6:.2f} M parameters")
    get_batch = make_get_batch(ids, config.block_size, cfg.batch_size, seed=1337)
    t0 = time.perf_counter()
    h = train(model, get_batch, cfg, progress=False)
    wall = time.perf_counter() - t0
    for it, tr, va in zip(h["eval_iter"], h["train_loss"], h["val_loss"]):
        print(f"  iter {it:5d}  train {tr:.4f}  val {va:.4f}")
    val200 = estimate_loss(model, make_get_batch(ids, config.block_size, cfg.batch_size, seed=7), 200)["val"]
    print(f"course GPT: val loss {h['val_loss'][-1]:.4f} (20 batches, as nanoGPT reports), "
          f"{val200:.4f} over 200 batches; {h['ms_per_iter']:.1f} ms/iter median; {wall:.0f} s in all")
    print(f"vs nanoGPT (recorded, unloaded machine): val {NANOGPT_VAL:.2f} at {NANOGPT_MS:.0f} ms/iter -> "
          f"val ratio {h['val_loss'][-1] / NANOGPT_VAL:.3f}, time ratio {h['ms_per_iter'] / NANOGPT_MS:.2f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--peer-iters", type=int, default=200)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    text = load_text()
    tok = CharTokenizer(text)
    ids = torch.tensor(tok.encode(text))
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    cfg = TrainConfig(max_iters=args.iters, batch_size=12, lr=1e-3, min_lr=1e-4, warmup_iters=100,
                      lr_decay_iters=args.iters, eval_interval=250, eval_iters=20)
    print(f"corpus: {len(text):,} characters, vocab {tok.vocab_size}; torch threads {args.threads}")

    if args.iters == 0:
        print("(training skipped: --iters 0)")
    else:
        run_training(config, cfg, ids)

    if args.peer_iters:
        torch.manual_seed(1337)
        models = [GPT(config), HFGPT2(config)]
        ours, peer = median_step_ms(models, make_get_batch(ids, 64, 12, seed=1), cfg, args.peer_iters)
        print(f"side by side, {args.peer_iters} interleaved steps each: course GPT {ours:.1f} ms/iter, "
              f"transformers GPT2LMHeadModel {peer:.1f} ms/iter -> ratio {ours / peer:.2f}")


if __name__ == "__main__":
    main()
