"""GEMM/conv steps of every epilogue kind at odd sizes: linear (+bias, +relu, +gelu,
+tanh, +silu, +residual add), a bias-free linear (mm) on a transposed activation, a
single-row linear, and conv2d + bias + relu."""
import torch
import torch.nn.functional as F

__version__ = "0.1.0"


class GemmZoo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc_relu = torch.nn.Linear(13, 5)     # M=7, K=13, N=5
        self.fc_gelu = torch.nn.Linear(5, 33)     # N=33
        self.fc_tanh = torch.nn.Linear(33, 13)
        self.fc_silu = torch.nn.Linear(13, 13)
        self.fc_res = torch.nn.Linear(13, 13)
        self.fc_t = torch.nn.Linear(7, 5, bias=False)   # mm on a transposed activation
        self.fc_row = torch.nn.Linear(13, 5)      # M=1
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x, image):
        h = F.relu(self.fc_relu(x))                   # (7, 5)
        g = F.gelu(self.fc_gelu(h))                   # (7, 33)
        t = torch.tanh(self.fc_tanh(g))               # (7, 13)
        s = F.silu(self.fc_silu(t))                   # (7, 13)
        r = self.fc_res(s) + s                        # residual add
        m = self.fc_t(x.transpose(0, 1))              # (13, 5): x^T is non-contiguous
        row = self.fc_row(x[:1])                      # (1, 5)
        c = F.relu(self.conv(image))                  # (2, 6, 9, 9)
        return r, m, row, c


def model():
    torch.manual_seed(0)
    return GemmZoo().eval()


def example_inputs():
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(7, 13, generator=generator), torch.randn(2, 3, 9, 9, generator=generator))
