import itertools

import torch

from lib import build_loader, build_net

GRID = {"lr": [1e-3, 3e-4], "wd": [0.0, 0.05]}


def run_one(lr, wd, epochs=5):
    net = build_net().cuda()
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=wd)
    scaler = torch.amp.GradScaler("cuda")
    loader = build_loader()
    for epoch in range(epochs):
        for xb, yb in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(net(xb.cuda()), yb.cuda())
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_value_(net.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
    return loss.item()


if __name__ == "__main__":
    for lr, wd in itertools.product(GRID["lr"], GRID["wd"]):
        print(lr, wd, run_one(lr, wd))
