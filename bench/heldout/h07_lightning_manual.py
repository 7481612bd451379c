import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class VAE(pl.LightningModule):
    def __init__(self, encoder, decoder, beta=1.0):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.beta = beta
        self.automatic_optimization = False
        self.grad_scaler = torch.amp.GradScaler("cuda")

    def on_train_start(self):
        self.decoder.half()

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, _ = batch
        with torch.autocast("cuda", dtype=torch.float16):
            mu, logvar = self.encoder(x).chunk(2, dim=-1)
            z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
            recon = self.decoder(z)
            kl = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
            loss = F.mse_loss(recon, x) + self.beta * kl
        opt.zero_grad()
        self.grad_scaler.scale(loss).backward()
        self.grad_scaler.unscale_(opt)
        self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        self.grad_scaler.step(opt)
        self.grad_scaler.update()
        self.log("loss", loss)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)
