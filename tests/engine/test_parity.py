"""Greedy outputs of our engine equal transformers' generate(), token for token."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from engine import LLMEngine, RequestOutput, SamplingParams
from engine.cpu_linear import EVERY_ROW_COUNT
from engine.model import Linear
from tests.engine.conftest import PARITY_CONFIGS, Checkpoint, tiny_model

NEW_TOKENS = 32


def ragged_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in (1, 5, 16, 17, 64, 130, 255, 300)]


def shared_prefix_prompts(prompts: list[list[int]]) -> list[list[int]]:
    base = prompts[-1]
    return [
        base,  # all of it cached but the last block
        base[:160] + prompts[2],
        base[:160] + prompts[4],
        base[:33],
        prompts[5] + base[:40],
        base[:200] + prompts[1],
    ]


def assert_parity(engine: LLMEngine, checkpoint: Checkpoint, prompts: list[list[int]]) -> list[RequestOutput]:
    outputs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.token_ids == checkpoint.greedy(prompt, NEW_TOKENS), f"prompt of {len(prompt)} tokens"
    return outputs


# Both sides in float32 on either device: in bfloat16 transformers' own batched and one-at-a-time
# generation differ (1 prompt of 16 alike on an H200), its rounding breaking near-ties.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_speculative_tokens", [0, 4])
def test_greedy_parity_with_shared_prefixes(
    parity_checkpoint: Checkpoint, num_speculative_tokens: int, device: str
) -> None:
    reference = parity_checkpoint.on(device)
    prompts = ragged_prompts(reference.hf_model.config.vocab_size)
    options = dict(max_num_batched_tokens=256, num_speculative_tokens=num_speculative_tokens)
    with LLMEngine.from_pretrained(str(reference.path), device=device, dtype="float32", **options) as engine:
        assert_parity(engine, reference, prompts)
        outputs = assert_parity(engine, reference, shared_prefix_prompts(prompts))
        assert outputs[0].num_cached_tokens == (300 - 1) // 16 * 16
        assert all(o.num_cached_tokens > 0 for o in outputs)
        assert engine.core.kv_pool.num_free_blocks == engine.core.kv_pool.num_blocks
        # random weights repeat themselves: most drafts are right, and each is checked above
        assert (engine.figures().activity.draft_tokens.accepted > 0) == (num_speculative_tokens > 0)


@pytest.mark.parametrize("num_speculative_tokens", [0, 4])
def test_greedy_parity_of_a_next_turn_on_the_last_turns_partial_block(
    parity_checkpoint: Checkpoint, num_speculative_tokens: int
) -> None:
    vocab_size = parity_checkpoint.hf_model.config.vocab_size
    first_turns = ragged_prompts(vocab_size, seed=2)[3:6]  # 17, 64 and 130 tokens
    with LLMEngine.from_pretrained(
        str(parity_checkpoint.path), num_speculative_tokens=num_speculative_tokens
    ) as engine:
        answers = assert_parity(engine, parity_checkpoint, first_turns)
        next_turns = [p + a.token_ids + [7, 8, 9] for p, a in zip(first_turns, answers, strict=True)]
        outputs = assert_parity(engine, parity_checkpoint, next_turns)
        # every token whose KV the first turn computed (all but its last) serves the next one
        expected = [len(p) + len(a.token_ids) - 1 for p, a in zip(first_turns, answers, strict=True)]
        assert [o.num_cached_tokens for o in outputs] == expected
        assert engine.core.kv_pool.num_free_blocks == engine.core.kv_pool.num_blocks


def test_greedy_parity_under_preemption(parity_checkpoint: Checkpoint) -> None:
    vocab_size = parity_checkpoint.hf_model.config.vocab_size
    prompts = ragged_prompts(vocab_size, seed=1)
    # 40 blocks of 16 tokens for ~1000 prompt tokens plus 8 x 32 generated ones
    options = dict(kv_cache_tokens=640, max_num_batched_tokens=128)
    with LLMEngine.from_pretrained(str(parity_checkpoint.path), **options) as engine:
        assert_parity(engine, parity_checkpoint, prompts + shared_prefix_prompts(prompts)[1:3])
        assert engine.figures().requests.preemptions > 0
        assert engine.core.kv_pool.num_free_blocks == engine.core.kv_pool.num_blocks


@pytest.mark.parametrize("config", ["gqa1-tied", "gqa4-untied-hd32"])
def test_greedy_parity_of_a_bfloat16_checkpoint_run_in_float32(tmp_path: Path, config: str) -> None:
    tiny_model(**PARITY_CONFIGS[config]).bfloat16().save_pretrained(tmp_path)
    # the reference loads it as our engine does on CPU: in float32, the same values
    checkpoint = Checkpoint(tmp_path, AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval())
    with LLMEngine.from_pretrained(str(tmp_path), num_speculative_tokens=4) as engine:
        head = engine.core.runner.greedy_head
        assert head is not None and head.screened, "greedy steps screen the LM head"
        assert_parity(engine, checkpoint, ragged_prompts(PARITY_CONFIGS[config]["vocab_size"]))


def chat_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    """The chat template's prompt for one question, ready for the answer."""
    messages = [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": question},
    ]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


@pytest.mark.downloads_model
def test_greedy_parity_on_the_real_smollm2_weights(smollm2_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    reference = Checkpoint(smollm2_dir, AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval())
    questions = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "Explain in two sentences what a compiler does.",
        "List three prime numbers.",
    ]
    first_turns = [chat_prompt(tokenizer, question) for question in questions]
    # 64-token chunks: the longer prompts are prefilled over several steps, beside other decodes
    with LLMEngine.from_pretrained(str(smollm2_dir), max_num_batched_tokens=64) as engine:
        answers = assert_parity(engine, reference, first_turns)
        # the next turn continues the ids the model saw and wrote, as the chat history does
        chat_format = engine.chat_format()
        next_question = [*chat_format.message("user", "And why?"), *chat_format.generation_prompt]
        follow_ups = [
            [*prompt[: -len(chat_format.generation_prompt)], *chat_format.reply(answer.token_ids), *next_question]
            for prompt, answer in zip(first_turns, answers, strict=True)
        ]
        outputs = assert_parity(engine, reference, follow_ups)
        assert all(o.num_cached_tokens >= len(p) // 16 * 16 for o, p in zip(outputs, first_turns, strict=True))
        # the answers repeat words of the questions and of themselves: drafts were verified too
        assert engine.figures().activity.draft_tokens.accepted > 0


@pytest.mark.parametrize("mkl_max_rows", [0, 8, EVERY_ROW_COUNT], ids=["oneDNN", "MKL-up-to-8-rows", "MKL"])
def test_greedy_parity_whichever_library_computes_the_projections(
    parity_checkpoint: Checkpoint, mkl_max_rows: int
) -> None:
    """The engine times MKL against oneDNN at start, so either may compute any projection."""
    with LLMEngine.from_pretrained(str(parity_checkpoint.path), max_num_batched_tokens=64) as engine:
        model = engine.core.runner.model
        for module in model.modules():
            if isinstance(module, Linear):
                module.mkl_max_rows = mkl_max_rows
        model.lm_head_mkl_max_rows = mkl_max_rows
        assert_parity(engine, parity_checkpoint, ragged_prompts(parity_checkpoint.hf_model.config.vocab_size, seed=3))
