import torch
import torch.nn as nn


def ppo_update(policy, optimizer, rollouts, clip_eps=0.2, epochs=4, max_grad_norm=0.5, use_amp=True):
    for _ in range(epochs):
        scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
        for obs, actions, old_logp, adv, returns in rollouts:
            with torch.autocast("cuda", enabled=use_amp):
                dist, value = policy(obs)
                logp = dist.log_prob(actions)
                ratio = (logp - old_logp).exp()
                pg = -torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv).mean()
                v_loss = (returns - value).pow(2).mean()
                loss = pg + 0.5 * v_loss - 0.01 * dist.entropy().mean()
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
