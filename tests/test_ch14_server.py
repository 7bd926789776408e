"""The server, through the official `openai` client, against a local server on 127.0.0.1.

Concurrent streamed requests all complete and each equals the same request served alone; bad input gets
HTTP 400 with a message that says what is wrong; a client that disconnects mid-stream gets its blocks
freed. The engine runs in float64 here, so that a request's greedy tokens cannot depend on the batch it
shares (float32 sums in another order could tip a near tie).
"""

import asyncio
import socket
import threading
import time

import httpx
import numpy as np
import openai
import pytest
import uvicorn

from course_lib.serve.cli import HOST
from course_lib.serve.engine import Engine
from course_lib.serve.model import PagedGPT
from course_lib.serve.models import load_pair
from course_lib.serve.server import Runner, make_app

NUM_BLOCKS, BLOCK_SIZE = 64, 16


@pytest.fixture(scope="module")
def server():
    pair = load_pair()
    engine = Engine(PagedGPT.from_gpt(pair.target, NUM_BLOCKS, BLOCK_SIZE, np.float64))
    runner = Runner(engine)
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(make_app(runner, pair.tokenizer), host=HOST, port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    assert srv.started, "the server did not start"
    yield f"http://{HOST}:{port}/v1", engine
    srv.should_exit = True
    thread.join(timeout=10)
    runner.close()


PROMPTS = ["The list ", "def f(x):\n    return ", "A class ", "Python's ", "import ", "for i in "]


def test_concurrent_streams_equal_each_request_alone(server):
    url, engine = server
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    lengths = [12, 30, 7, 25, 18, 40]
    alone = [client.completions.create(model="course-gpt", prompt=p, max_tokens=n, temperature=0).choices[0].text
             for p, n in zip(PROMPTS, lengths)]
    assert all(len(a) == n for a, n in zip(alone, lengths))

    async def stream(aclient, prompt, n):
        text, chunks = "", 0
        async for chunk in await aclient.completions.create(model="course-gpt", prompt=prompt, max_tokens=n,
                                                            temperature=0, stream=True):
            text += chunk.choices[0].text
            chunks += 1
        return text, chunks

    async def all_at_once():
        async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0) as aclient:
            return await asyncio.gather(*(stream(aclient, p, n) for p, n in zip(PROMPTS, lengths)))

    steps_before = len(engine.timeline)
    results = asyncio.run(all_at_once())
    assert [text for text, _ in results] == alone
    assert [chunks for _, chunks in results] == lengths                 # one event per token
    shared = [step for step in engine.timeline[steps_before:] if len(step) > 1]
    assert shared, "the concurrent requests never ran in one step"


@pytest.mark.parametrize("kwargs, words", [
    (dict(prompt="x" * 500, max_tokens=20), "exceed the model's context of 512 tokens"),
    (dict(prompt="Hello", max_tokens=-3), "max_tokens must be a positive integer"),
    (dict(prompt="Hello", max_tokens=5, extra_body={"logprobs": 2}), "unknown parameter: logprobs"),
    (dict(prompt="Hello", max_tokens=5, extra_body={"n": 2, "stop": "x"}), "unknown parameters: n, stop"),
    (dict(prompt="caf\u00e9 \u2603", max_tokens=5), "cannot be tokenized"),
])
def test_bad_input_gets_a_clear_http_400(server, kwargs, words):
    url, _ = server
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as failure:
        client.completions.create(model="course-gpt", temperature=0, **kwargs)
    assert failure.value.status_code == 400
    assert words in failure.value.message


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(server):
    url, engine = server
    body = {"model": "course-gpt", "prompt": "The quick ", "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{url}/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            got = [line for line in (next(lines) for _ in range(6)) if line.startswith("data:")]
            assert got                                            # tokens were streaming
            assert engine.blocks.num_free() < NUM_BLOCKS          # the request holds blocks
    for _ in range(400):                                          # closed: the engine notices at its next step
        if engine.blocks.num_free() == NUM_BLOCKS and not engine.running:
            break
        time.sleep(0.05)
    assert engine.blocks.num_free() == NUM_BLOCKS, f"{NUM_BLOCKS - engine.blocks.num_free()} blocks still held"


def test_course_serve_binds_loopback_only(monkeypatch, capsys):
    """`course serve` reaches serve/cli.py with its own options, and hands uvicorn 127.0.0.1 and nothing else."""
    from course_lib.course import commands
    from course_lib.serve import cli as serve_cli

    with pytest.raises(SystemExit) as done:
        commands.main(["serve", "--help"])
    assert done.value.code == 0 and "--host" not in capsys.readouterr().out
    seen = {}

    class Closed:
        def close(self):
            seen["closed"] = True

    monkeypatch.setattr(serve_cli, "build", lambda *a, **k: (Closed(), None))
    from course_lib.serve import server as server_module

    monkeypatch.setattr(server_module, "make_app", lambda runner, tokenizer: "app")
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    assert commands.main(["serve", "--port", "8123"]) == 0
    assert seen["host"] == "127.0.0.1" and seen["port"] == 8123 and seen["closed"]


def test_a_failing_engine_answers_500_and_hangs_no_one():
    from fastapi.testclient import TestClient

    def broken(waiting, running, blocks, max_tokens):
        raise RuntimeError("a broken scheduler")

    pair = load_pair()
    runner = Runner(Engine(PagedGPT.from_gpt(pair.target, 8, 16), schedule=broken))
    try:
        with TestClient(make_app(runner, pair.tokenizer)) as client:
            response = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0})
            assert response.status_code == 500
            assert "a broken scheduler" in response.json()["error"]["message"]
            streamed = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "stream": True})
            assert "a broken scheduler" in streamed.text and "[DONE]" not in streamed.text
    finally:
        runner.close()
