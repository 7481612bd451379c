import math
import os
import pickle
from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPTConfig, GPT

batch_size = 12
block_size = 1024
grad_clip = 1.0
gradient_accumulation_steps = 40
device = "cuda"
dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
compile_model = True

device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

model = GPT(GPTConfig(block_size=block_size))
model.to(device)
scaler = torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))
optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type)
if compile_model:
    model = torch.compile(model)


def get_batch(split):
    raise NotImplementedError


@torch.no_grad()
def estimate_loss(eval_iters=200):
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


X, Y = get_batch("train")
iter_num = 0
while True:
    if iter_num % 2000 == 0:
        print(estimate_loss())
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num > 600000:
        break
