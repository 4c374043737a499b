"""Model families exported by ``models.export``: one table of specs, no per-family code.

Each family (BERT, ALBERT, RoBERTa, DistilBERT, GPT-2, ViT, Llama, ResNet) comes in two sizes:

* ``tiny``: 2 layers, hidden 128, 4 heads, FFN 4*hidden, vocab 1000 -- fast enough for unit tests
  (Llama: hidden 64, 2 key/value heads; ResNet: two basic-block stages of 8 and 16 channels);
* ``base``: the standard published base geometry (DistilBERT base has 6 layers, as distilbert-base;
  Llama base is a 12-layer 768-wide decoder with a 2048 SwiGLU FFN; ResNet base is ResNet-50).

Models are built from ``transformers`` config classes with random weights under a fixed seed, in eval
mode and fp32, so two builds (and two exports) of the same spec are identical.

Every spec lists the model inputs in order (names, dtypes and dimension symbols) and the range of each
dimension symbol:

* text models: ``batch`` in 1..8 and ``sequence`` in 1..max positions;
* ViT: ``batch`` in 1..8, ``height`` and ``width`` from one patch to 2x (base) or 4x (tiny) the
  configured image size, with ``interpolate_pos_encoding=True``;
* ResNet (a CNN, issue 11): ``batch`` in 1..8, ``height`` and ``width`` in ``FamilySpec.image_sides``
  (1 pixel upwards: every stride-2 stage rounds up, so any side gives a non-empty feature map).

The only output is ``last_hidden_state`` (ResNet: the last stage's feature map, NCHW).

``make_inputs`` draws valid random inputs for given symbol bindings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

# Attention implementation of every model. "sdpa" and "eager" both export and match torch with both
# exporters here (checked for all six families). "sdpa" is kept: it is transformers' default, so it is
# what users' exports contain. Both exporters decompose it into MatMul / Softmax plus an IsNaN + Where
# per layer (zeroing fully-masked rows; absent from ViT's TorchScript export); "eager" gives the same
# graph without those two ops.
ATTN_IMPLEMENTATION = "sdpa"

# Seed used before building every model: exports are deterministic.
SEED = 0

SIZES = ("tiny", "base")

BATCH_RANGE = (1, 8)

# Layer geometry (layers, hidden size, heads, FFN size) shared by all families; `_bert_like`,
# `_distilbert_like` and `_gpt2_like` spell it in each config class's keywords.
TINY = dict(layers=2, hidden=128, heads=4, ffn=512)
TINY_VOCAB = 1000
BASE = dict(layers=12, hidden=768, heads=12, ffn=3072)

@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input: name, numpy dtype name and one symbol name or static size per dimension."""

    name: str
    dtype: str
    dims: tuple[str | int, ...]


_IDS = InputSpec("input_ids", "int64", ("batch", "sequence"))
_MASK = InputSpec("attention_mask", "int64", ("batch", "sequence"))
_TYPES = InputSpec("token_type_ids", "int64", ("batch", "sequence"))
_PIXELS = InputSpec("pixel_values", "float32", ("batch", 3, "height", "width"))


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """A model family: the transformers classes, its inputs and per-size config keyword arguments.

    ``sizes[size]`` holds the keyword arguments for ``config_class``; keys ``vocab_size``,
    ``max_position_embeddings`` / ``n_positions``, ``image_size``, ``patch_size`` are read back from
    the config object, never from this table, to decide input ranges.
    """

    name: str
    config_class: str
    model_class: str
    inputs: tuple[InputSpec, ...]
    sizes: Mapping[str, Mapping[str, Any]]
    model_init_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    forward_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Smallest ordinary token id: ids below it (special tokens, pad) are only placed on purpose.
    first_token_id: int = 1
    # Vision families without patches (CNNs): inclusive (min, max) of height and width per size.
    # None: the side ranges follow the config's patch and image size (ViT).
    image_sides: Mapping[str, tuple[int, int]] | None = None

    @property
    def is_vision(self) -> bool:
        return any(i.name == "pixel_values" for i in self.inputs)

    @property
    def has_attention(self) -> bool:
        """CNNs have none (transformers refuses an sdpa setting on them)."""
        return self.image_sides is None

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def symbol_names(self) -> tuple[str, ...]:
        names: list[str] = []
        for spec in self.inputs:
            names += [d for d in spec.dims if isinstance(d, str) and d not in names]
        return tuple(names)


