import torch
from torch import nn, optim


def train(model: nn.Module, loader, epochs: int = 10):
    opt = optim.RMSprop(model.parameters(), lr=1e-4)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    loss_fn = nn.SmoothL1Loss()
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        for epoch in range(epochs):
            for x, y in loader:
                opt.zero_grad()
                loss = loss_fn(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
            sched.step()
    return model
