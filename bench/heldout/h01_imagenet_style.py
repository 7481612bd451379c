import argparse
import os
import time

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torch.distributed as dist
import torchvision.models as models
from torch.cuda.amp import GradScaler, autocast


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--clip", type=float, default=0.0)
    return p.parse_args()


def train(loader, model, criterion, optimizer, scaler, epoch, args):
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(loader):
        images = images.cuda(non_blocking=True)
        target = target.cuda(non_blocking=True)
        with autocast(enabled=args.amp):
            output = model(images)
            loss = criterion(output, target)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        if args.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        scaler.step(optimizer)
        scaler.update()
        if i % 10 == 0:
            print(f"Epoch [{epoch}][{i}/{len(loader)}] loss {loss.item():.3f} time {time.time() - end:.2f}")
        end = time.time()


def main():
    args = parse()
    dist.init_process_group("nccl")
    model = models.__dict__[args.arch]().cuda()
    model = nn.parallel.DistributedDataParallel(model, device_ids=[int(os.environ["LOCAL_RANK"])])
    criterion = nn.CrossEntropyLoss().cuda()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    scaler = GradScaler(enabled=args.amp)
    cudnn.benchmark = True
    train_loader = None
    for epoch in range(args.epochs):
        train(train_loader, model, criterion, optimizer, scaler, epoch, args)
        scheduler.step()
        torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, "ckpt.pth")


if __name__ == "__main__":
    main()