def _bert_like(layers: int, hidden: int, heads: int, ffn: int, **extra: Any) -> dict[str, Any]:
    return dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                intermediate_size=ffn, **extra)


def _distilbert_like(layers: int, hidden: int, heads: int, ffn: int, **extra: Any) -> dict[str, Any]:
    return dict(n_layers=layers, dim=hidden, n_heads=heads, hidden_dim=ffn, **extra)


def _gpt2_like(layers: int, hidden: int, heads: int, ffn: int, **extra: Any) -> dict[str, Any]:
    return dict(n_layer=layers, n_embd=hidden, n_head=heads, n_inner=ffn, use_cache=False, **extra)


def _llama_like(layers: int, hidden: int, heads: int, ffn: int, **extra: Any) -> dict[str, Any]:
    return dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=ffn,
                use_cache=False, **extra)


def _resnet_like(**extra: Any) -> dict[str, Any]:
    return dict(num_channels=3, **extra)


FAMILIES: dict[str, FamilySpec] = {
    spec.name: spec
    for spec in (
        FamilySpec(
            "bert", "BertConfig", "BertModel", (_IDS, _MASK, _TYPES),
            sizes={"tiny": _bert_like(**TINY, vocab_size=TINY_VOCAB),
                   "base": _bert_like(**BASE, vocab_size=30522)},
            model_init_kwargs={"add_pooling_layer": False},
        ),
        FamilySpec(
            "albert", "AlbertConfig", "AlbertModel", (_IDS, _MASK, _TYPES),
            # AlbertConfig() defaults to xxlarge: the base geometry is spelled out.
            sizes={"tiny": _bert_like(**TINY, vocab_size=TINY_VOCAB, embedding_size=64),
                   "base": _bert_like(**BASE, vocab_size=30000, embedding_size=128)},
            model_init_kwargs={"add_pooling_layer": False},
        ),
        FamilySpec(
            "roberta", "RobertaConfig", "RobertaModel", (_IDS, _MASK),
            # 514 positions: ids start after the pad id 1, so 512 tokens fit.
            sizes={name: dict(geometry, max_position_embeddings=514, pad_token_id=1, bos_token_id=0,
                              eos_token_id=2, type_vocab_size=1, layer_norm_eps=1e-5)
                   for name, geometry in (("tiny", _bert_like(**TINY, vocab_size=TINY_VOCAB)),
                                          ("base", _bert_like(**BASE, vocab_size=50265)))},
            model_init_kwargs={"add_pooling_layer": False},
            first_token_id=3,  # 0 <s>, 1 <pad>, 2 </s>
        ),
        FamilySpec(
            "distilbert", "DistilBertConfig", "DistilBertModel", (_IDS, _MASK),
            sizes={"tiny": _distilbert_like(**TINY, vocab_size=TINY_VOCAB),
                   # distilbert-base: 6 layers of BERT-base geometry.
                   "base": _distilbert_like(**(BASE | {"layers": 6}), vocab_size=30522)},
        ),
        FamilySpec(
            "gpt2", "GPT2Config", "GPT2Model", (_IDS, _MASK),
            sizes={"tiny": _gpt2_like(**TINY, vocab_size=TINY_VOCAB, n_positions=512,
                                      bos_token_id=TINY_VOCAB - 1, eos_token_id=TINY_VOCAB - 1),
                   "base": _gpt2_like(**BASE, vocab_size=50257, n_positions=1024)},
            forward_kwargs={"use_cache": False},
            first_token_id=0,
        ),
        FamilySpec(
            "vit", "ViTConfig", "ViTModel", (_PIXELS,),
            sizes={"tiny": _bert_like(**TINY, patch_size=8, image_size=32),
                   "base": _bert_like(**BASE, patch_size=16, image_size=224)},
            model_init_kwargs={"add_pooling_layer": False},
            forward_kwargs={"interpolate_pos_encoding": True},
        ),
        # Export notes for the issue-11 families (torch 2.13, transformers 5.23, measured here): both exporters
        # work for Llama and ResNet, tiny and base, and match torch to ~1e-6 (tiny). Tiny export times: Llama
        # dynamo ~40 s, TorchScript ~2 s; ResNet dynamo ~18 s, TorchScript <1 s. Llama's graph adds Range
        # (positions, causal mask), Cos/Sin (rotary), RMSNorm as Pow/ReduceMean/Sqrt with Reciprocal (dynamo) or
        # Cast to fp32 and Div (TorchScript), and Expand/Reshape (repeat_kv). ResNet's BatchNorm is folded into
        # the Conv weights by both exporters; dynamo writes the output side as ``((height - 1)//8) + 1`` (tiny).
        # transformers refuses ``_attn_implementation = "sdpa"`` on ResNet ("does not support an attention
        # implementation"): `make_config` sets it only for families with attention.
        # (Swin, not a family: both exporters export a tiny SwinModel with dynamic H/W -- dynamo ~70 s -- and
        # the graph pads to window multiples through Shape/Mod/Sub/Mod/Pad; see tests/graph/test_window_padding.py.
        # transformers' own eager Swin fails at some sizes, e.g. 29x101, where the exported graph runs.)
        FamilySpec(
            # Decoder LLM (issue 11): RMSNorm, rotary embeddings, SiLU-gated MLP, grouped-query attention in
            # tiny (2 key/value heads for 4 query heads); no KV cache.
            "llama", "LlamaConfig", "LlamaModel", (_IDS, _MASK),
            sizes={"tiny": _llama_like(layers=2, hidden=64, heads=4, ffn=172, num_key_value_heads=2,
                                       vocab_size=TINY_VOCAB, max_position_embeddings=512,
                                       bos_token_id=1, eos_token_id=2),
                   "base": _llama_like(**(BASE | {"ffn": 2048}), vocab_size=32000,
                                       max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)},
            forward_kwargs={"use_cache": False},
            first_token_id=3,  # 0 <unk>, 1 <s>, 2 </s>
        ),
        FamilySpec(
            # CNN (issue 11): Conv / BatchNorm (folded by both exporters) / ReLU / MaxPool stem, residual stages.
            "resnet", "ResNetConfig", "ResNetModel", (_PIXELS,),
            sizes={"tiny": _resnet_like(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                        layer_type="basic"),
                   "base": _resnet_like()},  # ResNetConfig() is ResNet-50
            image_sides={"tiny": (1, 96), "base": (32, 448)},
        ),
    )
}

