import contextlib

import torch


def maybe_autocast(enabled, dtype=torch.bfloat16):
    if enabled:
        return torch.autocast("cuda", dtype=dtype)
    return contextlib.nullcontext()


def train(model, loader, opt, amp=True):
    for x, y in loader:
        with maybe_autocast(amp):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad()


def finetune(model, loader, opt, amp=True):
    for x, y in loader:
        with maybe_autocast(amp):
            loss = model(x).logsumexp(-1).mean()
            loss.backward()
        opt.step()
        opt.zero_grad()
