"""Channel-blocked activations between convolutions: the layout pass of the CPU Conv families.

tscomp's tensors are NCHW, as exported. A Conv whose SIMD lanes run along the channels -- the
channel-blocked depthwise kernel, a 1x1 Conv at a few positions -- then transposes its input into
[position][lane] blocks and its result back, and for MobileNet's inverted residual blocks
(1x1 expand -> depthwise 3x3 -> 1x1 project) those transposes cost more than the depthwise FMAs.
onnxruntime (its NCHWc transformer) and oneDNN keep such tensors *channel-blocked* between
convolutions instead; onnxruntime without that layout ran MobileNetV2 1.6-1.8x slower on the
development machine (AMD Zen 4, 2 threads), slower than tscomp in NCHW.

This pass decides, after the families are chosen and the configurations scheduled, which
intermediate tensors are stored channel-blocked: element (n, c, p) of a tensor [N, C, *spatial]
at ``((n * C/L + c / L) * P + p) * L + c % L``, L the target's vector width -- a permutation of the
same bytes, so the symbolic buffer plan, the arena and every size stay as they are. A tensor is
blocked when

* a Conv group (``conv`` or ``conv-depthwise`` family) produces it as its only output, in the
  Conv's own output space (no permuted store), with C a whole number of blocks, and it is not a
  model output;
* every group that reads it is a Conv group reading it as its X, directly (no view, no prologue) --
  a 1x1 stride-1 unpadded Conv (its column gather transposes [position][lane] rows) or a depthwise
  Conv without a channel multiplier (its rows are copied, not transposed) -- or as an operand of its
  fused epilogue (a residual Add: a blocked epilogue reads it along its lanes, an NCHW one at the
  spelled-out blocked index), not in a fused prologue; and
* a depthwise Conv writes it or reads it as X: that is where the layout saves a transpose (the
  channel-blocked depthwise kernel's lanes run along the channels). Between implicit-GEMM Convs it
  saves nothing -- their column gathers and tiles then transpose what NCHW copies contiguously --
  and measured so: ResNet-50 at 224x224 with its 32 such tensors blocked took 1.02x the time of
  NCHW (AMD Zen 4, 2 threads); MobileNetV2's residual stream blocked as well (49 tensors instead
  of 40) changed nothing measurable.

A depthwise group on either side keeps only its channel-blocked variant (the direct kernel's lanes
run along the positions). The producer's epilogue stores whole vectors of channels
(:meth:`~tscomp.codegen.cpu_conv.TileEpilogue.generate_function` with ``lanes``); Python-side runs
(:meth:`~tscomp.codegen.cpu_conv.CompiledConv.run`) convert around the call, so every tensor a
user or a test sees is NCHW.
"""
from __future__ import annotations

from dataclasses import dataclass

from tscomp.codegen.cpu_conv_winograd import WinogradConfig
from tscomp.codegen.tile_config import VECTOR_WIDTH
from tscomp.errors import UnsupportedOperatorError

#: the families whose kernels read and write channel-blocked tensors
CONV_FAMILIES = ("conv", "conv-depthwise")


@dataclass(frozen=True)
class BlockedTensor:
    """One tensor stored channel-blocked: its producer and consumer groups, the block width."""
    name: str
    producer: str
    consumers: tuple[str, ...]
    lanes: int


def block_conv_chains(plan, choices: dict, schedules, target) -> list[BlockedTensor]:
    """Decide and apply the channel-blocked tensors of ``plan`` (see the module docstring):
    the analyses learn their layouts, depthwise schedules keep their channel-blocked variants.
    Returns what was blocked (empty on a target without vectors of at least 8 floats)."""
    lanes = VECTOR_WIDTH.get(target.isa, 1)
    if target.name != "cpu" or lanes < 8:
        return []
    done = []
    for t in blockable_tensors(plan, choices, schedules, lanes):
        if _apply(t, choices, schedules, target):
            done.append(t)
    return done


def blockable_tensors(plan, choices: dict, schedules, lanes: int) -> list[BlockedTensor]:
    """The tensors the rules allow to be stored in blocks of ``lanes`` channels (nothing applied)."""
    readers: dict[str, list] = {}
    for g in plan.groups:
        for name in g.inputs:
            readers.setdefault(name, []).append(g)
    outputs = set(plan.graph.outputs)
    found = []
    for g in plan.groups:
        if len(g.outputs) != 1 or not _conv(choices, g):
            continue
        (name,) = g.outputs
        consumers = readers.get(name, [])
        if (name in outputs or not consumers or not _writes_blockable(choices[g.name].analysis, name, lanes)
                or not _has_blocked_variant(choices, schedules, g)):
            continue
        if not all(_conv(choices, q) and _reads_blockable(choices[q.name].analysis, name)
                   and _has_blocked_variant(choices, schedules, q) for q in consumers):
            continue
        if _depthwise(choices, g) or any(_depthwise(choices, q) and choices[q.name].analysis.x_input == name
                                         for q in consumers):
            found.append(BlockedTensor(name, g.name, tuple(q.name for q in consumers), lanes))
    return found


