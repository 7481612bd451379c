import torch


class Runner:
    def __init__(self, model, optim):
        self.model = model
        self.optim = optim

    def train_step(self, batch):
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda"):
            loss = self.model(batch)
        scaler.scale(loss).backward()
        scaler.step(self.optim)
        scaler.update()
        self.optim.zero_grad()
        return loss
