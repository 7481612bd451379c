import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, get_cosine_schedule_with_warmup


def main(dataset, epochs=3, fp16=True, max_grad_norm=1.0, grad_accum=4):
    tok = AutoTokenizer.from_pretrained("t5-base")
    model = AutoModelForSeq2SeqLM.from_pretrained("t5-base").cuda()
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scheduler = get_cosine_schedule_with_warmup(optimizer, 500, epochs * len(loader) // grad_accum)
    scaler = torch.amp.GradScaler("cuda", enabled=fp16)
    model.train()
    for epoch in range(epochs):
        for step, batch in enumerate(loader):
            batch = {k: v.cuda() for k, v in batch.items()}
            with torch.autocast("cuda", enabled=fp16):
                loss = model(**batch).loss / grad_accum
            scaler.scale(loss).backward()
            if (step + 1) % grad_accum != 0:
                continue
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if step % 100 == 0:
                print(f"{epoch}:{step} loss={loss.item() * grad_accum:.4f} gnorm={grad_norm:.2f}")
    model.save_pretrained("out")
    tok.save_pretrained("out")
