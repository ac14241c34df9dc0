"""DistilBERT-base (Sanh et al. 2019; transformers DistilBertModel with its default config:
6 layers, hidden 768, 12 heads, FFN 3072, vocabulary 30522), random weights; batch 1,
sequence 128 token ids with an attention mask (the last 16 positions padding); output
last_hidden_state [1, 128, 768]."""
import torch
from torch import nn

__version__ = "0.1.0"

SEQ, PADDING = 128, 16


class DistilBertBase(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import DistilBertConfig, DistilBertModel

        self.bert = DistilBertModel(DistilBertConfig(attn_implementation="eager"))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def model() -> nn.Module:
    torch.manual_seed(0)
    return DistilBertBase().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 30522, (1, SEQ), generator=generator)
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    mask[:, SEQ - PADDING:] = 0
    return ids, mask
