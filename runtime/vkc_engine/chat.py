"""Chat templates: an HF model directory's Jinja chat template (``chat_template.jinja``, or ``chat_template``
in ``tokenizer_config.json``) rendered with jinja2's sandbox, the way HF tokenizers render it (trim_blocks,
lstrip_blocks, ``raise_exception``, ``tojson``)."""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["ChatTemplateError", "load_chat_template", "render_chat"]


class ChatTemplateError(ValueError):
    """No chat template, or the template refused the messages."""


def load_chat_template(model_dir) -> str | None:
    d = Path(model_dir)
    f = d / "chat_template.jinja"
    if f.is_file():
        return f.read_text()
    cfg = d / "tokenizer_config.json"
    if cfg.is_file():
        t = json.loads(cfg.read_text()).get("chat_template")
        if isinstance(t, list):  # named templates: take "default"
            t = next((x.get("template") for x in t if x.get("name") == "default"), None)
        return t
    return None


def render_chat(template: str | None, messages: list[dict], *, add_generation_prompt: bool = True,
                **kwargs) -> str:
    """The prompt text for ``messages`` ([{"role": ..., "content": ...}, ...])."""
    if not template:
        raise ChatTemplateError("the model directory has no chat template (chat_template.jinja or "
                                "tokenizer_config.json's chat_template)")
    from jinja2 import TemplateError  # noqa: PLC0415
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

    def raise_exception(msg):
        raise ChatTemplateError(f"chat template: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent, ensure_ascii=False)
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **kwargs)
    except TemplateError as e:
        raise ChatTemplateError(f"chat template: {e}") from None