# Largest ViT input side, as a multiple of the configured image size.
_VIT_MAX_SCALE = {"tiny": 4, "base": 2}


def get_family(family: str | FamilySpec) -> FamilySpec:
    """The spec of a family given by name (bert, albert, roberta, distilbert, gpt2, vit, llama, resnet)."""
    if isinstance(family, FamilySpec):
        return family
    try:
        return FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}") from None


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; known: {', '.join(SIZES)}")


def make_config(family: str | FamilySpec, size: str):
    """The transformers config object of ``family`` at ``size`` (fp32, ATTN_IMPLEMENTATION)."""
    import transformers

    spec = get_family(family)
    _check_size(size)
    config_class = getattr(transformers, spec.config_class)
    config = config_class(**spec.sizes[size])
    if spec.has_attention:
        config._attn_implementation = ATTN_IMPLEMENTATION
    return config


def build_model(family: str | FamilySpec, size: str = "tiny"):
    """The transformers model with seeded random weights, in eval mode and fp32."""
    import torch
    import transformers

    spec = get_family(family)
    config = make_config(spec, size)
    torch.manual_seed(SEED)
    model = getattr(transformers, spec.model_class)(config, **spec.model_init_kwargs)
    return model.to(torch.float32).eval()


def _max_positions(config) -> int:
    """Longest sequence the model accepts (RoBERTa: positions start after the pad id)."""
    if hasattr(config, "n_positions"):
        return config.n_positions
    positions = config.max_position_embeddings
    if config.model_type == "roberta":
        positions -= config.pad_token_id + 1
    return positions


