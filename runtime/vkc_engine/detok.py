"""Incremental detokenization for streaming: new text per generated token, never a broken UTF-8 character.

Byte-level BPE tokens can end in the middle of a multi-byte character (the decoder then yields U+FFFD), and a
token's text can depend on its left neighbour (leading spaces). So each step decodes a short window of tokens
twice -- up to the last emitted token and up to the newest -- and emits the difference once it no longer ends
in U+FFFD. The concatenation of the deltas equals decoding all generated tokens at once.
"""
from __future__ import annotations

__all__ = ["IncrementalDetokenizer"]

_CONTEXT = 6  # tokens of left context kept in the window


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids = list(prompt_ids[-_CONTEXT:])
        self.prefix = 0              # window start
        self.read = len(self.ids)    # tokens already turned into text

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def step(self, token: int) -> str:
        """Append one token; return the text it completes ('' while a character is still partial)."""
        self.ids.append(int(token))
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        if not after.startswith(before):  # a merge changed the earlier text: emit nothing, keep the window
            return ""
        new = after[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        if self.prefix > _CONTEXT:
            drop = self.prefix - _CONTEXT
            self.ids = self.ids[drop:]
            self.prefix -= drop
            self.read -= drop
        return new
