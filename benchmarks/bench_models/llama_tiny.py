"""A tiny LLaMA decoder (transformers LlamaForCausalLM, random weights, no KV cache):
hidden 128, 2 layers, 4 heads (2 KV heads), FFN 256, vocabulary 1000; batch 1,
sequence 64 token ids; output logits [1, 64, 1000]."""
import torch
from torch import nn

__version__ = "0.1.0"

SEQ = 64


class LlamaTiny(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                             use_cache=False, attn_implementation="eager")
        self.llama = LlamaForCausalLM(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.llama(input_ids=input_ids, use_cache=False).logits


def model() -> nn.Module:
    torch.manual_seed(0)
    return LlamaTiny().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randint(0, 1000, (1, SEQ), generator=generator),)
