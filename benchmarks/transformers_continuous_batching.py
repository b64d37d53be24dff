"""transformers' own continuous batching (``model.generate_batch``) on the CPU, in-process, as
the reference point for the ``transformers`` engine's scheduler.

Same weights as ``transformers_vs_llama_cpp.py`` (the embedded SmolLM2 GGUF, dequantized to
float32), greedy, a fixed number of new tokens per request (no early end), all requests handed
over at once. Prints one table.

    python benchmarks/transformers_continuous_batching.py [--requests 32] [--output-len 128]
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from glmserve.bench.report import hardware
from glmserve.models import default_model_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-batch-tokens", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gguf = default_model_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    inputs = [tok.apply_chat_template([{"role": "user", "content": f"Tell me about topic number {i} in detail."}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
              for i in range(args.requests)]
    config = GenerationConfig(max_new_tokens=args.output_len, do_sample=False, eos_token_id=-1,
                              pad_token_id=tok.pad_token_id or 0, max_batch_tokens=args.max_batch_tokens,
                              num_blocks=512, block_size=32, scheduler="fifo")
    start = time.perf_counter()
    out = model.generate_batch(inputs=inputs, generation_config=config)
    seconds = time.perf_counter() - start
    tokens = sum(len(r.generated_tokens) for r in out.values())
    print(f"hardware: {hardware()} | model: SmolLM2-135M-Instruct float32 (from the embedded GGUF) | threads "
          f"{args.threads} | transformers generate_batch, max_batch_tokens {args.max_batch_tokens}\n")
    print("| requests | prompt tokens (mean) | output tokens each | seconds | output tok/s |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| {len(out)} | {sum(map(len, inputs)) / len(inputs):.0f} | {args.output_len} | {seconds:.1f} | "
          f"{tokens / seconds:.1f} |")


if __name__ == "__main__":
    main()
