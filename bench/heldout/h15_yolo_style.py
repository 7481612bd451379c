import math
import time

import numpy as np
import torch
from torch import amp


class ModelEMA:
    def __init__(self, model):
        self.ema = model


def smart_optimizer(model, lr):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.937, nesterov=True)


def train(hyp, opt, model, train_loader, nb, epochs, device):
    optimizer = smart_optimizer(model, hyp["lr0"])
    accumulate = max(round(64 / opt.batch_size), 1)
    scaler = amp.GradScaler("cuda", enabled=opt.amp)
    last_opt_step = -1
    for epoch in range(epochs):
        model.train()
        optimizer.zero_grad()
        for i, (imgs, targets, paths, _) in enumerate(train_loader):
            ni = i + nb * epoch
            imgs = imgs.to(device, non_blocking=True).float() / 255
            with amp.autocast("cuda", enabled=opt.amp):
                pred = model(imgs)
                loss = pred.sum() * opt.batch_size
            scaler.scale(loss).backward()
            if ni - last_opt_step >= accumulate:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                last_opt_step = ni
    return model
