import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


def setup():
    dist.init_process_group(backend="nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    return rank


def run(model_fn, train_set, epochs=50, lr=0.01):
    rank = setup()
    model = DistributedDataParallel(model_fn().cuda(rank), device_ids=[rank])
    sampler = torch.utils.data.distributed.DistributedSampler(train_set)
    loader = torch.utils.data.DataLoader(train_set, batch_size=8, sampler=sampler, num_workers=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for image, mask in loader:
            image, mask = image.cuda(rank, non_blocking=True), mask.cuda(rank, non_blocking=True)
            optimizer.zero_grad()
            with torch.autocast(device_type="cuda"):
                out = model(image)["out"]
                loss = F.cross_entropy(out, mask, ignore_index=255)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        if rank == 0:
            torch.save(model.module.state_dict(), f"seg_{epoch}.pth")
    dist.destroy_process_group()
