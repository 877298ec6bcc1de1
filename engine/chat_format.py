from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from jinja2 import TemplateError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Speaker = Literal["system", "user", "assistant"]
# Plain words every tokenizer keeps whole enough to be found again in the rendered template.
PLACEHOLDERS: dict[Speaker, str] = {"system": "SYSTEMTEXT", "user": "USERTEXT", "assistant": "ASSISTANTTEXT"}
PROBE: list[Speaker] = ["system", "user", "assistant", "user"]
# The call of the probes that learn how a template writes tool calls.
PROBE_TOOL = "TOOLNAME"
PROBE_CALL = {"type": "function", "function": {"name": PROBE_TOOL, "arguments": {}}}
NO_TOOL_SUPPORT = "this model's chat template has no tool support"

# the token that closes a thinking model's think block, and its text
THINK_END = "</think>"


class NoToolSupport(ValueError):
    """The chat template does not render tools, or not in a way that can be framed message by message."""


@dataclass(frozen=True)
class Frame:
    """How the template wraps one speaker's text: control tokens, then plain text that is
    tokenized together with the message (`user\\n` in ChatML), the message, then control tokens."""

    open_ids: tuple[int, ...]
    open_text: str
    close_ids: tuple[int, ...]
    # The same as the template renders it, to cut the message's text out of rendered conversations.
    opening: str
    closing: str


