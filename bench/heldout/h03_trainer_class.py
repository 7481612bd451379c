"""A generic trainer. Mixed precision via torch.amp; see docs for why
`torch.cuda.amp.GradScaler()` is no longer used."""
from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


class Trainer:
    def __init__(self, model: nn.Module, optimizer, scheduler=None, amp_dtype=torch.float16, max_norm=None):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.amp_dtype = amp_dtype
        self.max_norm = max_norm
        self.scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)

    def _loss(self, batch):
        inputs, labels = batch
        with torch.autocast("cuda", dtype=self.amp_dtype):
            logits = self.model(inputs.cuda())
            return nn.functional.cross_entropy(logits, labels.cuda())

    def _clip(self):
        if self.max_norm is not None:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)

    def step(self, batch):
        loss = self._loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self._clip()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        return loss.item()

    def fit(self, loader, epochs: int):
        for epoch in range(epochs):
            losses = [self.step(b) for b in loader]
            logger.info("epoch %d: %.4f", epoch, sum(losses) / max(len(losses), 1))
