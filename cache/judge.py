"""The last check of a semantic candidate: the model's own yes or no."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from engine import ChatFormat, Engine, SamplingParams

Judge = Callable[[str, str], Awaitable[bool]]
"""judge(question_a, question_b) -> do they ask for the same answer?"""

JUDGE_PROMPT = (
    "You decide whether two questions ask for the same answer. They do not if they differ in a "
    "place, a person, a number, a date, a negation or a direction. Reply with yes or no only."
)
# "yes" or "no", and room for the tokenizer to split it.
ANSWER_TOKENS = 3


class LLMJudge:
    """Asks the served model; `chat_format` should have thinking off, so the answer comes first."""

    def __init__(self, engine: Engine, chat_format: ChatFormat) -> None:
        self.engine = engine
        self.chat_format = chat_format

    async def __call__(self, question_a: str, question_b: str) -> bool:
        prompt = self.chat_format.prompt(
            JUDGE_PROMPT, f"Question A: {question_a}\nQuestion B: {question_b}\nSame answer?"
        )
        params = SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS)
        answer = "".join([delta.text async for delta in self.engine.stream(prompt, params)])
        return answer.strip().lower().startswith("yes")
