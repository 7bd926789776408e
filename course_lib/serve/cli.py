"""`course serve`: the chapter's GPT behind an OpenAI-compatible HTTP server, on 127.0.0.1 only.

    course serve                     # http://127.0.0.1:8000/v1/completions
    course serve --port 8001 --yours # the engine on your saved chapter 14 pieces

Then, from Python:

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    for chunk in client.completions.create(model="course-gpt", prompt="The ", max_tokens=40, stream=True):
        print(chunk.choices[0].text, end="")
"""

import argparse

import numpy as np

HOST = "127.0.0.1"      # never another interface: the server has no authentication


def build(num_blocks=256, block_size=16, yours=False, quiet=False):
    """(runner, tokenizer): the chapter's small target GPT in a paged engine, running in its thread."""
    from course_lib.serve.engine import Engine
    from course_lib.serve.model import PagedGPT
    from course_lib.serve.models import load_pair
    from course_lib.serve.server import Runner

    pair = load_pair()
    if yours:
        from course_lib.yours import serve

        pieces = serve.assemble(quiet=quiet)
        engine = pieces.engine(pair.target, num_blocks, block_size)
    else:
        engine = Engine(PagedGPT.from_gpt(pair.target, num_blocks, block_size, np.float32))
    return Runner(engine), pair.tokenizer


def main(argv=None):
    p = argparse.ArgumentParser(prog="course serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--blocks", type=int, default=256, help="KV-cache blocks (default 256)")
    p.add_argument("--block-size", type=int, default=16, help="positions per block (default 16)")
    p.add_argument("--yours", action="store_true", help="run your saved chapter 14 pieces (work/yours/ch14.py)")
    args = p.parse_args(argv)

    import uvicorn

    from course_lib.serve.server import make_app

    runner, tokenizer = build(args.blocks, args.block_size, args.yours)
    print(f"serving the chapter 14 GPT on http://{HOST}:{args.port}/v1 (Ctrl-C stops it)")
    try:
        uvicorn.run(make_app(runner, tokenizer), host=HOST, port=args.port, log_level="warning")
    finally:
        runner.close()
    return 0
