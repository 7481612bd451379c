import torch
from accelerate import Accelerator


def train(model, optimizer, loader, scheduler, epochs=2):
    accelerator = Accelerator(mixed_precision="bf16")
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for epoch in range(epochs):
        for batch in loader:
            with accelerator.autocast():
                outputs = model(**batch)
            accelerator.backward(outputs.loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        accelerator.print(f"epoch {epoch} done")
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.save_pretrained("out", save_function=accelerator.save)