@dataclass(frozen=True)
class ChatFormat:
    """A checkpoint's chat framing as token ids, learned once from its own chat template.

    A message's ids are exactly what the template renders for it, so a prompt built from framed
    messages equals the template's (checked when the format is learned). Messages are framed one by
    one and never re-rendered: a conversation's ids only grow, which the prefix cache relies on.
    """

    tokenizer: PreTrainedTokenizerBase
    frames: dict[Speaker, Frame]
    # What the template puts first when a conversation has no system message: SmolLM2's default
    # system prompt; nothing for Qwen3.
    preamble: tuple[int, ...]
    generation_prompt: tuple[int, ...]
    eos_token_ids: frozenset[int]
    # Qwen3's `</think>`: where a thinking model's hidden reasoning ends; None for other models
    think_end: int | None
    enable_thinking: bool

    @classmethod
    def for_tokenizer(
        cls, tokenizer: PreTrainedTokenizerBase, *, enable_thinking: bool = False, eos_token_ids: Iterable[int] = ()
    ) -> ChatFormat:
        """Renders a probe conversation with the tokenizer's template and cuts it at the messages.

        `eos_token_ids`: the ids the engine stops on, besides the end-of-turn and EOS tokens.
        Raises ValueError when the template cannot be reproduced message by message.
        """
        if not tokenizer.chat_template:
            raise ValueError("the tokenizer has no chat template")
        messages = [{"role": speaker, "content": PLACEHOLDERS[speaker]} for speaker in PROBE]
        rendered = _render(tokenizer, messages, enable_thinking)
        befores, after = _cut(rendered, [PLACEHOLDERS[speaker] for speaker in PROBE])
        if befores[3] != befores[1]:
            raise ValueError("the chat template frames the same speaker differently from turn to turn")
        opening = _render(tokenizer, messages[:2], enable_thinking, add_generation_prompt=True)
        closed = _render(tokenizer, messages[:2], enable_thinking)
        assert opening.startswith(closed), "the generation prompt is appended to the conversation"
        added_tokens = _added_tokens_pattern(tokenizer)
        frames = {
            speaker: _frame(tokenizer, added_tokens, before, after)
            for speaker, before in zip(PROBE, befores, strict=True)
        }
        end_of_turn = frames["assistant"].close_ids[0]
        think_end = tokenizer.get_vocab().get(THINK_END)
        without_system = _template_ids(tokenizer, messages[1:2], enable_thinking)
        first_user = _message(tokenizer, frames["user"], PLACEHOLDERS["user"])
        if without_system[len(without_system) - len(first_user) :] != first_user:
            raise ValueError("the chat template frames a first user message differently")
        chat_format = cls(
            tokenizer=tokenizer,
            frames=frames,
            preamble=tuple(without_system[: len(without_system) - len(first_user)]),
            generation_prompt=tuple(_encode_template(tokenizer, opening[len(closed) :])),
            eos_token_ids=frozenset({end_of_turn, *eos_token_ids} | {tokenizer.eos_token_id} - {None}),
            think_end=think_end,
            enable_thinking=enable_thinking,
        )
        built = [*chat_format.message("system", PLACEHOLDERS["system"])]
        for speaker in PROBE[1:]:
            built += chat_format.message(speaker, PLACEHOLDERS[speaker])
        expected = _template_ids(tokenizer, messages, enable_thinking, add_generation_prompt=True)
        if built + list(chat_format.generation_prompt) != expected:
            raise ValueError("the chat template's ids cannot be built message by message")
        return chat_format

    def encode(self, text: str) -> list[int]:
        """Plain text's ids: a control token someone typed stays text, never a control token."""
        return _encode(self.tokenizer, text)

    def decode(self, token_ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(token_ids))
        assert isinstance(text, str)  # one sequence in, one text out
        return text

    def message(self, speaker: Speaker, text: str) -> list[int]:
        """The ids of one framed message."""
        return _message(self.tokenizer, self.frames[speaker], text)

    def system(self, text: str) -> list[int]:
        """What opens a conversation whose system prompt is `text`; "" is no system message."""
        return self.message("system", text) if text else list(self.preamble)

    def reply(self, generated_ids: Sequence[int]) -> list[int]:
        """The ids of an assistant message whose body the engine generated after the generation prompt."""
        body = list(generated_ids)
        while body and body[-1] in self.eos_token_ids:
            body.pop()
        return [*self.generation_prompt, *body, *self.frames["assistant"].close_ids]

    def prompt(self, system: str, user: str) -> list[int]:
        """A one-question conversation, ready for the model's answer."""
        return [*self.system(system), *self.message("user", user), *self.generation_prompt]

    # --- tools (OpenAI's function calling): what the template writes, as texts to frame as above ---
    # Each raises NoToolSupport when the template does not write it that way.

    def tools_system(self, system: str, tools: Sequence[Mapping[str, Any]]) -> str:
        """The system message's text once the model may call `tools` (OpenAI function definitions):
        the template writes the tool list into it, so `system()` of this text opens a conversation as
        the template does."""
        user = {"role": "user", "content": PLACEHOLDERS["user"]}
        messages = [{"role": "system", "content": system}, user] if system else [user]
        rendered = self._render_tools(messages, tools)
        if rendered == self._render_tools(messages):
            raise NoToolSupport(NO_TOOL_SUPPORT)
        system_frame, user_frame = self.frames["system"], self.frames["user"]
        head = system_frame.opening
        tail = system_frame.closing + user_frame.opening + PLACEHOLDERS["user"] + user_frame.closing
        if not (rendered.startswith(head) and rendered.endswith(tail)):
            raise NoToolSupport("this model's chat template puts the tool list elsewhere than in the system message")
        return rendered[len(head) : len(rendered) - len(tail)]

    def assistant_with_calls(self, content: str, calls: Sequence[Mapping[str, Any]]) -> str:
        """The text of an assistant message that says `content` and makes `calls` (OpenAI
        `tool_calls`), written as the template writes them: what the model would have written."""
        user = {"role": "user", "content": PLACEHOLDERS["user"]}
        said = self._render_tools([user, {"role": "assistant", "content": content}])
        called = self._render_tools([user, {"role": "assistant", "content": content, "tool_calls": list(calls)}])
        closing = self.frames["assistant"].closing
        cut = len(said) - len(closing)
        if called == said or not (called.startswith(said[:cut]) and called.endswith(closing)):
            raise NoToolSupport(NO_TOOL_SUPPORT)
        return content + called[cut : len(called) - len(closing)]

    def tool_results(self, results: Sequence[str]) -> str:
        """The text of the user message that carries consecutive tool results, as the template
        writes them (Qwen3: each in <tool_response> tags, together in one user turn)."""
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": PLACEHOLDERS["user"]},
            {"role": "assistant", "content": PLACEHOLDERS["assistant"], "tool_calls": [PROBE_CALL]},
            *({"role": "tool", "content": result} for result in results),
        ]
        rendered = self._render_tools(messages)
        closing, user = self.frames["assistant"].closing, self.frames["user"]
        turn = rendered[rendered.find(closing, rendered.find(PLACEHOLDERS["assistant"])) + len(closing) :]
        if not (turn.startswith(user.opening) and turn.endswith(user.closing)):
            raise NoToolSupport(NO_TOOL_SUPPORT)
        return turn[len(user.opening) : len(turn) - len(user.closing)]

    def tool_call_opening(self, function: str | None = None) -> str:
        """How the template starts a tool call: the text before the call's JSON object, or with
        `function`, up to where that function's arguments go. A reply that must call a tool (that
        function) starts with it."""
        calls = self.assistant_with_calls("", [PROBE_CALL])
        name = calls.find(PROBE_TOOL)
        start = calls.rfind("{", 0, name)  # the call's JSON object
        arguments = calls.find("{}", name)
        if min(name, start, arguments) < 0:
            raise NoToolSupport("this model's chat template writes tool calls in a form that cannot be started")
        return calls[:start] if function is None else calls[:arguments].replace(PROBE_TOOL, function)

    def _render_tools(self, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        try:
            return _render(self.tokenizer, messages, self.enable_thinking, tools=tools)
        except TemplateError as exc:  # the template's raise_exception: it refuses these messages
            raise NoToolSupport(f"{NO_TOOL_SUPPORT} ({exc})") from None


def _render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    enable_thinking: bool,
    add_generation_prompt: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    text = tokenizer.apply_chat_template(
        messages,
        tools=[dict(tool) for tool in tools] if tools else None,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        tokenize=False,
    )
    assert isinstance(text, str)
    return text


def _template_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, str]],
    enable_thinking: bool,
    add_generation_prompt: bool = False,
) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        tokenize=True,
        return_dict=False,
    )
    return list(ids)


