"""A tiny BERT encoder (transformers BertModel, random weights): hidden 128, 2 layers,
2 heads, FFN 512, vocabulary 1000; batch 1, sequence 64 token ids; output
last_hidden_state [1, 64, 128]."""
import torch
from torch import nn

__version__ = "0.1.0"

SEQ = 64


class BertTiny(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=512, max_position_embeddings=128, attn_implementation="eager")
        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids).last_hidden_state


def model() -> nn.Module:
    torch.manual_seed(0)
    return BertTiny().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randint(0, 1000, (1, SEQ), generator=generator),)
