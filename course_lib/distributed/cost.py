"""What an all-reduce costs: the latency-bandwidth model, the ring's schedule on paper, and a fit to timings.

Sending a message of n bytes costs about alpha + n / beta: a fixed latency alpha (the call, the
handshake, the wake-up of the other side) plus the bytes at a bandwidth of beta bytes per second.
An algorithm that sends m messages one after the other and b bytes per rank costs m·alpha + b/beta.

    ring, chunked (reduce-scatter then all-gather): m = 2(p-1), b = 2(p-1)/p · n
    ring, whole tensor passed on p-1 times:         m = p-1,    b = (p-1) · n
    everything through rank 0:                      rank 0's link carries 2(p-1) · n

`fit` recovers alpha and beta from measured times by least squares over all sizes, so no single
noisy timing can pull either one to nonsense. `overlapped_seconds` puts the model on a timeline: buckets
that become ready one after the other during a backward, sent one at a time on one link.
"""

import numpy as np


def ring_bytes(n_bytes, world_size):
    """Bytes each rank sends (and receives) in a chunked ring all-reduce of n_bytes: 2(p-1)/p · n."""
    return 2 * (world_size - 1) / world_size * n_bytes


def ring_seconds(n_bytes, world_size, latency, bandwidth):
    """The chunked ring's model: 2(p-1) messages of `latency` seconds, plus ring_bytes at `bandwidth` bytes/s."""
    return 2 * (world_size - 1) * latency + ring_bytes(n_bytes, world_size) / bandwidth


def overlapped_seconds(buckets, world_size, latency, bandwidth):
    """When the last all-reduce ends, for buckets [(ready, n_bytes)] sent in that order, one at a time: each
    starts once it is ready (seconds) and the one before it has finished, and takes `ring_seconds`.

    Subtract the backward's length to get the communication a training step still waits for after it."""
    end = 0.0
    for ready, n_bytes in buckets:
        end = max(end, ready) + ring_seconds(n_bytes, world_size, latency, bandwidth)
    return end


def fit(messages, sent_bytes, seconds):
    """Least squares for (latency, bandwidth) in seconds = messages·latency + sent_bytes/bandwidth, over all sizes.

    Each row is divided by its time, so the fit weighs relative errors: a 10 us timing counts as much
    as a 10 ms one, and the small sizes fix the latency while the large ones fix the bandwidth. A
    coefficient the data push below zero is pinned at zero and the other refitted.
    Returns (latency in seconds, bandwidth in bytes/s; None when the bytes explain less than 5% of the
    longest time: the times do not grow with size, and any bandwidth read off them would be noise).
    """
    m, b, t = (np.asarray(v, dtype=float) for v in (messages, sent_bytes, seconds))
    rows, ones = np.stack([m, b], axis=1) / t[:, None], np.ones_like(t)
    latency, inverse = np.linalg.lstsq(rows, ones, rcond=None)[0]
    if latency < 0:
        latency, inverse = 0.0, np.linalg.lstsq(rows[:, 1:], ones, rcond=None)[0][0]
    if inverse * b.max() < 0.05 * t.max():   # the bytes explain (almost) nothing: no bandwidth to read off
        return float(np.linalg.lstsq(rows[:, :1], ones, rcond=None)[0][0]), None
    return float(latency), float(1 / inverse)


def ring_schedule(world_size):
    """What each rank holds before the chunked ring starts and after each of its 2(p-1) steps, for a picture.

    A list of dicts {"phase", "step", "sent": [chunk sent by each rank] (None at the start),
    "held": held[rank][chunk] = the ranks whose values that copy of the chunk has summed so far}.
    It simulates the exchanges on paper (no processes): at every step each rank passes on the
    chunk it has just completed more of; in the reduce-scatter the receiver adds, in the
    all-gather it overwrites.
    """
    p = world_size
    held = [[(r,) for _ in range(p)] for r in range(p)]
    steps = [{"phase": "start", "step": 0, "sent": None, "held": [list(row) for row in held]}]
    last = list(range(p))   # the chunk each rank received last (at first, the one of its own number)
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(p - 1):
            sent = list(last)
            incoming = [held[(r - 1) % p][sent[(r - 1) % p]] for r in range(p)]   # read before anyone writes
            for r in range(p):
                c = sent[(r - 1) % p]
                held[r][c] = tuple(sorted(held[r][c] + incoming[r])) if phase == "reduce-scatter" else incoming[r]
                last[r] = c
            steps.append({"phase": phase, "step": s, "sent": sent, "held": [list(row) for row in held]})
    return steps
