"""Export the model families of ``models.families`` to dynamic-shape ONNX files.

``export_model(family, size, exporter, out_dir)`` writes ``<out_dir>/<family>-<size>-<exporter>.onnx``
(dynamo base models put their weights next to it in ``<name>.onnx.data``) and returns its path. Exports
are cached: an existing file is returned as is. Writers take a file lock and move finished files into
place with ``os.replace``, so concurrent processes (pytest-xdist workers) never see a partial file.

Exporters:

* ``dynamo``: ``torch.onnx.export(dynamo=True)`` with named ``torch.export.Dim`` (opset 20);
* ``torchscript``: ``torch.onnx.export(dynamo=False)`` with ``dynamic_axes`` (opset 17).

Graph inputs always carry the dimension names of the family spec (``batch``, ``sequence`` or
``batch``, ``height``, ``width``); the output is ``last_hidden_state`` with ``batch`` (and ``sequence``
for text models) and the static hidden size.

Command line::

    python -m models.export FAMILY|all --size tiny|base|all --exporter dynamo|torchscript|all -o OUT_DIR
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from models.families import (FAMILIES, SIZES, FamilySpec, build_model, get_family, make_config, make_inputs,
                             symbol_ranges)

EXPORTERS = ("dynamo", "torchscript")
OPSETS = {"dynamo": 20, "torchscript": 17}
OUTPUT_NAME = "last_hidden_state"


def model_filename(family: str, size: str, exporter: str, opset: int | None = None, half: bool = False) -> str:
    """``bert-tiny-dynamo.onnx``; a non-default opset is part of the name (``...-opset14.onnx``), a
    float16 export ends in ``-fp16``."""
    suffix = "" if opset in (None, OPSETS[exporter]) else f"-opset{opset}"
    return f"{family}-{size}-{exporter}{suffix}{'-fp16' if half else ''}.onnx"


# --------------------------------------------------------------------------------------------------
# Wrappers: forward takes exactly the model inputs, in order, and returns last_hidden_state only.
# (Transformers 5 has past_key_values / use_cache among the positional parameters of forward.)


def _wrapper_classes():
    import torch

    class _Wrapper(torch.nn.Module):
        def __init__(self, model: torch.nn.Module, forward_kwargs: Mapping):
            super().__init__()
            self.model = model
            self.forward_kwargs = dict(forward_kwargs)

        def run(self, **inputs):
            return self.model(**inputs, **self.forward_kwargs, return_dict=True).last_hidden_state

    class TextWithTypes(_Wrapper):
        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.run(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)

    class Text(_Wrapper):
        def forward(self, input_ids, attention_mask):
            return self.run(input_ids=input_ids, attention_mask=attention_mask)

    class Vision(_Wrapper):
        def forward(self, pixel_values):
            return self.run(pixel_values=pixel_values)

    return {
        ("input_ids", "attention_mask", "token_type_ids"): TextWithTypes,
        ("input_ids", "attention_mask"): Text,
        ("pixel_values",): Vision,
    }


def wrap_model(spec: FamilySpec, size: str):
    """The seeded model of ``spec`` wrapped so that forward(*inputs) -> last_hidden_state."""
    wrapper = _wrapper_classes()[spec.input_names]
    return wrapper(build_model(spec, size), spec.forward_kwargs).eval()


def example_bindings(spec: FamilySpec, size: str) -> dict[str, int]:
    """Symbol values of the tracing example. Every value differs from the other dims and from 1; a ViT
    image is non-square and its patch count is not the configured one (no shortcut gets baked in)."""
    if spec.image_sides is not None:  # a CNN: odd sides, so no stride-2 stage divides evenly
        return {"batch": 2, "height": 45, "width": 61}
    if spec.is_vision:
        patch = make_config(spec, size).patch_size
        return {"batch": 2, "height": 5 * patch, "width": 7 * patch}
    return {"batch": 2, "sequence": 11}


def example_inputs(spec: FamilySpec, size: str) -> dict[str, np.ndarray]:
    return make_inputs(spec, example_bindings(spec, size), np.random.default_rng(1234), size=size)


# --------------------------------------------------------------------------------------------------
# Exporters


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence exporter warnings, transformers / onnxscript logging and the dynamo exporter's progress
    prints (shown again if the export fails)."""
    captured = io.StringIO()
    loggers = [logging.getLogger(n) for n in ("transformers", "onnxscript", "torch.onnx", "torch.export",
                                               "torch._dynamo", "torch.fx.experimental.symbolic_shapes")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            with contextlib.redirect_stdout(captured):
                yield
        except BaseException:
            sys.stderr.write(captured.getvalue())
            raise
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def _export_dynamo(model, spec: FamilySpec, size: str, args: tuple, path: pathlib.Path, opset: int) -> None:
    import torch

    ranges = symbol_ranges(spec, size)
    dims = {name: torch.export.Dim(name, min=low, max=high) for name, (low, high) in ranges.items()}
    dynamic_shapes = {
        inp.name: {axis: dims[d] for axis, d in enumerate(inp.dims) if isinstance(d, str)}
        for inp in spec.inputs
    }
    torch.onnx.export(
        model, args, str(path), dynamo=True, dynamic_shapes=dynamic_shapes,
        input_names=list(spec.input_names), output_names=[OUTPUT_NAME],
        opset_version=opset, external_data=(size == "base"), verbose=False,
    )


def _export_torchscript(model, spec: FamilySpec, size: str, args: tuple, path: pathlib.Path, opset: int) -> None:
    import torch

    dynamic_axes = {
        inp.name: {axis: d for axis, d in enumerate(inp.dims) if isinstance(d, str)} for inp in spec.inputs
    }
    dynamic_axes[OUTPUT_NAME] = _output_symbols(spec)
    torch.onnx.export(
        model, args, str(path), dynamo=False, dynamic_axes=dynamic_axes,
        input_names=list(spec.input_names), output_names=[OUTPUT_NAME],
        opset_version=opset, do_constant_folding=True,
    )


_EXPORT_FUNCTIONS = {"dynamo": _export_dynamo, "torchscript": _export_torchscript}


def _output_symbols(spec: FamilySpec) -> dict[int, str]:
    """Dims of last_hidden_state named by the TorchScript exporter's dynamic_axes."""
    return {0: "batch"} if spec.is_vision else {0: "batch", 1: "sequence"}


def output_dims(spec: FamilySpec, size: str) -> list[str | int]:
    """Shape of last_hidden_state. ViT's token count is written as the dynamo exporter writes it,
    ``((height//P))*((width//P)) + 1``, for both exporters."""
    config = make_config(spec, size)
    if spec.image_sides is not None:
        return ["batch", config.hidden_sizes[-1], *_cnn_output_sides(config)]
    if spec.is_vision:
        patch = config.patch_size
        return ["batch", f"((height//{patch}))*((width//{patch})) + 1", config.hidden_size]
    return ["batch", "sequence", config.hidden_size]  # hidden_size aliases dim / n_embd


def _cnn_output_sides(config) -> list[str]:
    """ResNet's output height and width as the dynamo exporter writes them: the stem's stride-2 Conv
    and MaxPool and one stride-2 stage per stage after the first each round up, ``ceil(x / 2**k)``."""
    stride = 2 ** (2 + len(config.hidden_sizes) - 1)
    return [f"((({name} - 1)//{stride})) + 1" for name in ("height", "width")]


# --------------------------------------------------------------------------------------------------
# Post-processing: dimension names, node metadata


def _rename_in(dim_param: str, renames: Mapping[str, str]) -> str:
    """Apply symbol renames to a dim_param, which may be an expression such as ``(s0//16)*(s1//16)+1``."""
    if not renames:
        return dim_param
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, renames)) + r")\b")
    return pattern.sub(lambda m: renames[m.group(1)], dim_param)


