"""A request as the engine sees it: its tokens, how many of them are in the KV cache, and when it is done.

    seq = Sequence(id=3, prompt=[5, 17, 2], max_tokens=8)
    seq.tokens            # prompt + output so far
    seq.computed          # how many of seq.tokens have their keys and values in the cache
    seq.finished          # True once max_tokens tokens were generated (or the request was cancelled)

A step of the engine feeds each scheduled sequence the tokens `seq.tokens[seq.computed:]`: the prompt
(less the prefix found in the cache) the first time, one token after that. The sampled token joins
`seq.output`, and its keys and values are computed at the next step.
"""

from dataclasses import dataclass, field


@dataclass(eq=False)
class Sequence:
    id: int
    prompt: list
    max_tokens: int
    output: list = field(default_factory=list)
    computed: int = 0              # tokens whose keys and values are in the cache
    temperature: float = 0.0       # 0: greedy
    seed: int = 0                  # the generator of a sampled request
    cancelled: bool = False        # the client went away: retire it at the next step
    arrival: float = 0.0           # when it arrived (seconds on the engine's clock)
    first_token_at: float = None   # when its first output token came out
    done_at: float = None

    @property
    def tokens(self):
        return self.prompt + self.output

    @property
    def finished(self):
        return self.cancelled or len(self.output) >= self.max_tokens

    def __len__(self):
        return len(self.prompt) + len(self.output)

    def __repr__(self):
        return (f"Sequence(id={self.id}, {len(self.prompt)} prompt + {len(self.output)}/{self.max_tokens} "
                f"output tokens, {self.computed} computed)")


def blocks_for(n_tokens, block_size):
    """How many blocks of block_size hold n_tokens: the last one may be partly empty."""
    return -(-n_tokens // block_size)
