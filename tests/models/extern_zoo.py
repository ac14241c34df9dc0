"""Extern calls with every argument kind: conv, embedding, bmm, pooling, index ops (a tensor
list: advanced indexing), cat (fused: read by cumsum's extern call from its buffer)."""
import torch
import torch.nn.functional as F


class ExternZoo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, stride=2)
        self.bn = torch.nn.BatchNorm2d(8)
        self.emb = torch.nn.Embedding(50, 16)

    def forward(self, image, tokens):
        h = F.relu(self.bn(self.conv(image)))
        h = F.max_pool2d(h, 2)
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)          # (2, 8)
        e = self.emb(tokens)                                   # (2, 5, 16)
        scores = torch.bmm(e, e.transpose(1, 2))               # (2, 5, 5)
        picked = torch.gather(scores, 2, tokens.unsqueeze(1).expand(2, 5, 5) % 5)
        joined = torch.cat([h, e.mean(dim=1)], dim=1)          # (2, 24)
        rows = h[tokens[:, 0] % 2]                             # aten.index.Tensor: a tensor list
        return joined.cumsum(dim=1), picked, torch.topk(scores.flatten(1), 3).values, rows


def model():
    torch.manual_seed(0)
    return ExternZoo().eval()


def example_inputs():
    g = torch.Generator().manual_seed(4)
    return (torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 50, (2, 5), generator=g))
