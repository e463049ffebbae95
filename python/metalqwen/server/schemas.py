"""The request bodies of the OpenAI API routes the server offers, as pydantic models.

Unknown fields are ignored (clients send many); known fields are checked by type and
range, and a failure becomes a 400 naming the field (see app.py). Fields the engine
cannot honour yet are refused when set to anything but their neutral value, rather than
silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .. import sampling


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _logprobs(value: int | None, name: str) -> int | None:
    """Top entries per token, checked as Model.stream checks ``logprobs`` (None: the field is absent)."""
    if value is not None:
        try:
            sampling.check_logprobs(value, name)
        except TypeError as e:  # pydantic reports ValueErrors (a 400 naming the field)
            raise ValueError(str(e)) from None
    return value


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str
    arguments: str = "{}"


class ToolCallIn(_Body):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[dict[str, Any]], None] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCallIn]] = None
    tool_call_id: Optional[str] = None
    name: Optional[str] = None

    @field_validator("content")
    @classmethod
    def _parts(cls, content):
        """Text parts are joined into one string; with image_url parts the list stays (text and image
        parts in order; the app resolves the images)."""
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                kind = part.get("type")
                if kind == "text":
                    parts.append({"type": "text", "text": TextPart(**part).text})
                elif kind == "image_url":
                    parts.append(part)
                else:
                    raise ValueError(f"content[{j}]: content parts of type {kind!r} are not supported "
                                     f"(text and image_url)")
            if all(p["type"] == "text" for p in parts):
                return "".join(p["text"] for p in parts)
            return parts
        return content

    @model_validator(mode="after")
    def _has_content(self):
        text = self.content if isinstance(self.content, str) or self.content is None else "image"
        if not (text or "").strip() and not self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs some content")
        return self

    def for_template(self) -> dict:
        """The message as chat templates read it (tool-call arguments parsed back to objects)."""
        import json

        out = {"role": "system" if self.role == "developer" else self.role, "content": self.content or ""}
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            calls = []
            for c in self.tool_calls:
                try:
                    args = json.loads(c.function.arguments or "{}")
                except ValueError:
                    raise ValueError(f"tool call {c.function.name}: arguments are not JSON") from None
                calls.append({"type": "function", "function": {"name": c.function.name, "arguments": args}})
            out["tool_calls"] = calls
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class Function(_Body):
    name: str = Field(min_length=1)
    description: Optional[str] = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, schema):
        if schema.get("type", "object") != "object" or not isinstance(schema.get("properties", {}), dict):
            raise ValueError("parameters must be a JSON schema of type object with a properties object")
        return schema


class Tool(_Body):
    type: Literal["function"]
    function: Function


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """Fields both routes share. None means: the folder's generation_config.json default."""

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    # The sampling fields, checked by sampling.check_field (_sampling below) as Model.stream checks them.
    temperature: Optional[float] = Field(default=None, le=2)  # the OpenAI API's bound on top of the shared check
    top_p: Optional[float] = None
    top_k: Optional[int] = None  # -1 is off too, as vLLM takes it
    min_p: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    n: int = Field(default=1, ge=1)  # choices: one job each (in shared steps with --max-sequences > 1)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    # Structured output: {"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": ...}};
    # the schema itself is compiled (and refused when llguidance cannot) by the route.
    response_format: Optional[dict[str, Any]] = None
    # token id (a decimal string, as JSON keys are) -> bias in [-100, 100]; ids checked against the vocabulary by the route
    logit_bias: Optional[dict[str, float]] = None
    # OpenAI fields that would change the output and that this server does not do yet: refused
    # (a 400 naming the field) unless absent or neutral, never silently ignored.
    best_of: Optional[int] = None

    @field_validator(*sampling.FIELDS)
    @classmethod
    def _sampling(cls, value, info):
        if value is None or info.field_name == "top_k" and value == -1:
            return value
        try:
            sampling.check_field(info.field_name, value)
        except TypeError as e:  # pydantic reports ValueErrors (a 400 naming the field)
            raise ValueError(str(e)) from None
        return value

    @field_validator("response_format")
    @classmethod
    def _format(cls, value):
        if value is None:
            return value
        kind = value.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(f"type {kind!r} is not one of 'text', 'json_object', 'json_schema'")
        spec = value.get("json_schema")
        if kind == "json_schema" and not (isinstance(spec, dict) and isinstance(spec.get("schema", {}), dict)):
            raise ValueError("json_schema must be an object with a 'schema' object (the JSON schema)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value):
        if value:
            try:  # ids are checked against the vocabulary by the route (sampling.check_logit_bias again)
                sampling.check_logit_bias(value, 2**32)
            except TypeError as e:  # pydantic reports ValueErrors (a 400 naming the field)
                raise ValueError(str(e)) from None
        return value

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, value):
        if value not in (None, 1):
            raise ValueError("best_of above 1 is not supported yet")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop):
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > 4 or not all(stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict, None] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # Qwen3.5 thinks or does not: "none"/"minimal" turn thinking off, "low" up to "max" leave it on.
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]] = None
    parallel_tool_calls: Optional[bool] = None  # false: the answer ends at its first tool call
    functions: Optional[list[dict[str, Any]]] = None  # the API's deprecated forms of tools
    function_call: Union[str, dict, None] = None
    modalities: Optional[list[str]] = None
    audio: Optional[dict[str, Any]] = None
    prediction: Optional[dict[str, Any]] = None
    web_search_options: Optional[dict[str, Any]] = None
    moderation: Optional[dict[str, Any]] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None  # "medium": OpenAI's default, what Qwen does

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, value):
        return _logprobs(value, "top_logprobs")

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value):
        if isinstance(value, dict):
            function = value.get("function")
            if value.get("type") != "function" or not isinstance(function, dict) or \
                    not isinstance(function.get("name"), str) or not function["name"]:
                raise ValueError('a named tool_choice is {"type": "function", "function": {"name": "..."}}')
        return value

    def forced_tool(self) -> tuple[bool, str | None]:
        """(whether the answer must be a tool call, the tool it must call or None for any):
        tool_choice "required" or a named function."""
        if isinstance(self.tool_choice, dict):
            return True, self.tool_choice["function"]["name"]
        return self.tool_choice == "required", None

    @field_validator("functions", "function_call", "audio", "prediction")
    @classmethod
    def _not_yet(cls, value, info):
        if value:
            raise ValueError(f"{info.field_name} is not supported (use tools)" if info.field_name.startswith("function")
                             else f"{info.field_name} is not supported yet")
        return value

    @field_validator("web_search_options", "moderation")
    @classmethod
    def _no_service(cls, value, info):
        if value is not None:  # even {}: it asks for the service with its defaults
            raise ValueError(f"{info.field_name} is not supported (no web search or moderation here)")
        return value

    @field_validator("verbosity")
    @classmethod
    def _medium(cls, value):
        if value not in (None, "medium"):
            raise ValueError(f"{value!r} is not supported (the model has no verbosity switch; leave it out or "
                             "'medium')")
        return value

    @field_validator("modalities")
    @classmethod
    def _text_out(cls, value):
        if value and value != ["text"]:
            raise ValueError("only ['text'] is supported")
        return value

    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's variables: chat_template_kwargs, with reasoning_effort as enable_thinking
        unless those set it."""
        out = dict(self.chat_template_kwargs)
        if self.reasoning_effort is not None:
            out.setdefault("enable_thinking", self.reasoning_effort not in ("none", "minimal"))
        return out


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int]]
    logprobs: Optional[int] = None  # the legacy integer: top entries per token
    echo: bool = False
    suffix: Optional[str] = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, value):
        return _logprobs(value, "logprobs")

    @model_validator(mode="after")
    def _checks(self):
        if self.echo or self.suffix:
            raise ValueError("echo and suffix are not supported yet by this server")
        if isinstance(self.prompt, str) and not self.prompt or isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is empty")
        return self
