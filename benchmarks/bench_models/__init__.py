"""The models of the side-by-side benchmark (benchmarks/peers.py), each a model file in
the form ``aotpack build`` takes (``model()``, ``example_inputs()``, ``__version__``).

``MEMORY_BOUND = True`` in a file marks a micro-model whose floor is memory traffic: the
benchmark reports the share of measured streaming bandwidth each variant reaches for it,
counting inputs + outputs + weights as the bytes moved (each read or written once).
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parents[1] / "samples"

#: name -> model file, in table order.
MODELS: dict[str, Path] = {
    "mlp": SAMPLES / "mlp.py",
    "transformer_block": SAMPLES / "transformer_block.py",
    "bert_tiny": HERE / "bert_tiny.py",
    "llama_tiny": HERE / "llama_tiny.py",
    "resnet18": HERE / "resnet18.py",
    "mobilenetv3_small": HERE / "mobilenetv3_small.py",
    "vit_s16": HERE / "vit_s16.py",
    "softmax_4096": HERE / "softmax_4096.py",
    "layernorm_64x4096": HERE / "layernorm_64x4096.py",
    "colsum_4096": HERE / "colsum_4096.py",
    "views_cat": HERE / "views_cat.py",
}

#: The full-size public architectures users ship (issue 48), after the models above.
FULL_SIZE: dict[str, Path] = {
    "vit_s16_full": HERE / "vit_s16_full.py",
    "deit_tiny": HERE / "deit_tiny.py",
    "resnet50": HERE / "resnet50.py",
    "efficientnet_b0": HERE / "efficientnet_b0.py",
    "mobilenetv3_large": HERE / "mobilenetv3_large.py",
    "convnext_t": HERE / "convnext_t.py",
    "distilbert_base": HERE / "distilbert_base.py",
    "whisper_tiny_encoder": HERE / "whisper_tiny_encoder.py",
}
MODELS.update(FULL_SIZE)
