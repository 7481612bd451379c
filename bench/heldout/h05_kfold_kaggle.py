import gc

import numpy as np
import pandas as pd
import timm
import torch
from sklearn.model_selection import GroupKFold
from torch.amp import GradScaler, autocast

CFG = {"n_fold": 4, "epochs": 8, "lr": 1e-4, "model": "tf_efficientnet_b3", "accum": 2}


def train_fn(loader, model, criterion, optimizer, epoch):
    model.train()
    scaler = GradScaler("cuda")
    losses = []
    for step, (images, labels) in enumerate(loader):
        images, labels = images.cuda(), labels.cuda()
        with autocast("cuda"):
            preds = model(images)
            loss = criterion(preds.view(-1), labels) / CFG["accum"]
        scaler.scale(loss).backward()
        if (step + 1) % CFG["accum"] == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        losses.append(loss.item())
    return np.mean(losses)


def train_loop(folds, fold):
    model = timm.create_model(CFG["model"], pretrained=True, num_classes=1).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=CFG["lr"])
    criterion = torch.nn.BCEWithLogitsLoss()
    loader = None
    for epoch in range(CFG["epochs"]):
        avg = train_fn(loader, model, criterion, optimizer, epoch)
        print(f"fold {fold} epoch {epoch} loss {avg:.4f}")
    del model
    gc.collect()


if __name__ == "__main__":
    df = pd.read_csv("train.csv")
    gkf = GroupKFold(n_splits=CFG["n_fold"])
    for fold in range(CFG["n_fold"]):
        train_loop(df, fold)
