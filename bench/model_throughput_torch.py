#!/usr/bin/env python3
"""The PyTorch + HF transformers reference of bench/model_throughput.c: the same ~100M Qwen2,
random weights, BF16: an eager AdamW train step on 16 x 512 tokens, and `generate` with sampling,
64-token prompts, 128 new tokens, at 64 and 256 sequences. Prints a markdown table."""
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

cfg = Qwen2Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024,
                  tie_word_embeddings=False)
model = Qwen2ForCausalLM(cfg).to("cuda", torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, 32000, (16, 512), device="cuda")
print("| what | numerics | tokens/s |\n|---|---|---|")
for i in range(4):
    if i == 1:
        torch.cuda.synchronize()
        t0 = time.time()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
print(f"| PyTorch train step, 16 x 512 | BF16 (HF, eager AdamW) | {3 * 16 * 512 / (time.time() - t0):.0f} |")
model.eval()
for n in (64, 256):
    prompt = torch.randint(0, 32000, (n, 64), device="cuda")
    kw = dict(max_new_tokens=128, min_new_tokens=128, do_sample=True, pad_token_id=0)
    with torch.no_grad():
        model.generate(prompt, **kw)
        torch.cuda.synchronize()
        t0 = time.time()
        out = model.generate(prompt, **kw)
        torch.cuda.synchronize()
    print(f"| HF generate, {n} sequences, 64 + 128 tokens | BF16 | {n * (out.shape[1] - 64) / (time.time() - t0):.0f} |")
