"""The OpenAI request schema the server accepts (pydantic), its translation into the engine's SamplingParams,
and OpenAI's error body.

Accepted and used: model, prompt (text, token ids, or a list of either) / messages, max_tokens
(max_completion_tokens for chat), n, temperature, top_p, stop, seed, presence_penalty, frequency_penalty,
logprobs (completions: the number of top alternatives; chat: a flag with top_logprobs), stream,
stream_options.include_usage, and the engine's extras top_k, min_p, repetition_penalty, ignore_eos,
skip_special_tokens, chat_template_kwargs (e.g. ``{"enable_thinking": false}``). Other OpenAI fields are
accepted and ignored (``extra="allow"``), as other OpenAI-compatible servers do, so clients that send them work.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vkc_engine.sampler import MAX_LOGPROBS, SamplingParams

__all__ = ["APIError", "error_body", "CompletionRequest", "ChatCompletionRequest", "sampling_params"]


class APIError(Exception):
    """An error answered in OpenAI's format: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=10)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    user: str | None = None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _nonempty(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        return v

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def as_template_input(self) -> dict:
        """The message for the chat template: text parts of a content list joined (images are not supported)."""
        d = self.model_dump(exclude_none=True)
        c = self.content
        if isinstance(c, list):
            parts = []
            for part in c:
                if part.get("type") != "text":
                    raise APIError(400, f"message content part of type {part.get('type')!r} is not supported "
                                        "(text only)", param="messages")
                parts.append(str(part.get("text", "")))
            d["content"] = "".join(parts)
        elif c is None:
            d["content"] = ""
        return d


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


def sampling_params(req: _Common, max_tokens: int, logprobs: int | None, index: int) -> SamplingParams:
    """The engine's parameters for choice ``index`` of a request (a seeded request's choices take seed + index,
    so the n choices differ and the request repeats)."""
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0,
        min_p=req.min_p or 0.0, max_tokens=max_tokens, seed=None if req.seed is None else req.seed + index,
        stop=req.stop, stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos,
        skip_special_tokens=req.skip_special_tokens, repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty, logprobs=logprobs)

