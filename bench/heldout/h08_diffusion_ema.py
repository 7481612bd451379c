import copy

import torch
import torch.nn.functional as F


class EMA:
    def __init__(self, model, decay=0.999):
        self.shadow = copy.deepcopy(model).eval()
        self.decay = decay

    @torch.no_grad()
    def update(self, model):
        for s, p in zip(self.shadow.parameters(), model.parameters()):
            s.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)


def diffusion_loss(model, x0, timesteps=1000):
    t = torch.randint(0, timesteps, (x0.size(0),), device=x0.device)
    noise = torch.randn_like(x0)
    alpha = torch.cos(t.float() / timesteps * 1.5707) ** 2
    xt = alpha.sqrt().view(-1, 1, 1, 1) * x0 + (1 - alpha).sqrt().view(-1, 1, 1, 1) * noise
    return F.mse_loss(model(xt, t), noise)


def train(unet, loader, steps=100_000, lr=2e-4, device="cuda"):
    opt = torch.optim.AdamW(unet.parameters(), lr=lr)
    ema = EMA(unet)
    scaler = torch.amp.GradScaler(device)
    data = iter(loader)
    for step in range(steps):
        try:
            x0 = next(data)
        except StopIteration:
            data = iter(loader)
            x0 = next(data)
        x0 = x0.to(device)
        with torch.autocast(device, dtype=torch.float16):
            loss = diffusion_loss(unet, x0)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        gn = torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        ema.update(unet)
        if step % 1000 == 0:
            print(step, loss.item(), gn.item())
    ema_half = ema.shadow.half()
    return ema_half
