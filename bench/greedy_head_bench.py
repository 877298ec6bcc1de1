"""The greedy head's screen alone (engine/greedy_head.c), as built here, against the screen a CPU
without AVX2 or AVX512-VNNI builds, which widens each 8-bit value of the LM head to a float
(-DGREEDY_HEAD_WIDENED).

    python bench/greedy_head_bench.py [--data-dir DIR]   # SmolLM2 from DIR/models (default: data)
    python bench/greedy_head_bench.py --quick            # 8 rows, a few calls: a smoke test

Built here with AVX2 or AVX512-VNNI, the screen rounds the hidden rows to 8 bits as well (but for a
few values far past the rest) and multiplies four 8-bit values at once. The rows: the final hidden
states of greedy replies (24 tokens) to 6 chat questions framed as the app frames them (its default
system prompt, each model's chat template), on the demo model (LM head 151,936 x 128) and on
SmolLM2 (49,152 x 576). For 1, 8, 16 and 40 rows at a time, 40 calls of each build, alternated 5
times, on torch's threads; the median ms a call and how many times faster the native build is.
Both picks are checked against argmax over the logits. The last line is JSON.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import ChatFormat, kernels
from engine.builtin_models import DEMO_MODEL, SMOLLM2_MODEL, ensure_demo_model, ensure_smollm2
from engine.greedy_head import GreedyHead
from settings.sections import ContextSettings

QUESTIONS = (
    "How do I reset my password?",
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain what a hash table is.",
    "How many days are in a leap year?",
    "Give me three tips for a job interview.",
)
SYSTEM_PROMPT = ContextSettings().system_prompt
ROWS, QUICK_ROWS = (1, 8, 16, 40), (8,)
CALLS, QUICK_CALLS = 40, 2
ROUNDS, QUICK_ROUNDS = 5, 1


def reply_hidden_states(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The LM head of the checkpoint at `path`, and the final hidden states from which it picked
    each token of its greedy replies to QUESTIONS."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    chat_format = ChatFormat.for_tokenizer(AutoTokenizer.from_pretrained(path))
    rows = []
    for question in QUESTIONS:
        prompt = torch.tensor([chat_format.prompt(SYSTEM_PROMPT, question)])
        output = model.generate(prompt, max_new_tokens=24, do_sample=False)
        hidden = model(output, output_hidden_states=True).hidden_states[-1][0]
        rows.append(hidden[prompt.shape[1] - 1 : -1])
    return model.lm_head.weight.detach().contiguous(), torch.cat(rows).contiguous()


def widened_head(weight: torch.Tensor) -> GreedyHead:
    """A GreedyHead on the kernels built with GREEDY_HEAD_WIDENED, kept apart from the engine's."""
    native = kernels.COMPILE
    kernels.COMPILE = (*native, "-DGREEDY_HEAD_WIDENED")
    kernels.library.cache_clear()
    try:
        return GreedyHead(weight)
    finally:
        kernels.COMPILE = native
        kernels.library.cache_clear()


def ms_a_call(head: GreedyHead, hidden: torch.Tensor, calls: int) -> float:
    head(hidden)
    start = time.perf_counter()
    for _ in range(calls):
        head(hidden)
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="engine.data_dir, where the models are")
    parser.add_argument("--quick", action="store_true", help="8 rows, a few calls: a smoke test")
    args = parser.parse_args()
    row_counts, calls, rounds = (QUICK_ROWS, QUICK_CALLS, QUICK_ROUNDS) if args.quick else (ROWS, CALLS, ROUNDS)
    torch.set_grad_enabled(False)
    library = kernels.library()
    if library is None or library.greedy_head_group() == 1:
        print("the native build widens each value already (no AVX2 or AVX512-VNNI here, or no C compiler)")
        print(json.dumps({"speedup_by_rows": {}, "parity": True}))
        return
    speedups: dict[str, dict[str, float]] = {}
    parity = True
    for name, path in ((DEMO_MODEL, ensure_demo_model(args.data_dir)), (SMOLLM2_MODEL, ensure_smollm2(args.data_dir))):
        weight, hidden = reply_hidden_states(path)
        native, widened = GreedyHead(weight), widened_head(weight)
        expected = (hidden @ weight.T).argmax(dim=-1).tolist()
        parity = parity and native(hidden).tolist() == widened(hidden).tolist() == expected
        print(f"\n{name}: LM head {weight.shape[0]:,} x {weight.shape[1]}, {len(hidden)} rows; median ms a call")
        print(f"{'rows':>6} {'native':>8} {'widened':>8} {'speedup':>8}")
        speedups[name] = {}
        for num_rows in row_counts:
            rows = hidden[:num_rows].contiguous()
            times: dict[str, list[float]] = {"native": [], "widened": []}
            for _ in range(rounds):
                times["native"].append(ms_a_call(native, rows, calls))
                times["widened"].append(ms_a_call(widened, rows, calls))
            native_ms, widened_ms = statistics.median(times["native"]), statistics.median(times["widened"])
            speedups[name][str(num_rows)] = round(widened_ms / native_ms, 2)
            print(f"{num_rows:>6} {native_ms:>8.2f} {widened_ms:>8.2f} {widened_ms / native_ms:>7.2f}x")
    print(f"\nthe same picks as argmax over the logits, both builds: {parity}")
    print(json.dumps({"speedup_by_rows": speedups, "parity": parity}))


if __name__ == "__main__":
    main()
