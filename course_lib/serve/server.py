"""An HTTP server for the engine, in OpenAI's completions format, streaming with server-sent events.

    app = make_app(Runner(engine), tokenizer)        # a FastAPI application
    uvicorn.run(app, host="127.0.0.1", port=8000)    # what `course serve` does

    POST /v1/completions  {"prompt": "def f(", "max_tokens": 32, "temperature": 0, "stream": true}
    GET  /v1/models

Any OpenAI client talks to it (`OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")`). The engine
runs in a thread of its own (`Runner`): requests reach it through a queue, and every token it produces is
handed to the request's stream as soon as its step ends, so that many requests share each step. A client
that goes away mid-stream cancels its request, and the engine frees its blocks at the next step.

Bad input gets HTTP 400 with OpenAI's error body ({"error": {"message", "type", "param", "code"}}): an
unknown parameter, a prompt and max_tokens longer than the model's context, max_tokens below 1, a
character the tokenizer does not know.
"""

import asyncio
import json
import queue
import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

# The parameters of OpenAI's completions request that this server serves; any other is refused, so a
# client never believes that an option (n, logprobs, stop, ...) took effect when it did not.
KNOWN = {"model", "prompt", "max_tokens", "temperature", "stream", "seed"}


class Runner:
    """The engine in a thread: `submit` queues a request and returns an asyncio queue of its tokens."""

    def __init__(self, engine):
        self.engine = engine
        self.inbox = queue.Queue()
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.thread.start()

    def submit(self, prompt, max_tokens, temperature=0.0, seed=0):
        """(Sequence, asyncio.Queue) once the engine has taken the request; tokens arrive as (token, done)."""
        loop = asyncio.get_running_loop()
        tokens, taken = asyncio.Queue(), loop.create_future()
        self.inbox.put(("add", (prompt, max_tokens, temperature, seed), loop, tokens, taken))
        return taken, tokens

    def cancel(self, seq):
        self.inbox.put(("cancel", seq, None, None, None))

    def _loop(self):
        streams = {}
        while not self.stopped:
            if not self.engine.has_work() and self.engine.running:
                self.engine.step()                   # retire the last finished or cancelled sequences
            try:
                item = self.inbox.get(timeout=None if not self.engine.has_work() else 0)
            except queue.Empty:
                item = None
            while item is not None:
                kind, arg, loop, tokens, taken = item
                if kind == "add":
                    try:
                        seq = self.engine.add(*arg)
                        streams[seq.id] = (loop, tokens)
                        loop.call_soon_threadsafe(_resolve, taken, seq)
                    except ValueError as e:
                        loop.call_soon_threadsafe(_fail, taken, e)
                elif kind == "cancel":
                    self.engine.cancel(arg)
                    streams.pop(arg.id, None)
                elif kind == "stop":
                    return
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    item = None
            if self.engine.has_work():
                try:
                    produced = self.engine.step()
                except Exception as e:           # a broken piece: every waiting client hears of it, none hangs
                    for loop, tokens in streams.values():
                        loop.call_soon_threadsafe(tokens.put_nowait, (e, True))
                    streams.clear()
                    for seq in list(self.engine.waiting) + self.engine.running:
                        self.engine.cancel(seq)
                    continue
                for seq, token in produced:
                    if seq.id in streams:
                        loop, tokens = streams[seq.id]
                        loop.call_soon_threadsafe(tokens.put_nowait, (token, seq.finished))
                        if seq.finished:
                            del streams[seq.id]

    def close(self):
        self.stopped = True
        self.inbox.put(("stop", None, None, None, None))
        self.thread.join(timeout=10)


def _resolve(future, value):
    if not future.done():
        future.set_result(value)


def _fail(future, error):
    if not future.done():
        future.set_exception(error)


def error(message, param=None, status=400):
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status)


def parse(body, tokenizer, context):
    """(prompt ids, max_tokens, temperature, seed, stream) from a request body, or an error response."""
    if not isinstance(body, dict):
        return error("the request body must be a JSON object")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        return error(f"unknown parameter{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} (this server "
                     f"takes {', '.join(sorted(KNOWN))})", unknown[0])
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        return error("prompt must be a non-empty string", "prompt")
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return error(f"max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens")
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        return error(f"temperature must be a number from 0 to 2, got {temperature!r}", "temperature")
    seed = body.get("seed", 0)
    if not isinstance(seed, int):
        return error(f"seed must be an integer, got {seed!r}", "seed")
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as e:
        return error(f"the prompt cannot be tokenized: {e}", "prompt")
    if len(ids) + max_tokens > context:
        return error(f"the prompt ({len(ids)} tokens) and max_tokens ({max_tokens}) exceed the model's context "
                     f"of {context} tokens", "prompt" if len(ids) >= context else "max_tokens")
    return ids, max_tokens, float(temperature), seed, bool(body.get("stream", False))


def make_app(runner, tokenizer, model_name="course-gpt"):
    app = FastAPI(title="chapter 14: your GPT, served")
    context = runner.engine.max_context

    def chunk(rid, created, text, finish):
        return {"id": rid, "object": "text_completion", "created": created, "model": model_name,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "you"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return error("the request body is not valid JSON")
        parsed = parse(body, tokenizer, context)
        if isinstance(parsed, JSONResponse):
            return parsed
        ids, max_tokens, temperature, seed, stream = parsed
        taken, tokens = runner.submit(ids, max_tokens, temperature, seed)
        try:
            seq = await taken
        except ValueError as e:
            return error(str(e), "prompt")
        rid, created = f"cmpl-{seq.id}", int(time.time())

        async def events():
            done = False
            try:
                while not done:
                    token, done = await tokens.get()
                    if isinstance(token, Exception):
                        message = f"the engine failed: {type(token).__name__}: {token}"
                        yield f"data: {json.dumps({'error': {'message': message, 'type': 'server_error'}})}\n\n"
                        return
                    finish = "length" if done else None
                    yield f"data: {json.dumps(chunk(rid, created, tokenizer.decode([token]), finish))}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                if not done:                     # the client went away: free its blocks
                    runner.cancel(seq)

        if stream:
            return StreamingResponse(events(), media_type="text/event-stream")
        out = []
        done = False
        try:
            while not done:
                token, done = await tokens.get()
                if isinstance(token, Exception):
                    return error(f"the engine failed: {type(token).__name__}: {token}", status=500)
                out.append(token)
        finally:
            if not done:
                runner.cancel(seq)
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(out), "total_tokens": len(ids) + len(out)}
        return {**chunk(rid, created, tokenizer.decode(out), "length"), "usage": usage}

    return app