def _depthwise(choices, group) -> bool:
    return choices[group.name].family.name == "conv-depthwise"


def _conv(choices, group) -> bool:
    c = choices.get(group.name)
    return c is not None and c.family is not None and c.family.name in CONV_FAMILIES


def _writes_blockable(a, name: str, lanes: int) -> bool:
    shape = a.out_shapes.get(name)
    return (shape is not None and len(shape) == len(a.out_shape) and all(x == y for x, y in zip(shape, a.out_shape))
            and not a.scattered_store and a.OC % lanes == 0
            and (a.family == "conv-depthwise" or a.G == 1 or a.OCg % lanes == 0))   # whole blocks per group


def _reads_blockable(a, name: str) -> bool:
    """Whether a Conv group reads tensor ``name`` only where it can read it blocked: as its X (a
    1x1 Conv or a depthwise one, directly) and as an operand of its epilogue (a residual), not in
    a fused prologue."""
    if _reads_as(a, a.pro_args, name):
        return False
    if a.x_input != name:
        return _reads_as_operand(a, name)
    if a.x_chain or a.prologue:
        return False
    if a.family == "conv-depthwise":
        return a.OCg == 1
    return a.pointwise and a.G == 1


def _reads_as_operand(a, name: str) -> bool:
    return _reads_as(a, a.epi_args, name)


def _reads_as(a, args, name: str) -> bool:
    """Whether tensor ``name`` is an input among the analysis' arguments ``args`` (epilogue or
    prologue argument indices)."""
    return any(a.arg_roles[i][:2] == ("input", name) for i in args)


def _has_blocked_variant(choices, schedules, group) -> bool:
    """A depthwise group needs its channel-blocked configuration among the scheduled variants."""
    if choices[group.name].family.name != "conv-depthwise":
        return True
    return any(_channel_blocked(v.config) for v in schedules.groups[group.name].variants)


def _channel_blocked(config) -> bool:
    from tscomp.codegen.cpu_depthwise_channels import DepthwiseChannelBlocks
    return isinstance(config, DepthwiseChannelBlocks)


def _apply(t: BlockedTensor, choices, schedules, target) -> bool:
    """Set the layouts of one tensor's producer and consumers; False (nothing changed) when the
    producer's epilogue cannot be generated in the blocked form."""
    producer = choices[t.producer].analysis
    operands = [choices[q].analysis for q in t.consumers if _reads_as_operand(choices[q].analysis, t.name)]
    try:
        producer.store_blocked(t.lanes)
        for a in operands:
            a.read_blocked_operand(t.name, t.lanes)
    except UnsupportedOperatorError:      # an epilogue that cannot be generated so: all back to NCHW
        producer.store_blocked(0)
        for a in operands:
            a.read_blocked_operand(t.name, 0)
        return False
    for q in t.consumers:
        if choices[q].analysis.x_input == t.name:
            choices[q].analysis.read_blocked(t.lanes)
            if choices[q].family.name == "conv":        # a 1x1: its row-vector tiles read the blocks in place
                _add_row_vector_tiles(schedules.groups[q], choices[q], target)
    for name in (t.producer, *t.consumers):
        s = schedules.groups[name]
        if choices[name].family.name == "conv-depthwise":
            s.variants = [v for v in s.variants if _channel_blocked(v.config)]
        else:           # the Winograd and the padded-planes strategies read and write NCHW only
            s.variants = [v for v in s.variants
                          if not isinstance(v.config, WinogradConfig) and not getattr(v.config, "planes", False)]
    if choices[t.producer].family.name == "conv" and producer.pointwise:
        _add_row_vector_tiles(schedules.groups[t.producer], choices[t.producer], target)
    return True


#: heuristic row-vector tiles added to a channel-blocked 1x1 producer's variants
ROW_VECTOR_VARIANTS = 2


def _add_row_vector_tiles(schedule, choice, target) -> None:
    """A 1x1 Conv next to a channel-blocked tensor is often best computed with the lanes along the
    channels (``vector_axis`` 0). Writing one, the register tile is then position-major, whole
    vectors of one block's channels, and goes to the blocked epilogue as it is, while a
    column-vector tile is transposed a block at a time -- for the few FMAs per output of MobileNet's
    expand (K = 24 at 56x56) that cost as much as the tile (2x the NCHW kernel's time). Reading
    one, each position's channels are a broadcast straight from the blocked input, with no column
    block gathered (:func:`~tscomp.codegen.cpu_conv.reads_blocks_in_place`). A deep K amortizes
    the transposes, and a big image's column tiles may stay ahead. So the family's heuristic
    row-vector tiles join the scheduled variants, and the dispatch measures them side by side and
    picks per shape. A Conv with a window keeps its tiles."""
    from tscomp.schedule.schedules import ScheduledVariant
    if any(v.config.vector_axis == 0 for v in schedule.variants):
        return
    # the family's heuristic lists every tile (row-vector ones after the first column tiles)
    rows = [c for c in choice.family.heuristic(choice.analysis, target, 99) if c.vector_axis == 0]
    schedule.variants = list(schedule.variants) + [ScheduledVariant(c) for c in rows[:ROW_VECTOR_VARIANTS]]
