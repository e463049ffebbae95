"""The OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions,
/health and /metrics, on FastAPI, and the chat page at /. Requests are checked by the
pydantic models of schemas.py; every refusal is an OpenAI-style error body naming the field."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any, Sequence


from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import sampling
from ..constraints import ConstraintError, tool_call_lark
from ..errors import DistributedError, GpuError, MetalqwenError
from ..images import flatten_messages, image_tokens
from ..model import Model
from ..prefix_cache import message_boundaries
from . import access_log
from .image_parts import ImagePolicy, ImageRefused, resolve
from .logprobs import CompletionLogprobs, TokenTexts, chat_logprobs
from .metrics import Metrics
from .output_parser import Delta, OutputParser
from .schemas import ChatCompletionRequest, CompletionRequest
from .streams import merged
from .page import chat_page
from .worker import Job, QueueFull, ShuttingDown, Worker


class _Refused(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind


def _error_body(message: str, param: str | None, kind: str) -> dict:
    """The OpenAI API's error object (a response body, or the last chunk of a stream)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _error(status: int, message: str, param: str | None, kind: str) -> JSONResponse:
    return JSONResponse(_error_body(message, param, kind), status)


# The temperature of a request that gives none when generation_config.json has none either.
_TEMPERATURE = 1.0  # OpenAI's default


def _validation_message(error: dict) -> tuple[str, str | None]:
    """(message, param) of a request pydantic or FastAPI refused, in words of the API, not of pydantic."""
    if error["type"] == "json_invalid":
        return f"the request body is not valid JSON ({error.get('ctx', {}).get('error', error['msg'])})", None
    param = ".".join(str(p) for p in error["loc"] if p != "body") or None
    if error["type"] == "missing" and param is None:
        return "the request needs a JSON body", None
    message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return f"{param or 'body'}: {message}", param


