"""Offline scoring with a half-precision model. No training here."""
import json
import sys

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer


def load(name):
    model = AutoModelForSequenceClassification.from_pretrained(name)
    return model.half().cuda().eval()


@torch.inference_mode()
def score(model, tok, texts, batch_size=64):
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tok(texts[i:i + batch_size], padding=True, truncation=True, return_tensors="pt").to("cuda")
        logits = model(**enc).logits.float()
        out.extend(logits.softmax(-1)[:, 1].tolist())
    return out


if __name__ == "__main__":
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    print(json.dumps(score(load(sys.argv[1]), tok, open(sys.argv[2]).read().splitlines())))
