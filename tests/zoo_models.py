"""Tiny random models people use, built in code (nothing is downloaded): Hugging
Face ``transformers`` architectures with their own initialisation, and
``torch.nn`` recurrent and attention layers.  Shared by tests/test_model_zoo.py
and benchmarks/bench_models.py.

Each entry builds ``(module, example_inputs, other_inputs, dynamic_shapes)``:
the module returns one tensor (the logits or the last hidden state), the
example inputs are what ``torch.export`` traces, the other inputs another batch
size (and, for text, another sequence length) the imported program must also
run at.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

Spec = tuple[torch.nn.Module, list[torch.Tensor], list[torch.Tensor], Any]

VOCAB = 50


class Head(torch.nn.Module):
    """A transformers model called with keyword arguments, one field of its output."""

    def __init__(self, model: torch.nn.Module, field: str, mask: bool = False, **kwargs: Any) -> None:
        super().__init__()
        self.model = model.eval()
        self.field = field
        self.mask = mask
        self.kwargs = kwargs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mask:  # an explicit attention mask, as a tokenizer's batch has
            out = self.model(x, attention_mask=torch.ones_like(x), **self.kwargs)
        else:
            out = self.model(x, **self.kwargs)
        return getattr(out, self.field)


class Recurrent(torch.nn.Module):
    """A 2-layer bidirectional LSTM, a bidirectional GRU and multi-head attention."""

    def __init__(self, features: int = 4, hidden: int = 6) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(features, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = torch.nn.GRU(2 * hidden, 5, bidirectional=True, batch_first=True)
        self.attention = torch.nn.MultiheadAttention(10, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(x)
        g, _ = self.gru(h)
        a, _ = self.attention(g, g, g)
        return a


def _dims(text: bool) -> Any:
    batch = torch.export.Dim("batch", min=1, max=64)
    if not text:
        return {0: batch}
    return {0: batch, 1: torch.export.Dim("seq", min=3, max=256)}


def _text(model: torch.nn.Module, field: str = "logits", mask: bool = False, batch: int = 2,
          seq: int = 8, **kwargs: Any) -> Spec:
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, VOCAB, (batch, seq), generator=g)
    b = torch.randint(0, VOCAB, (batch + 1, seq - 3), generator=g)
    return Head(model, field, mask, **kwargs), [a], [b], (_dims(True),)


def _vision(model: torch.nn.Module, shape: tuple[int, ...], field: str = "logits",
            batch: int = 2) -> Spec:
    g = torch.Generator().manual_seed(1)
    a = torch.randn((batch, *shape), generator=g)
    b = torch.randn((batch + 1, *shape), generator=g)
    return Head(model, field), [a], [b], (_dims(False),)


def _quiet(build: Callable[[], Spec]) -> Callable[[], Spec]:
    def run() -> Spec:
        import transformers

        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return build()
    return run


def gpt2(width: int = 16, layers: int = 2, heads: int = 2, **size: Any) -> Spec:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=256, n_embd=width, n_layer=layers, n_head=heads,
                        bos_token_id=0, eos_token_id=0)
    return _text(GPT2LMHeadModel(config), mask=True, use_cache=False, **size)


def llama(width: int = 16, layers: int = 2, heads: int = 4, **size: Any) -> Spec:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads // 2, max_position_embeddings=256,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return _text(LlamaForCausalLM(config), mask=True, use_cache=False, **size)


def bert(width: int = 16, layers: int = 2, heads: int = 2, **size: Any) -> Spec:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=VOCAB, hidden_size=width, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=2 * width,
                        max_position_embeddings=256)
    return _text(BertModel(config), "last_hidden_state", **size)


def t5() -> Spec:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                      decoder_start_token_id=0)
    return _text(T5EncoderModel(config), "last_hidden_state")


def bart() -> Spec:
    from transformers import BartConfig, BartModel

    config = BartConfig(vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                        decoder_ffn_dim=32, max_position_embeddings=256, pad_token_id=1,
                        bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    return _text(BartModel(config), "last_hidden_state", use_cache=False)


def vit(image: int = 16, width: int = 16, layers: int = 2, batch: int = 2) -> Spec:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(image_size=image, patch_size=4, num_channels=3, hidden_size=width,
                       num_hidden_layers=layers, num_attention_heads=2, intermediate_size=2 * width)
    return _vision(ViTModel(config), (3, image, image), "last_hidden_state", batch=batch)


def resnet(image: int = 32, batch: int = 2, sizes: tuple[int, ...] = (8, 16)) -> Spec:
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(num_channels=3, embedding_size=sizes[0], hidden_sizes=list(sizes),
                          depths=[1] * len(sizes), layer_type="basic", num_labels=5)
    return _vision(ResNetForImageClassification(config), (3, image, image), batch=batch)


def mobilenet_v2() -> Spec:
    """With transformers' own initialisation: thousands of activations sit exactly
    at ReLU6's bounds, where its gradient is 0 (clip's would be 1)."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    config = MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.25, num_labels=5)
    return _vision(MobileNetV2ForImageClassification(config), (3, 32, 32))


def convnext() -> Spec:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1],
                            num_labels=5)
    return _vision(ConvNextForImageClassification(config), (3, 32, 32))


def whisper_encoder() -> Spec:
    from transformers import WhisperConfig, WhisperModel

    config = WhisperConfig(vocab_size=VOCAB, num_mel_bins=8, d_model=16, encoder_layers=1,
                           decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                           encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=8,
                           max_target_positions=16, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                           decoder_start_token_id=0)
    return _vision(WhisperModel(config).get_encoder(), (8, 16), "last_hidden_state")


def wav2vec2() -> Spec:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, conv_dim=(8, 8), conv_stride=(5, 2),
                            conv_kernel=(10, 3), num_conv_pos_embeddings=8,
                            num_conv_pos_embedding_groups=2, feat_extract_norm="group")
    return _vision(Wav2Vec2Model(config), (400,), "last_hidden_state")


def recurrent() -> Spec:
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn((2, 5, 4), generator=g), torch.randn((3, 5, 4), generator=g)
    return Recurrent().eval(), [a], [b], (_dims(False),)


ZOO: dict[str, Callable[[], Spec]] = {name: _quiet(build) for name, build in {
    "gpt2": gpt2, "llama": llama, "bert": bert, "t5": t5, "bart": bart, "vit": vit,
    "resnet": resnet, "mobilenet_v2": mobilenet_v2, "convnext": convnext,
    "whisper_encoder": whisper_encoder, "wav2vec2": wav2vec2, "lstm_gru_attention": recurrent,
}.items()}
"""Every model of the zoo by name."""

TEXT = frozenset({"gpt2", "llama", "bert", "t5", "bart"})
"""The models whose inputs have a sequence axis (run at two lengths)."""
