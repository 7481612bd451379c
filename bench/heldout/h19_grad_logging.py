import torch
import wandb


def log_grad_norms(model, step):
    norms = {n: p.grad.norm().item() for n, p in model.named_parameters() if p.grad is not None}
    wandb.log({"grad/" + k: v for k, v in norms.items()}, step=step)


def train(model, loader, optimizer, scaler, log_every=50):
    for step, (x, y) in enumerate(loader):
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        if step % log_every == 0:
            log_grad_norms(model, step)
        scaler.step(optimizer)
        scaler.update()