def finalize_export(path: pathlib.Path, spec: FamilySpec, size: str, exporter: str) -> None:
    """Rewrite an exported file in place.

    * Graph inputs get the spec's dim names: exporter-chosen symbols are renamed everywhere (inputs,
      outputs, value_info, also inside expressions). Raises if a dynamic input dim was made static.
    * last_hidden_state gets ``output_dims``: the dynamo exporter's dims must already match; the
      TorchScript exporter's are overwritten (it names static or computed dims such as
      ``LayerNormalizationlast_hidden_state_dim_2``).
    * Node metadata (dynamo: source stack traces with absolute paths, module names) is dropped, so a
      file does not depend on where or how the export was run.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    renames = _input_renames(graph, spec, path.name)
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                dim.dim_param = _rename_in(dim.dim_param, renames)
    _set_output_dims(graph, output_dims(spec, size), check=(exporter == "dynamo"), where=path.name)
    for node in graph.node:
        del node.metadata_props[:]
    onnx.save(model, str(path))


def _input_renames(graph, spec: FamilySpec, where: str) -> dict[str, str]:
    """Exporter symbol -> spec symbol, from the graph inputs. Raises if a dynamic dim was made static."""
    renames: dict[str, str] = {}
    by_name = {vi.name: vi for vi in graph.input}
    for inp in spec.inputs:
        dims = by_name[inp.name].type.tensor_type.shape.dim
        for axis, want in enumerate(inp.dims):
            if isinstance(want, int):
                continue
            if not dims[axis].HasField("dim_param"):
                raise RuntimeError(f"{where}: input {inp.name} axis {axis} was exported static ({dims[axis]})")
            if dims[axis].dim_param != want:
                renames[dims[axis].dim_param] = want
    return renames


def _set_output_dims(graph, want: Sequence[str | int], check: bool, where: str) -> None:
    (output,) = graph.output
    dims = output.type.tensor_type.shape.dim
    have = [d.dim_param if d.HasField("dim_param") else d.dim_value for d in dims]
    if check and have != list(want):
        raise RuntimeError(f"{where}: output dims {have}, expected {list(want)}")
    for dim, value in zip(dims, want):
        if isinstance(value, int):
            dim.dim_value = value
        else:
            dim.dim_param = value


# --------------------------------------------------------------------------------------------------
# Cached, atomic export


@contextlib.contextmanager
def _lock(path: pathlib.Path) -> Iterator[None]:
    """An inter-process lock on ``path`` (filelock ships with torch)."""
    from filelock import FileLock

    with FileLock(str(path.with_name(f".{path.name}.lock"))):
        yield


def export_model(family: str, size: str, exporter: str, out_dir: str | os.PathLike,
                 opset: int | None = None, half: bool = False) -> pathlib.Path:
    """Export ``family`` at ``size`` with ``exporter`` into ``out_dir``; return the .onnx path.

    ``opset`` defaults to the exporter's own (``OPSETS``); TorchScript takes 14..20. ``half``: the
    model in float16 (``model.half()``, float inputs and outputs float16; the TorchScript exporter
    writes a LayerNormalization with mixed types that onnxruntime refuses, the dynamo one does not).

    An existing file is reused. The model is exported into a private temporary folder in ``out_dir``,
    its dim names normalized, then moved into place (external data first, the .onnx last).
    """
    spec = get_family(family)
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; known: {', '.join(EXPORTERS)}")
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    opset = opset or OPSETS[exporter]
    path = out_dir / model_filename(spec.name, size, exporter, opset, half)
    return cached_export(path, lambda tmp_path: _export_into(spec, size, exporter, tmp_path, opset, half))


def cached_export(path: pathlib.Path, write: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """``path`` if it exists; else ``write(tmp_path)`` exports into a private temporary folder next
    to it, under a file lock, and the files it made are moved into place (external data first, the
    .onnx last), so a concurrent reader never sees a partial export."""
    if path.exists():
        return path
    with _lock(path):
        if path.exists():
            return path
        tmp_dir = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=path.parent))
        try:
            write(tmp_dir / path.name)
            for produced in sorted(tmp_dir.iterdir(), key=lambda p: p.name == path.name):
                os.replace(produced, path.parent / produced.name)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return path


def _export_into(spec: FamilySpec, size: str, exporter: str, path: pathlib.Path, opset: int,
                 half: bool = False) -> None:
    import torch

    with _quiet(), torch.no_grad():
        model = wrap_model(spec, size)
        inputs = example_inputs(spec, size).values()
        if half:
            model = model.half()
            inputs = [v.astype(np.float16) if v.dtype == np.float32 else v for v in inputs]
        args = tuple(torch.from_numpy(v) for v in inputs)
        _EXPORT_FUNCTIONS[exporter](model, spec, size, args, path, opset)
    finalize_export(path, spec, size, exporter)


# --------------------------------------------------------------------------------------------------
# Checking an export against torch (used by the tests and by --verify)


def run_both(path: str | os.PathLike, family: str, size: str, bindings_list: Sequence[Mapping[str, int]],
             seed: int = 0) -> Iterator[tuple[dict[str, int], np.ndarray, np.ndarray]]:
    """For each binding, run the ONNX file (onnxruntime, CPU) and the seeded torch model on the same
    random inputs; yield (bindings, onnx last_hidden_state, torch last_hidden_state)."""
    import onnxruntime as ort
    import torch

    spec = get_family(family)
    model = wrap_model(spec, size)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    for bindings in bindings_list:
        inputs = make_inputs(spec, bindings, rng, size=size)
        (got,) = session.run([OUTPUT_NAME], inputs)
        with torch.no_grad():
            want = model(*(torch.from_numpy(v) for v in inputs.values())).numpy()
        yield dict(bindings), got, want


def max_difference(path: str | os.PathLike, family: str, size: str) -> float:
    """Largest |onnx - torch| of last_hidden_state over the two ``check_bindings`` shapes."""
    diffs = [np.inf if got.shape != want.shape else float(np.max(np.abs(got - want)))
             for _, got, want in run_both(path, family, size, check_bindings(family, size))]
    return max(diffs)


def check_bindings(family: str, size: str) -> list[dict[str, int]]:
    """Two shapes a check runs at (different from the export example)."""
    spec = get_family(family)
    if spec.image_sides is not None:
        low, high = spec.image_sides[size]
        return [{"batch": 1, "height": max(low, 32), "width": max(low, 32)},
                {"batch": 2, "height": min(high, 67), "width": max(low, 40)}]
    if spec.is_vision:
        patch = make_config(spec, size).patch_size
        return [{"batch": 1, "height": 4 * patch, "width": 4 * patch},
                {"batch": 2, "height": 3 * patch, "width": 6 * patch + patch // 2}]
    return [{"batch": 1, "sequence": 7}, {"batch": 2, "sequence": 13}]


# --------------------------------------------------------------------------------------------------
# Command line


def _expand(value: str, choices: Iterable[str]) -> list[str]:
    return list(choices) if value == "all" else [value]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=[*FAMILIES, "all"])
    parser.add_argument("--size", choices=[*SIZES, "all"], default="tiny")
    parser.add_argument("--exporter", choices=[*EXPORTERS, "all"], default="dynamo")
    parser.add_argument("-o", "--out-dir", default=".cache/models")
    parser.add_argument("--verify", action="store_true",
                        help="compare each file with the torch model at two shapes (onnxruntime)")
    parser.add_argument("--time", action="store_true", help="print the time each export took to stderr")
    parser.add_argument("--half", action="store_true", help="export the model in float16 (model.half())")
    args = parser.parse_args(argv)
    if args.half and args.verify:
        parser.error("--verify compares with the float32 torch model; it does not apply to --half")

    for family in _expand(args.family, FAMILIES):
        for size in _expand(args.size, SIZES):
            for exporter in _expand(args.exporter, EXPORTERS):
                start = time.perf_counter()
                path = export_model(family, size, exporter, args.out_dir, half=args.half)
                if args.time:
                    print(f"{path.name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
                if args.verify:
                    diff = max_difference(path, family, size)
                    print(f"{path.name}: max |onnx - torch| = {diff:.2e}", file=sys.stderr)
                print(path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
