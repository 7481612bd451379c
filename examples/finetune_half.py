"""Fine-tuning with a model converted to float16 by hand while autocast is also used."""

import torch
from torch import nn

model = nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model=64, nhead=4, batch_first=True), num_layers=2)
model = model.cuda().half()  # autocast already picks per-op dtypes; this breaks the GradScaler
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda")


def train_step(batch):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(batch).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return loss.detach()
