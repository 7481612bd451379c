import torch
import torch.nn.functional as F


def info_nce(a, b, t=0.07):
    a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    logits = a @ b.t() / t
    labels = torch.arange(a.size(0), device=a.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def step(image_enc, text_enc, images, texts, opt_img, opt_txt, scaler):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = info_nce(image_enc(images), text_enc(texts))
    opt_img.zero_grad()
    opt_txt.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(opt_img)
    torch.nn.utils.clip_grad_norm_(image_enc.parameters(), 1.0)
    torch.nn.utils.clip_grad_norm_(text_enc.parameters(), 1.0)
    scaler.step(opt_img)
    scaler.step(opt_txt)
    scaler.update()
    return loss.item()
