"""Causal language models with an explicit KV cache, exported for token-by-token serving.

A generation server calls a decoder once per step: the prompt first, with nothing cached (``past``
= 0), then one token at a time with the keys and values of every earlier token fed back (``past`` =
prompt, prompt + 1, ...). Every step is a new shape, which is what tscomp compiles for. The export
has three dynamic dims:

* ``batch``: the requests served together (1..8; a shorter one is left-padded: its mask starts
  with zeros);
* ``sequence``: the tokens of this step (``input_ids`` ``[batch, sequence]``);
* ``past``: the tokens cached (``past.<layer>.key`` / ``.value`` ``[batch, kv_heads, past, head_dim]``);
* ``total`` = past + sequence: the attention mask ``[batch, total]`` and the presents
  ``present.<layer>.key`` / ``.value`` ``[batch, kv_heads, total, head_dim]`` (dynamo names them
  ``past + sequence``).

Outputs: ``logits`` ``[batch, sequence, vocab]`` and the presents, which the next step feeds back as its
past. Models are built from ``transformers`` config classes with seeded random weights (fp32, eval,
sdpa attention), as in :mod:`models.families`, at one of :data:`SIZES`; the cache travels through transformers'
``DynamicCache`` inside the wrapper, so the ONNX graph sees plain tensors.

Command line::

    python -m models.decoder_cache llama --exporter torchscript [--size tiny|small] -o OUT_DIR
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from models.export import _quiet, cached_export

EXPORTERS = ("dynamo", "torchscript")
OPSETS = {"dynamo": 20, "torchscript": 17}
SEED = 0
VOCAB = 1000
#: the longest cache and step the exports are traced to allow (dynamo's Dim bounds)
MAX_PAST, MAX_SEQUENCE, MAX_BATCH = 1024, 512, 8
#: the shape exports are traced at: a step of 3 tokens after 5 cached (TorchScript keeps the
#: branches of that trace: a multi-token step with a cache, the general case)
EXAMPLE_SEQUENCE, EXAMPLE_PAST = 3, 5


#: model geometries: ``tiny`` for tests, ``small`` for timing a decode step that streams its
#: weights (~100 MB fp32 with a 32000-token vocabulary, as a small served LLM)
SIZES = {"tiny": dict(hidden=64, layers=2, heads=4, ffn=128, vocab=VOCAB),
         "small": dict(hidden=512, layers=4, heads=8, ffn=1536, vocab=32000)}


@dataclasses.dataclass(frozen=True)
class CausalLM:
    """A decoder family: its transformers config and LM-head classes, and the config keywords of a
    geometry (hidden, layers, heads, ffn, vocab)."""

    name: str
    config_class: str
    model_class: str
    keywords: Callable[..., dict[str, Any]]

    def config(self, size: str) -> dict[str, Any]:
        try:
            geometry = SIZES[size]
        except KeyError:
            raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}") from None
        return self.keywords(**geometry)


def _llama_like(hidden, layers, heads, ffn, vocab, **extra) -> dict[str, Any]:
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn,
                vocab_size=vocab, max_position_embeddings=MAX_PAST + MAX_SEQUENCE, **extra)


def _gpt2(hidden, layers, heads, ffn, vocab) -> dict[str, Any]:
    return dict(n_embd=hidden, n_layer=layers, n_head=heads, n_inner=ffn, vocab_size=vocab,
                n_positions=MAX_PAST + MAX_SEQUENCE)


def _grouped(kv_per_query: int, **extra):
    """Llama-style keywords with ``heads / kv_per_query`` key/value heads."""
    return lambda **g: _llama_like(**g, num_key_value_heads=g["heads"] // kv_per_query, **extra)


FAMILIES: dict[str, CausalLM] = {f.name: f for f in (
    # grouped-query attention (two query heads per key/value head), rotary positions, RMSNorm
    CausalLM("llama", "LlamaConfig", "LlamaForCausalLM", _grouped(2)),
    # learned absolute positions counted from the cache length, fused QKV projection, GELU
    CausalLM("gpt2", "GPT2Config", "GPT2LMHeadModel", _gpt2),
    CausalLM("qwen2", "Qwen2Config", "Qwen2ForCausalLM", _grouped(2)),
    CausalLM("mistral", "MistralConfig", "MistralForCausalLM", _grouped(2, sliding_window=None)),
    # one key/value head for all (multi-query), head_dim set apart from hidden / heads
    CausalLM("gemma", "GemmaConfig", "GemmaForCausalLM",
             lambda **g: _llama_like(**g, num_key_value_heads=1, head_dim=2 * g["hidden"] // g["heads"])),
    CausalLM("phi3", "Phi3Config", "Phi3ForCausalLM", _grouped(1, pad_token_id=0)),
)}


def get_family(name: str) -> CausalLM:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown decoder family {name!r}; known: {', '.join(FAMILIES)}") from None


def build_model(name: str, size: str = "tiny"):
    """The family's causal LM with seeded random weights, fp32, eval mode, sdpa attention."""
    import torch
    import transformers

    family = get_family(name)
    config = getattr(transformers, family.config_class)(**family.config(size))
    config._attn_implementation = "sdpa"
    torch.manual_seed(SEED)
    return getattr(transformers, family.model_class)(config).to(torch.float32).eval()


