import torch
import torch.nn as nn
import torch.optim as optim

nz = 100


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.ConvTranspose2d(nz, 64, 4, 1, 0), nn.BatchNorm2d(64), nn.ReLU(True),
                                  nn.ConvTranspose2d(64, 3, 4, 2, 1), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(64, 1, 4, 1, 0))

    def forward(self, x):
        return self.main(x).view(-1)


netG, netD = Generator().cuda(), Discriminator().cuda()
optimizerD = optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
criterion = nn.BCEWithLogitsLoss()
scaler_d = torch.amp.GradScaler("cuda")
scaler_g = torch.amp.GradScaler("cuda")
dataloader = []

for epoch in range(25):
    for i, (data, _) in enumerate(dataloader):
        real = data.cuda()
        b = real.size(0)
        netD.zero_grad()
        with torch.autocast("cuda"):
            out_real = netD(real)
            noise = torch.randn(b, nz, 1, 1, device="cuda")
            fake = netG(noise)
            out_fake = netD(fake.detach())
            errD = criterion(out_real, torch.ones_like(out_real)) + criterion(out_fake, torch.zeros_like(out_fake))
        scaler_d.scale(errD).backward()
        scaler_d.step(optimizerD)
        scaler_d.update()

        netG.zero_grad()
        with torch.autocast("cuda"):
            out = netD(fake)
            errG = criterion(out, torch.ones_like(out))
            scaler_g.scale(errG).backward()
        scaler_g.unscale_(optimizerG)
        torch.nn.utils.clip_grad_norm_(netG.parameters(), 5.0)
        scaler_g.step(optimizerG)
        scaler_g.update()
