import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def fit(data, epochs=3):
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for epoch in range(epochs):
        for x, y in data:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = net(x)
            with torch.autocast("cpu", enabled=False):
                loss = nn.functional.cross_entropy(out.float(), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    example = torch.randn(1, 20)
    traced = torch.jit.trace(net.eval(), example)
    return traced