def symbol_ranges(family: str | FamilySpec, size: str = "tiny") -> dict[str, tuple[int, int]]:
    """Inclusive (min, max) range of each dimension symbol of ``family`` at ``size``."""
    spec = get_family(family)
    if spec.image_sides is not None:
        side = tuple(spec.image_sides[size])
        return {"batch": BATCH_RANGE, "height": side, "width": side}
    config = make_config(spec, size)
    if spec.is_vision:
        side = (config.patch_size, _VIT_MAX_SCALE[size] * config.image_size)
        return {"batch": BATCH_RANGE, "height": side, "width": side}
    return {"batch": BATCH_RANGE, "sequence": (1, _max_positions(config))}


def input_shapes(family: str | FamilySpec, bindings: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Concrete shape of each input for the given symbol bindings."""
    spec = get_family(family)
    missing = [s for s in spec.symbol_names if s not in bindings]
    if missing:
        raise ValueError(f"{spec.name}: no value bound to {missing}")
    return {i.name: tuple(bindings[d] if isinstance(d, str) else d for d in i.dims) for i in spec.inputs}


def _vocab_limit(spec: FamilySpec, size: str | None) -> int:
    """Token ids are drawn below this; without a size, below every size's vocabulary."""
    sizes = SIZES if size is None else (size,)
    return min(make_config(spec, s).vocab_size for s in sizes)


def _valid_lengths(batch: int, sequence: int, rng: np.random.Generator) -> np.ndarray:
    """Unpadded length of each row: the first row is full, others lose up to half of their tokens
    with probability 1/2; never zero."""
    lengths = np.full(batch, sequence, dtype=np.int64)
    for row in range(1, batch):
        if rng.random() < 0.5:
            lengths[row] = rng.integers(max(1, (sequence + 1) // 2), sequence + 1)
    return lengths


def make_inputs(family: str | FamilySpec, bindings: Mapping[str, int], rng: np.random.Generator,
                size: str | None = None) -> dict[str, np.ndarray]:
    """Valid random inputs of ``family`` for the given symbol bindings.

    Token ids lie in the vocabulary of ``size`` (of every size when None) and avoid special ids;
    attention masks are right-padded in some rows but never all zero, and padded positions carry the
    pad token where the family has one; token type ids are 0 or 1; pixels are standard normal.
    """
    spec = get_family(family)
    if size is not None:
        _check_size(size)
    for name, value in bindings.items():
        allowed = [symbol_ranges(spec, s).get(name, (value, value)) for s in ((size,) if size else SIZES)]
        if not any(low <= value <= high for low, high in allowed):
            raise ValueError(f"{spec.name}: {name}={value} outside {allowed}")
    shapes = input_shapes(spec, bindings)

    if spec.is_vision:
        return {"pixel_values": rng.standard_normal(shapes["pixel_values"]).astype(np.float32)}

    batch, sequence = shapes["input_ids"]
    ids = rng.integers(spec.first_token_id, _vocab_limit(spec, size), size=(batch, sequence), dtype=np.int64)
    lengths = _valid_lengths(batch, sequence, rng)
    mask = (np.arange(sequence)[None, :] < lengths[:, None]).astype(np.int64)
    pad_id = make_config(spec, size or "tiny").pad_token_id
    if pad_id is not None:
        ids = np.where(mask == 1, ids, pad_id)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in spec.input_names:
        inputs["token_type_ids"] = rng.integers(0, 2, size=(batch, sequence), dtype=np.int64)
    return inputs