@dataclasses.dataclass(frozen=True)
class CacheGeometry:
    layers: int
    kv_heads: int
    head_dim: int

    @staticmethod
    def of(model) -> "CacheGeometry":
        """Read back from a cache the model itself fills (not from the config's many spellings)."""
        import torch
        with torch.no_grad():
            out = model(input_ids=torch.zeros((1, 1), dtype=torch.int64), use_cache=True)
        layer = out.past_key_values.layers[0]
        return CacheGeometry(len(out.past_key_values.layers), layer.keys.shape[1], layer.keys.shape[3])

    @staticmethod
    def of_inputs(inputs) -> "CacheGeometry":
        """From an export's graph inputs (onnxruntime's ``session.get_inputs()``: ``.name``, ``.shape``)."""
        past = [i for i in inputs if i.name.startswith("past.")]
        return CacheGeometry(len(past) // 2, past[0].shape[1], past[0].shape[3])


def next_step_inputs(feed: dict[str, np.ndarray], presents: Sequence[np.ndarray],
                     token_ids: np.ndarray) -> dict[str, np.ndarray]:
    """The step after ``feed``: ``token_ids`` ``[batch, n]`` with the step's ``presents`` (in
    :func:`output_names` order, logits excluded) as the cache and the mask grown by n ones."""
    batch, n = token_ids.shape
    mask = np.concatenate([feed["attention_mask"], np.ones((batch, n), np.int64)], axis=1)
    names = input_names(len(presents) // 2)[2:]
    return dict(zip(names, presents), input_ids=token_ids, attention_mask=mask)


def input_names(layers: int) -> list[str]:
    return ["input_ids", "attention_mask"] + [f"past.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def output_names(layers: int) -> list[str]:
    return ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def _wrapper(model, layers: int):
    import torch
    from transformers import DynamicCache

    class WithCache(torch.nn.Module):
        """forward(input_ids, attention_mask, *past) -> (logits, *presents): the cache as tensors."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                             use_cache=True, return_dict=True)
            presents = [t for layer in out.past_key_values.layers[:layers] for t in (layer.keys, layer.values)]
            return (out.logits, *presents)

    return WithCache()


def step_inputs(geometry: CacheGeometry, sequence: int, past: int, rng: np.random.Generator,
                past_values: Sequence[np.ndarray] | None = None, batch: int = 1,
                padding: Sequence[int] = ()) -> dict[str, np.ndarray]:
    """One step's inputs: random token ids, a mask, and the cache (random, or ``past_values`` --
    the previous step's presents). ``padding[b]``: request b's leading positions that are padding
    (mask 0: a shorter request left-padded to the batch's length; at least one real token stays)."""
    feed = {"input_ids": rng.integers(3, VOCAB, (batch, sequence)).astype(np.int64),
            "attention_mask": np.ones((batch, past + sequence), np.int64)}
    for b, pad in enumerate(padding):
        feed["attention_mask"][b, :min(pad, past + sequence - 1)] = 0
    names = input_names(geometry.layers)[2:]
    if past_values is None:
        shape = (batch, geometry.kv_heads, past, geometry.head_dim)
        past_values = [rng.standard_normal(shape).astype(np.float32) for _ in names]
    feed.update(zip(names, past_values))
    return feed


def model_filename(name: str, exporter: str, size: str = "tiny") -> str:
    return f"{name}-cache-{size}-{exporter}.onnx"


def export_decoder(name: str, exporter: str, out_dir: str | os.PathLike, size: str = "tiny") -> pathlib.Path:
    """Export ``name`` with its KV cache into ``out_dir`` (cached, file-locked, atomic like
    :func:`models.export.export_model`); return the .onnx path."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; known: {', '.join(EXPORTERS)}")
    get_family(name).config(size)      # an unknown family or size fails here, before any work
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / model_filename(name, exporter, size)
    return cached_export(path, lambda tmp_path: _export_into(name, exporter, size, tmp_path))


def _export_into(name: str, exporter: str, size: str, path: pathlib.Path) -> None:
    import torch

    with _quiet(), torch.no_grad():
        model = build_model(name, size)
        geometry = CacheGeometry.of(model)
        wrapped = _wrapper(model, geometry.layers)
        feed = step_inputs(geometry, EXAMPLE_SEQUENCE, EXAMPLE_PAST, np.random.default_rng(SEED), batch=2)
        args = tuple(torch.from_numpy(v) for v in feed.values())
        ins, outs = input_names(geometry.layers), output_names(geometry.layers)
        if exporter == "torchscript":
            axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total"},
                    "logits": {0: "batch", 1: "sequence"}}
            axes.update({n: {0: "batch", 2: "past"} for n in ins[2:]})
            axes.update({n: {0: "batch", 2: "total"} for n in outs[1:]})
            torch.onnx.export(wrapped, args, str(path), input_names=ins, output_names=outs, dynamic_axes=axes,
                              opset_version=OPSETS[exporter], dynamo=False)
        else:
            Dim = torch.export.Dim
            sequence, past = Dim("sequence", min=1, max=MAX_SEQUENCE), Dim("past", min=1, max=MAX_PAST)
            total, batch = Dim("total", min=2, max=MAX_PAST + MAX_SEQUENCE), Dim("batch", min=1, max=MAX_BATCH)
            shapes = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: total},
                      "past": tuple({0: batch, 2: past} for _ in ins[2:])}
            torch.onnx.export(wrapped, args, str(path), input_names=ins, output_names=outs,
                              dynamic_shapes=shapes, opset_version=OPSETS[exporter], dynamo=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("--exporter", choices=EXPORTERS, default="torchscript")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("-o", "--out-dir", default=".cache/models")
    args = ap.parse_args(argv)
    print(export_decoder(args.family, args.exporter, args.out_dir, args.size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
