"""The same training loop written the way the founding guide recommends: amplint finds nothing."""

import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
amp_dtype = torch.float16 if device == "cuda" else torch.bfloat16
model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
criterion = nn.CrossEntropyLoss()
loader = [(torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))) for _ in range(8)]
scaler = torch.amp.GradScaler(device, enabled=(amp_dtype == torch.float16))  # once per run

for epoch in range(3):
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=amp_dtype):
            logits = model(images.to(device))
            loss = criterion(logits, labels.to(device))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss in epoch {epoch}")
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, error_if_nonfinite=True)
        scaler.step(optimizer)
        scaler.update()
