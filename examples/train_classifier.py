"""A small image-classifier training script with the AMP mistakes amplint exists to catch."""

import torch
from torch import nn
from torch.cuda.amp import GradScaler, autocast

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
criterion = nn.CrossEntropyLoss()
loader = [(torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))) for _ in range(8)]

for epoch in range(3):
    for images, labels in loader:
        scaler = GradScaler()  # rebuilt every batch: the loss scale never settles
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            logits = model(images.to(device))
            loss = criterion(logits, labels.to(device))
            scaler.scale(loss).backward()  # backward while autocast is still on
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # clips scaled gradients
        scaler.step(optimizer)
        scaler.update()