def _message(tokenizer: PreTrainedTokenizerBase, frame: Frame, text: str) -> list[int]:
    return [*frame.open_ids, *_encode(tokenizer, frame.open_text + text), *frame.close_ids]


def _cut(rendered: str, placeholders: list[str]) -> tuple[list[str], str]:
    """The text before each placeholder (what follows the previous message taken off) and the text
    after every message, read off the end of the conversation."""
    pieces = []
    position = 0
    for placeholder in placeholders:
        found = rendered.find(placeholder, position)
        if found < 0:
            raise ValueError(f"the chat template does not render message text as given ({placeholder!r} is lost)")
        pieces.append(rendered[position:found])
        position = found + len(placeholder)
    after = rendered[position:]
    if not after:
        raise ValueError("the chat template closes no message")
    for piece in pieces[1:]:
        if not piece.startswith(after):
            raise ValueError("the chat template closes messages differently from speaker to speaker")
    return [pieces[0], *(piece[len(after) :] for piece in pieces[1:])], after


def _frame(tokenizer: PreTrainedTokenizerBase, added_tokens: re.Pattern[str], before: str, after: str) -> Frame:
    controls = list(added_tokens.finditer(before))
    split = controls[-1].end() if controls else 0
    first_control = added_tokens.search(after)
    if first_control is None or first_control.start() != 0:
        # a reply is closed right after the ids the model generated: no text may come between
        raise ValueError("the chat template does not close a message with a control token")
    return Frame(
        open_ids=tuple(_encode_template(tokenizer, before[:split])),
        open_text=before[split:],
        close_ids=tuple(_encode_template(tokenizer, after)),
        opening=before,
        closing=after,
    )


def _added_tokens_pattern(tokenizer: PreTrainedTokenizerBase) -> re.Pattern[str]:
    tokens = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    if not tokens:
        raise ValueError("the tokenizer has no control tokens to frame messages with")
    return re.compile("|".join(map(re.escape, tokens)))


def _encode_template(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Template text's ids, its control tokens parsed: what apply_chat_template produces."""
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    ids: list[int] = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids
