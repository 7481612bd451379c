import torch
from torch.amp import custom_bwd, custom_fwd
from torch.cuda.amp import custom_fwd as old_custom_fwd


class RoundSTE(torch.autograd.Function):
    @staticmethod
    @custom_fwd(device_type="cuda")
    def forward(ctx, x):
        return x.round()

    @staticmethod
    @custom_bwd(device_type="cuda")
    def backward(ctx, g):
        return g


class ClampSTE(torch.autograd.Function):
    @staticmethod
    @old_custom_fwd
    def forward(ctx, x):
        return x.clamp(-1, 1)

    @staticmethod
    def backward(ctx, g):
        return g


def quant_train(model, loader, opt):
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        x = x.cuda().to(dtype=torch.float16)
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(RoundSTE.apply(x)), y.cuda())
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