def create_app(model: Model, *, model_id: str | None = None, api_key: str | None = None,
               max_queue: int = 16, public_metrics: bool = False, cors_origins: Sequence[str] = (),
               images: ImagePolicy = ImagePolicy(), on_fatal=None) -> FastAPI:
    """The server's ASGI app around a loaded model (one engine; requests take turns).
    ``app.state.drain()`` ends the unfinished requests, for a graceful shutdown. With ``api_key``
    every route but the page and /health (and /metrics with ``public_metrics``) needs it;
    ``cors_origins``: the browser origins allowed to call the API (none by default); ``images``:
    which image_url parts chat requests may carry (data: URLs only by default); ``on_fatal(error)``:
    called (on the engine thread) when a pipeline rank failed, after which every request gets 503."""
    worker = Worker(model, max_queue, on_fatal=on_fatal)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        worker.stop()

    app = FastAPI(title="metalqwen", docs_url=None, redoc_url=None, lifespan=lifespan)
    model_id = model_id or model.checkpoint.name
    metrics = Metrics(model, worker)
    worker.on_done = metrics.finished  # every ended request counts, a cancelled or disconnected one too
    texts = TokenTexts(model.tokenizer)
    app.state.drain = worker.drain
    # The page holds no data (it asks for the key and sends it with its API calls); probes need none.
    open_paths = {"/", "/health"} | ({"/metrics"} if public_metrics else set())

    @app.middleware("http")
    async def _bearer_and_log(request: Request, call_next):
        started = time.monotonic()
        if api_key and request.url.path not in open_paths and \
                request.headers.get("authorization") != f"Bearer {api_key}":
            response = _error(401, "missing or wrong API key (Authorization: Bearer ...)", None, "authentication_error")
            access_log.log.info(access_log.request_line(request.method, request.url.path, 401, started))
            return response
        response = await call_next(request)
        response.body_iterator = access_log.logged_body(response.body_iterator, request.method, request.url.path,
                                                        response.status_code, started, request.state)
        return response

    if cors_origins:  # outermost, so preflight requests are answered before the key is asked for
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                           allow_headers=["*"])

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc.errors()[0])
        return _error(400, message, param, "invalid_request_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", None, kind)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        access_log.log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", None, "server_error")

    @app.exception_handler(_Refused)
    async def _refused(request: Request, exc: _Refused):
        return _error(exc.status, str(exc), exc.param, exc.kind)

    @app.get("/", response_class=HTMLResponse)
    def page():
        return chat_page()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/metrics")
    def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "metalqwen"}]}

    def options(req, length: int, max_tokens: int | None, boundaries: list[int] = (),
                logprobs: int | None = None, grammar: str | None = None) -> dict:
        """The generation options for a prompt of ``length`` tokens (its images' included); a max_tokens
        past the room left is cut to it (finish_reason "length"), one past the whole context is refused.
        ``logprobs``: top entries per token (None = off); ``grammar``: the Lark grammar of a forced tool call."""
        where = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
        room = model.max_context - length
        if room < 1:
            raise _Refused(400, f"the prompt has {length} tokens; max_context is {model.max_context}", where)
        if max_tokens is not None and max_tokens > model.max_context:
            raise _Refused(400, f"max_tokens {max_tokens} exceeds the context of {model.max_context} tokens",
                           "max_tokens")
        chosen = sampling.with_defaults({name: getattr(req, name) for name in sampling.FIELDS},
                                        model.config.sampling_defaults, _TEMPERATURE)
        chosen["top_k"] = max(chosen["top_k"], 0)  # -1 is off too
        return dict(max_tokens=min(max_tokens or room, room), **chosen, seed=req.seed, stop=req.stop or None,
                    boundaries=boundaries, logprobs=logprobs, **constraint_options(req, grammar))

    def constraint_options(req, grammar: str | None) -> dict:
        """Model.stream's logit_bias and response_format (or ``grammar``, a forced tool call's),
        compiled once here so that a bad schema is a 400 naming its field (each job then makes its own
        grammar state)."""
        out = {}
        try:
            out["logit_bias"] = dict(sampling.check_logit_bias(req.logit_bias, model.config.vocab_size)) or None
        except (TypeError, ValueError) as e:
            raise _Refused(400, str(e), "logit_bias") from None
        structured = req.response_format if req.response_format and req.response_format["type"] != "text" else None
        if grammar is not None and structured is not None:
            raise _Refused(400, "response_format: a required or named tool_choice already fixes the answer's "
                                "form (a tool call)", "response_format")
        field = "tool_choice" if grammar is not None else "response_format"
        try:
            if grammar is not None:
                model.grammars.lark(grammar)
                out["grammar"] = grammar
            elif structured is not None:
                model.grammars.response_format(structured)
                out["response_format"] = structured
        except ConstraintError as e:
            raise _Refused(400, f"{field}: {e}", field) from None
        return out

    def start(prompt: list[int], opts: dict, n: int, request: Request, pictures: list = ()) -> list[Job]:
        """The request's n jobs (choice i seeded seed + i), queued together or not at all; ``pictures``:
        the images of the prompt's image places, in order."""
        if n > 1 and n > max_queue:  # each choice is a job of the queue
            raise _Refused(400, f"n: {n} choices exceed the {max_queue} requests the server queues (--max-queue)",
                           "n")
        jobs = []
        try:
            for i in range(n):
                seed = opts["seed"] if opts["seed"] is None else opts["seed"] + i
                jobs.append(worker.submit(Job(prompt, {**opts, "seed": seed}, asyncio.get_running_loop(),
                                              images=list(pictures))))
        except (QueueFull, ShuttingDown) as e:
            for job in jobs:
                job.cancelled = True
            if isinstance(e, QueueFull):
                raise _Refused(429, str(e), None, "rate_limit_error") from None
            raise _Refused(503, str(e), None, "server_error") from None
        metrics.requests += 1
        request.state.jobs = jobs
        return jobs

    async def run(job: Job):
        """The job's chunks (model.Chunk); ends the job when the response ends, also a client gone mid-stream."""
        try:
            async for chunk in job.chunks():
                if job.first_token_at is None:
                    job.first_token_at = time.monotonic()
                yield chunk
        except GpuError as e:  # the engine reset that sequence and serves the next request
            raise _Refused(500, str(e), None, "server_error") from None
        except DistributedError as e:  # a pipeline rank failed: the server stops
            raise _Refused(503, str(e), None, "server_error") from None
        except (MetalqwenError, ValueError, TypeError) as e:
            raise _Refused(400, str(e)) from None
        except ShuttingDown as e:
            raise _Refused(503, str(e), None, "server_error") from None
        finally:
            job.cancelled = True  # the worker stops before its next decode step

    def choices(jobs: list[Job]):
        """(index, chunk) of every job as they come, (index, None) when one ends."""
        return merged([run(job) for job in jobs])

    def usage(jobs: list[Job]) -> dict:
        # The prompt is read once per choice but counted once, as OpenAI counts it.
        first, generated = jobs[0].stats, sum(job.stats.generated_tokens for job in jobs)
        return {"prompt_tokens": first.prompt_tokens, "completion_tokens": generated,
                "total_tokens": first.prompt_tokens + generated,
                "prompt_tokens_details": {"cached_tokens": first.prompt_tokens_reused}}

    def sse(data: dict | str) -> str:
        return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"

    def forced_tool_call(req: ChatCompletionRequest, tools: list | None, max_calls: int | None) -> str | None:
        """The Lark grammar of the answer when tool_choice is "required" or names a function (Qwen's
        XML tool calls, the layout OutputParser reads back; after the reasoning when thinking), else None."""
        forced, name = req.forced_tool()
        if not forced:
            return None
        if not tools:
            raise _Refused(400, f"tool_choice {req.tool_choice!r} needs tools", "tool_choice")
        try:
            return tool_call_lark(model.tokenizer, tools, name=name, max_calls=max_calls)
        except ConstraintError as e:
            raise _Refused(400, f"tool_choice: {e}", "tool_choice") from None

    def chat_images(messages: list[dict]) -> tuple[list[dict], list]:
        """(the messages with string contents, their pictures in prompt order): image_url parts are
        resolved under the server's policy (a 400 naming the part at fault)."""
        first = next((f"messages[{i}].content[{j}]" for i, m in enumerate(messages)
                      if isinstance(m["content"], list) for j, p in enumerate(m["content"])
                      if p.get("type") == "image_url"), None)
        if first is None:
            return messages, []
        if model.vision is None:
            raise _Refused(400, f"{first}: this model takes no images: {model.no_vision}", first)
        try:
            return flatten_messages(resolve(messages, images))
        except ImageRefused as e:
            raise _Refused(400, str(e), e.param) from None
        except ValueError as e:
            raise _Refused(400, str(e), "messages") from None

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        if req.top_logprobs and not req.logprobs:
            raise _Refused(400, "top_logprobs needs logprobs: true", "top_logprobs")
        # Logprobs attach to every generated token, whichever of reasoning, content or tool calls it feeds.
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        tools = [t.model_dump() for t in req.tools] if req.tools and req.tool_choice != "none" else None
        try:
            messages = [m.for_template() for m in req.messages]
        except ValueError as e:
            raise _Refused(400, str(e), "messages") from None
        # Downloads and decoding off the event loop (the other requests' streams go on meanwhile).
        messages, pictures = await asyncio.to_thread(chat_images, messages)
        try:
            template_kwargs = req.template_kwargs()
            text = model.tokenizer.apply_chat_template(messages, tools=tools, **template_kwargs)
            prompt = model.tokenizer.encode(text)
            # Positions in the prompt with one pad per image (Model.request places them after the pads).
            boundaries = message_boundaries(model.tokenizer, messages, prompt, tools=tools, **template_kwargs)
        except (ValueError, MetalqwenError) as e:
            raise _Refused(400, str(e), "messages") from None
        # Each image's one pad becomes a pad per feature row when the engine thread runs the tower.
        length = len(prompt) + sum(image_tokens(p.height, p.width, model.vision.processor) - 1 for p in pictures)
        max_calls = 1 if req.parallel_tool_calls is False else None
        jobs = start(prompt, options(req, length, req.max_completion_tokens or req.max_tokens, boundaries, logprobs,
                                     forced_tool_call(req, tools, max_calls)), req.n, request, pictures)
        in_reasoning = text.rfind("<think>") > text.rfind("</think>")
        parsers = [OutputParser(in_reasoning, tools, max_calls) for _ in jobs]
        head = {"id": "chatcmpl-" + uuid.uuid4().hex, "created": int(time.time()), "model": model_id}

        def finish_reason(i: int) -> str:
            return "tool_calls" if parsers[i].calls else jobs[i].finish_reason

        def delta_json(d: Delta, first_index: int) -> dict:
            out: dict[str, Any] = {}
            if d.reasoning:
                out["reasoning_content"] = d.reasoning
            if d.content:
                out["content"] = d.content
            if d.tool_calls:
                out["tool_calls"] = [{"index": first_index + i, "id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for i, c in enumerate(d.tool_calls)]
            return out

        def parse(i: int, piece) -> Delta:
            """Choice i's next delta: its chunk parsed, or its end (piece None). With parallel_tool_calls
            false, the answer ends at its first tool call and its job is stopped."""
            parser = parsers[i]
            if piece is None:
                return parser.finish()
            d = parser.feed(piece.text)  # nothing once the parser is done
            jobs[i].cancelled = jobs[i].cancelled or parser.done
            return d

        if req.stream:
            async def events():
                chunk = {**head, "object": "chat.completion.chunk"}
                # The first chunk also says how long the prompt is (clients ignore the extra field;
                # the chat page shows it until the first token).
                yield sse({**chunk, "metalqwen": {"prompt_tokens": length},
                           "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None} for i in range(len(jobs))]})
                held = [[] for _ in jobs]  # tokens whose text the parser holds back: their logprobs go with the next delta

                def choice(i: int, delta: dict, finish: str | None) -> dict:
                    out = {"index": i, "delta": delta, "finish_reason": finish}
                    if logprobs is not None:  # a chunk with no token of its own carries none
                        out["logprobs"] = chat_logprobs(texts, held[i]) if held[i] else None
                        held[i].clear()
                    return out

                try:
                    async for i, piece in choices(jobs):
                        if piece is not None and parsers[i].done:
                            continue  # what the worker still sends after the answer ended
                        if logprobs is not None and piece is not None:
                            held[i].append(piece)
                        calls = parsers[i].calls
                        d = parse(i, piece)
                        if d or piece is None:
                            yield sse({**chunk, "choices": [choice(i, delta_json(d, calls),
                                                                   finish_reason(i) if piece is None else None)]})
                except _Refused as e:
                    yield sse(_error_body(str(e), e.param, e.kind))
                    return
                if req.stream_options and req.stream_options.include_usage:
                    yield sse({**chunk, "choices": [], "usage": usage(jobs)})
                yield sse("[DONE]")

            return StreamingResponse(events(), media_type="text/event-stream")

        totals = [Delta() for _ in jobs]
        pieces = [[] for _ in jobs]
        async for i, piece in choices(jobs):
            if piece is not None and parsers[i].done:
                continue
            if piece is not None:
                pieces[i].append(piece)
            d, total = parse(i, piece), totals[i]
            total.reasoning, total.content = total.reasoning + d.reasoning, total.content + d.content
            total.tool_calls += d.tool_calls

        def message(total: Delta) -> dict:
            out: dict[str, Any] = {"role": "assistant", "content": total.content or None}
            if total.reasoning:
                out["reasoning_content"] = total.reasoning
            if total.tool_calls:
                out["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in total.tool_calls]
            return out

        return {**head, "object": "chat.completion", "usage": usage(jobs),
                "choices": [{"index": i, "message": message(totals[i]), "finish_reason": finish_reason(i),
                             "logprobs": chat_logprobs(texts, pieces[i]) if logprobs is not None else None}
                            for i in range(len(jobs))]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        try:
            prompt = (model.tokenizer.encode(req.prompt) if isinstance(req.prompt, str)
                      else model.prompt_ids(req.prompt))
        except (ValueError, TypeError) as e:
            raise _Refused(400, str(e), "prompt") from None
        jobs = start(prompt, options(req, len(prompt), req.max_tokens or 16, logprobs=req.logprobs), req.n, request)
        legacy = [CompletionLogprobs(texts) for _ in jobs] if req.logprobs is not None else None
        head = {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
                "model": model_id}
        if req.stream:
            async def events():
                try:
                    async for i, piece in choices(jobs):
                        if piece is None:
                            yield sse({**head, "choices": [{"index": i, "text": "", "logprobs": None,
                                                            "finish_reason": jobs[i].finish_reason}]})
                        else:
                            yield sse({**head, "choices": [{"index": i, "text": piece.text,
                                                            "logprobs": legacy[i].add([piece]) if legacy else None,
                                                            "finish_reason": None}]})
                except _Refused as e:
                    yield sse(_error_body(str(e), e.param, e.kind))
                    return
                if req.stream_options and req.stream_options.include_usage:
                    yield sse({**head, "choices": [], "usage": usage(jobs)})
                yield sse("[DONE]")

            return StreamingResponse(events(), media_type="text/event-stream")
        pieces = [[] for _ in jobs]
        async for i, piece in choices(jobs):
            if piece is not None:
                pieces[i].append(piece)
        return {**head, "usage": usage(jobs),
                "choices": [{"index": i, "text": "".join(p.text for p in pieces[i]),
                             "logprobs": legacy[i].add(pieces[i]) if legacy else None,
                             "finish_reason": jobs[i].finish_reason} for i in range(len(jobs))]}

    return app
