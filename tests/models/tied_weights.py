"""One embedding tied under three names (T5/GPT-2 style): ``embed.weight``, the lm-head's
``lm_head.weight`` and ``decoder.embed_tokens.weight`` (a third module reference), plus a
plain tensor attribute over the same storage that forward reads, two LayerNorms whose
weights are equal (all ones), and a buffer forward never reads."""
import torch
from torch import nn

VOCAB, DIM = 512, 64


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's initialisation
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight
        self.decoder = nn.Module()
        self.decoder.embed_tokens = self.embed
        self.table = self.embed.weight.detach()  # a lifted constant sharing the storage
        self.norm1 = nn.LayerNorm(DIM)
        self.norm2 = nn.LayerNorm(DIM)
        self.register_buffer("unused_table", torch.randn(256, DIM))

    def forward(self, ids):
        h = self.norm2(self.norm1(self.decoder.embed_tokens(ids)))
        return self.lm_head(h) + self.table[ids[:, :1], :1]


def model():
    torch.manual_seed(0)
    return Tied().eval()


def example_inputs():
    torch.manual_seed(1)
    return (torch.randint(0, VOCAB, (2, 8)),)
