"""A realistic 300-line image-classification trainer, used to time amplint as pre-commit runs it.

It has the AMP mistakes amplint exists for (deprecated API, per-epoch scaler, clipping scaled
gradients), so the benchmark includes parsing, analysis and reporting.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.cuda.amp import GradScaler, autocast
from torch.utils.data import DataLoader, Dataset

logger = logging.getLogger("trainer")


@dataclass
class Config:
    data_dir: str = "data"
    output_dir: str = "runs/exp"
    epochs: int = 30
    batch_size: int = 128
    lr: float = 3e-4
    weight_decay: float = 0.05
    warmup_epochs: int = 2
    clip_grad: float = 1.0
    label_smoothing: float = 0.1
    amp: bool = True
    seed: int = 42
    num_workers: int = 4
    log_every: int = 50
    eval_every: int = 1
    resume: str | None = None
    tags: list[str] = field(default_factory=list)


def parse_args() -> Config:
    parser = argparse.ArgumentParser(description="train a small convnet")
    for name, default in vars(Config()).items():
        if isinstance(default, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action="store_true", default=default)
        elif isinstance(default, list):
            parser.add_argument(f"--{name.replace('_', '-')}", nargs="*", default=default)
        else:
            kind = type(default) if default is not None else str
            parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default)
    return Config(**vars(parser.parse_args()))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


class RandomImages(Dataset):
    """Stands in for an ImageFolder: deterministic random images and labels."""

    def __init__(self, size: int, num_classes: int = 10, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(size, 3, 32, 32, generator=generator)
        self.labels = torch.randint(0, num_classes, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index]
        if random.random() < 0.5:
            image = image.flip(-1)
        return image, self.labels[index]


class ConvBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride, bias=False), nn.BatchNorm2d(channels_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = ConvBlock(width, width)
        self.layer2 = ConvBlock(width, width * 2, stride=2)
        self.layer3 = ConvBlock(width * 2, width * 4, stride=2)
        self.head = nn.Linear(width * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def cosine_lr(step: int, total: int, warmup: int, base: float) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))


class AverageMeter:
    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, value: float, n: int = 1) -> None:
        self.total += value * n
        self.count += n

    @property
    def average(self) -> float:
        return self.total / max(1, self.count)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return (logits.argmax(dim=-1) == labels).float().mean().item()


def build_optimizer(model: nn.Module, config: Config) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim <= 1 or name.endswith(".bias") else decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))


def save_checkpoint(path: Path, model, optimizer, epoch: int, best: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "best": best}
    torch.save(state, path)


def load_checkpoint(path: str, model, optimizer) -> tuple[int, float]:
    state = torch.load(path, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["epoch"] + 1, state["best"]


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, use_amp: bool) -> dict:
    model.eval()
    losses, accuracies = AverageMeter(), AverageMeter()
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with autocast(enabled=use_amp):
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        losses.update(loss.item(), images.size(0))
        accuracies.update(accuracy(logits, labels), images.size(0))
    return {"loss": losses.average, "accuracy": accuracies.average}


def train_one_epoch(model, loader, optimizer, device, epoch: int, config: Config, global_step: int) -> int:
    model.train()
    scaler = GradScaler(enabled=config.amp)
    meter = AverageMeter()
    total_steps = config.epochs * len(loader)
    warmup_steps = config.warmup_epochs * len(loader)
    start = time.time()
    for step, (images, labels) in enumerate(loader):
        lr = cosine_lr(global_step, total_steps, warmup_steps, config.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with autocast(enabled=config.amp):
            logits = model(images)
            loss = F.cross_entropy(logits, labels, label_smoothing=config.label_smoothing)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"loss is {loss.item()} at step {global_step}")
        scaler.scale(loss).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
        scaler.step(optimizer)
        scaler.update()
        meter.update(loss.item(), images.size(0))
        global_step += 1
        if step % config.log_every == 0:
            elapsed = time.time() - start
            logger.info(
                "epoch %d step %d/%d loss %.4f lr %.2e grad %.2f (%.1f img/s)",
                epoch,
                step,
                len(loader),
                meter.average,
                lr,
                float(grad_norm),
                (step + 1) * config.batch_size / max(elapsed, 1e-6),
            )
    return global_step


def write_summary(output_dir: Path, history: list[dict]) -> None:
    (output_dir / "history.json").write_text(json.dumps(history, indent=2))
    best = max(history, key=lambda item: item["accuracy"]) if history else None
    if best is not None:
        logger.info("best epoch %d: accuracy %.4f", best["epoch"], best["accuracy"])


def main() -> None:
    config = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    seed_everything(config.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    train_set = RandomImages(4096, seed=config.seed)
    val_set = RandomImages(1024, seed=config.seed + 1)
    train_loader = DataLoader(
        train_set, batch_size=config.batch_size, shuffle=True, num_workers=config.num_workers, drop_last=True
    )
    val_loader = DataLoader(val_set, batch_size=config.batch_size * 2, num_workers=config.num_workers)

    model = SmallResNet().to(device, memory_format=torch.channels_last)
    optimizer = build_optimizer(model, config)
    start_epoch, best = 0, 0.0
    if config.resume:
        start_epoch, best = load_checkpoint(config.resume, model, optimizer)
        logger.info("resumed from %s at epoch %d", config.resume, start_epoch)

    history = []
    global_step = start_epoch * len(train_loader)
    for epoch in range(start_epoch, config.epochs):
        global_step = train_one_epoch(model, train_loader, optimizer, device, epoch, config, global_step)
        if (epoch + 1) % config.eval_every == 0:
            metrics = evaluate(model, val_loader, device, config.amp)
            metrics["epoch"] = epoch
            history.append(metrics)
            logger.info("epoch %d: val loss %.4f accuracy %.4f", epoch, metrics["loss"], metrics["accuracy"])
            if metrics["accuracy"] > best:
                best = metrics["accuracy"]
                save_checkpoint(output_dir / "best.pt", model, optimizer, epoch, best)
        save_checkpoint(output_dir / "last.pt", model, optimizer, epoch, best)
    write_summary(output_dir, history)


if __name__ == "__main__":
    main()
