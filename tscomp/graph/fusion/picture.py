"""A picture of a fusion :class:`~tscomp.graph.fusion.plan.Plan`: what ``tscomp inspect
--groups --picture PATH`` draws.

Fused groups are boxes (name, kind, backbone and the fused op types), coloured by kind;
the tensors that cross between groups are arrows labelled with their symbolic shapes;
graph inputs and outputs are small rounded nodes of their own. Weights and other
constants are not drawn (they are read, never produced).

The layout is a small layered (Sugiyama-style) drawing, top to bottom: layers are
NetworkX topological generations (graph inputs moved down to sit just above their
first reader), an edge that spans several layers is routed through a lane of
placeholder points so it never crosses a box, the order within a layer comes from
barycenter sweeps, and x positions from a few rounds of pulling each node toward its
neighbours and packing the layer. The figure is measured in inches from the layout,
so its height grows with the number of layers and text keeps one size.

Rendering uses matplotlib's Agg backend (no display needed); the file format follows
the path's extension (``.png`` or ``.svg``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
import numpy as np

from tscomp.graph.fusion.plan import Group, Plan

#: file formats ``draw_plan`` writes, by extension
FORMATS = {".png": "png", ".svg": "svg"}

#: box colours (fill, edge) by group kind
KIND_COLORS = {
    "gemm": ("#cfe2ff", "#2f5da8"),
    "reduce": ("#ffe0b8", "#b86200"),
    "elementwise": ("#d6f0d6", "#2e7d32"),
    "opaque": ("#e4e4e4", "#555555"),
}
INPUT_COLORS = ("#fff6c2", "#9a8200")
OUTPUT_COLORS = ("#f8d4e4", "#a3195b")

#: shorter names for long ONNX op types inside the boxes
OP_ABBREV = {
    "LayerNormalization": "LayerNorm",
    "SkipLayerNormalization": "SkipLN",
    "GroupNormalization": "GroupNorm",
    "BatchNormalization": "BatchNorm",
    "InstanceNormalization": "InstNorm",
    "SimplifiedLayerNormalization": "RMSNorm",
    "GreaterOrEqual": "GE",
    "LessOrEqual": "LE",
    "ReduceMean": "RMean",
    "ReduceSum": "RSum",
    "ReduceMax": "RMax",
    "ConstantOfShape": "ConstOfShape",
}

FONT = 8.0                  # points, box text and edge labels
SMALL = 7.0                 # points, input/output nodes
CHAR_W = 0.60 * FONT / 72   # inches per character (DejaVu Sans, a generous average)
LINE_H = 1.35 * FONT / 72   # inches per text line
LAYER_GAP = 0.62            # inches between the bottom of one layer and the top of the next
NODE_GAP = 0.30             # inches between neighbouring boxes of a layer
LANE_W = 0.16               # inches a routed edge takes in a layer it passes through
MAX_OPS_CHARS = 34          # characters per op-type line in a box
MAX_LABEL_CHARS = 48        # characters per line of a shape label (long symbolic shapes wrap)
MAX_PIXELS = 32000          # cap on the PNG's longest side (Agg's limit is 2**16)


# ----------------------------------------------------------------------------- labels
def _abbrev(op_type: str) -> str:
    return OP_ABBREV.get(op_type, op_type)


def _counted(ops) -> list[str]:
    """``[Add, Add, Mul]`` -> ``["Add×2", "Mul"]``, keeping first-seen order."""
    counts = Counter(_abbrev(o.op_type) for o in ops)
    return [name if k == 1 else f"{name}×{k}" for name, k in counts.items()]


def _wrap(parts: list[str], width: int, max_lines: int = 2) -> list[str]:
    """Join ``parts`` into lines of at most ``width`` characters; what does not fit in
    ``max_lines`` lines is summarized as ``+N more``."""
    lines: list[str] = []
    current = ""
    for k, part in enumerate(parts):
        candidate = part if not current else f"{current} {part}"
        if len(candidate) <= width or not current:
            current = candidate
            continue
        lines.append(current)
        current = part
        if len(lines) == max_lines:
            lines[-1] = f"{lines[-1]} +{len(parts) - k} more"
            return lines
    if current:
        lines.append(current)
    return lines


def group_label(group: Group) -> list[str]:
    """The text of a group's box: name, kind and backbone, then the fused op types in
    order prologue → heavy → epilogue (repeats counted, long names abbreviated)."""
    pro, heavy, epi = group.prologue_epilogue()
    head = group.kind if not group.backbone else f"{group.kind} · {_abbrev(group.backbone)}"
    stages = [" ".join(_counted(s)) for s in (pro, heavy, epi) if s]
    parts: list[str] = []
    for k, stage in enumerate(stages):
        words = stage.split(" ")
        if k:
            words[0] = "→ " + words[0]
        parts.extend(words)
    ops = _wrap(parts, MAX_OPS_CHARS) if parts else ["(copy)"]
    n_views = len(set(group.nodes) - {o.node for o in group.ops()})
    if n_views:
        ops[-1] += f"  +{n_views} view{'s' if n_views > 1 else ''}"
    return [group.name, head, *ops]


def _dims(v, prefix: str = "") -> str:
    """``[batch, sequence, 384]`` (dtype in front unless float32), wrapped after a comma when
    longer than :data:`MAX_LABEL_CHARS`."""
    dtype = None if v.dtype is None else np.dtype(v.dtype).name
    head = prefix + ("" if dtype in (None, "float32") else dtype)
    if v.shape is None:
        return head + "?"
    dims = [str(d) for d in v.shape]
    lines, current = [], head + "["
    for k, d in enumerate(dims):
        piece = d + ("]" if k == len(dims) - 1 else ",")
        short_tail = k == len(dims) - 1 and len(piece) <= 6  # no lone "1]" line
        if len(current) + 1 + len(piece) > MAX_LABEL_CHARS and not short_tail and not current.endswith("["):
            lines.append(current)
            current = piece
        else:
            current += ("" if current.endswith("[") else " ") + piece
    if not dims:
        current += "]"
    lines.append(current)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- layout
@dataclass
class _Node:
    key: str
    kind: str                       # "group" | "input" | "output" | "dummy"
    lines: list[str] = field(default_factory=list)
    color: tuple[str, str] = ("white", "black")
    layer: int = 0
    w: float = LANE_W
    h: float = 0.0
    x: float = 0.0
    label: str | None = None        # shapes of the tensors a group writes, drawn below it

    @property
    def span(self) -> float:
        """The width the node takes in its layer: its box, or its label if wider."""
        label = max((len(line) for line in (self.label or "").split("\n")), default=0)
        return max(self.w, label * CHAR_W * (FONT - 0.5) / FONT + 0.1)


@dataclass
class _Edge:
    src: str
    dst: str
    tensors: list[str]
    route: list[str] = field(default_factory=list)  # dummy nodes between src and dst


def _build(plan: Plan) -> tuple[dict[str, _Node], list[_Edge]]:
    graph = plan.graph
    nodes: dict[str, _Node] = {}
    producer: dict[str, str] = {}
    for name in graph.inputs:
        nodes[f"in:{name}"] = _Node(f"in:{name}", "input", [name], INPUT_COLORS)
        producer[name] = f"in:{name}"
    for g in plan.groups:
        key = f"g:{g.name}"
        nodes[key] = _Node(key, "group", group_label(g), KIND_COLORS.get(g.kind, KIND_COLORS["opaque"]))
        for out in g.outputs:
            producer[out] = key
    for name in graph.outputs:
        nodes[f"out:{name}"] = _Node(f"out:{name}", "output", [name], OUTPUT_COLORS)

    edges: dict[tuple[str, str], _Edge] = {}

    def connect(value: str, dst: str) -> None:
        src = producer.get(value)
        if src is None or src == dst:
            return  # a weight or constant
        e = edges.setdefault((src, dst), _Edge(src, dst, []))
        if value not in e.tensors:
            e.tensors.append(value)

    for g in plan.groups:
        for value in g.inputs:
            connect(value, f"g:{g.name}")
    for name in graph.outputs:
        connect(name, f"out:{name}")
    # a graph input shows its shape in its own node; a group's written tensors are labelled
    # once, just below the group (named too when it writes more than one)
    for name in graph.inputs:
        nodes[f"in:{name}"].lines.append(_dims(graph.values[name]))
    for g in plan.groups:
        key = f"g:{g.name}"
        written = [t for e in edges.values() if e.src == key for t in e.tensors]
        written = list(dict.fromkeys(written))
        if len(written) == 1:
            nodes[key].label = _dims(graph.values[written[0]])
        elif written:
            nodes[key].label = "\n".join(_dims(graph.values[t], prefix=f"{t}: ") for t in written)
    for node in nodes.values():
        size = SMALL if node.kind in ("input", "output") else FONT
        chars = max(len(line) for line in node.lines)
        node.w = chars * CHAR_W * size / FONT + (0.16 if node.kind == "group" else 0.12)
        if node.kind != "group":  # inputs and outputs (placeholders are added later)
            node.w = max(node.w, 0.6)
        node.h = len(node.lines) * LINE_H * size / FONT + (0.14 if node.kind == "group" else 0.08)
    return nodes, list(edges.values())


def _assign_layers(nodes: dict[str, _Node], edges: list[_Edge]) -> None:
    dg = nx.DiGraph()
    dg.add_nodes_from(nodes)
    dg.add_edges_from((e.src, e.dst) for e in edges)
    for k, generation in enumerate(nx.topological_generations(dg)):
        for key in generation:
            nodes[key].layer = k
    # sources (graph inputs, weight-only groups) sit just above their first reader
    for key in nodes:
        succ = list(dg.successors(key))
        if dg.in_degree(key) == 0 and succ:
            nodes[key].layer = max(0, min(nodes[s].layer for s in succ) - 1)
    # graph outputs sit just below their producer
    for key, node in nodes.items():
        pred = list(dg.predecessors(key))
        if node.kind == "output" and pred:
            node.layer = max(nodes[p].layer for p in pred) + 1


def _route(nodes: dict[str, _Node], edges: list[_Edge]) -> None:
    """Placeholder points in every layer an edge passes through. The edges of one source
    share them: a tensor read by many later groups (BERT's attention mask) runs down one
    lane and branches off above each reader."""
    for e in edges:
        lo, hi = nodes[e.src].layer, nodes[e.dst].layer
        for layer in range(lo + 1, hi):
            key = f"lane:{e.src}:{layer}"
            nodes.setdefault(key, _Node(key, "dummy", layer=layer))
            e.route.append(key)


def _chains(edges: list[_Edge]) -> list[tuple[str, str]]:
    pairs: dict[tuple[str, str], None] = {}
    for e in edges:
        path = [e.src, *e.route, e.dst]
        pairs.update(dict.fromkeys(zip(path, path[1:])))
    return list(pairs)


def _crossings(layers: list[list[str]], down: dict[str, list[str]]) -> int:
    total = 0
    for upper, lower in zip(layers, layers[1:]):
        pos = {key: i for i, key in enumerate(lower)}
        ends = [pos[d] for u in upper for d in sorted(down.get(u, []), key=pos.get) if d in pos]
        total += sum(1 for i in range(len(ends)) for j in range(i + 1, len(ends)) if ends[j] < ends[i])
    return total


def _order(nodes: dict[str, _Node], pairs: list[tuple[str, str]]) -> list[list[str]]:
    """Node order within each layer: barycenter sweeps down and up, keeping the best."""
    n_layers = max(n.layer for n in nodes.values()) + 1
    layers: list[list[str]] = [[] for _ in range(n_layers)]
    for key, node in nodes.items():  # insertion order: inputs, groups in plan order, outputs
        layers[node.layer].append(key)
    up: dict[str, list[str]] = {}
    down: dict[str, list[str]] = {}
    for a, b in pairs:
        down.setdefault(a, []).append(b)
        up.setdefault(b, []).append(a)

    def sweep(order, neighbours, rng):
        for li in rng:
            ref = {key: i for i, key in enumerate(order[li - 1 if rng.step > 0 else li + 1])}
            current = {key: i for i, key in enumerate(order[li])}

            def bary(key):
                ns = [ref[n] for n in neighbours.get(key, []) if n in ref]
                return sum(ns) / len(ns) if ns else current[key]
            order[li] = sorted(order[li], key=lambda key: (bary(key), current[key]))

    # crossing counts are quadratic in a layer's edges: only count on modest graphs
    count = len(pairs) < 3000
    best = [list(layer) for layer in layers]
    best_cross = _crossings(best, down) if count else 0
    for _ in range(6):
        sweep(layers, up, range(1, n_layers, 1))
        sweep(layers, down, range(n_layers - 2, -1, -1))
        if not count:
            best = [list(layer) for layer in layers]
            continue
        cross = _crossings(layers, down)
        if cross < best_cross:
            best, best_cross = [list(layer) for layer in layers], cross
    return best


def _pack(keys: list[str], nodes: dict[str, _Node], want: dict[str, float]) -> None:
    """Place a layer's nodes in order, as near their wanted x as the gaps allow."""
    if not keys:
        return
    def spacing(a: _Node, b: _Node) -> float:
        boxes = a.kind != "dummy" and b.kind != "dummy"
        return (a.span + b.span) / 2 + (NODE_GAP if boxes else NODE_GAP / 3)

    gap = [0.0] + [spacing(nodes[a], nodes[b]) for a, b in zip(keys, keys[1:])]
    offsets = np.cumsum(gap)
    # the best shift of a rigid row is the mean of (want - offset); then let each node
    # slide toward its wish within the slack of a left and a right packing
    x = offsets + float(np.mean([want[k] - o for k, o in zip(keys, offsets)]))
    for _ in range(2):
        for i, key in enumerate(keys):
            lo = x[i - 1] + gap[i] if i else -np.inf
            hi = x[i + 1] - gap[i + 1] if i + 1 < len(keys) else np.inf
            x[i] = min(max(want[key], lo), hi)
    for key, xi in zip(keys, x):
        nodes[key].x = float(xi)


def _place(nodes: dict[str, _Node], layers: list[list[str]], pairs: list[tuple[str, str]]) -> None:
    """x of every node: sweeps down and up the layers, each node wanting the mean x of its
    neighbours above and below (so lanes straighten and chains line up)."""
    neighbours: dict[str, list[str]] = {}
    for a, b in pairs:
        neighbours.setdefault(a, []).append(b)
        neighbours.setdefault(b, []).append(a)
    for layer in layers:
        _pack(layer, nodes, {k: 0.0 for k in layer})
    for it in range(8):
        for li in range(1, len(layers)) if it % 2 == 0 else range(len(layers) - 2, -1, -1):
            want = {key: float(np.mean([nodes[n].x for n in neighbours[key]])) if key in neighbours
                    else nodes[key].x for key in layers[li]}
            _pack(layers[li], nodes, want)


# ----------------------------------------------------------------------------- drawing
def _curve(p0, p1):
    """A cubic Bézier from p0 down to p1 with vertical tangents at both ends."""
    (x0, y0), (x1, y1) = p0, p1
    d = (y0 - y1) / 2
    return [(x0, y0 - d), (x1, y1 + d), (x1, y1)]


def layout(plan: Plan) -> tuple[dict[str, _Node], list[_Edge], list[list[str]]]:
    """Nodes (keys ``in:NAME``, ``g:GROUP``, ``out:NAME`` and lane placeholders) with their
    layer and x (inches), the edges with their routes, and each layer's nodes left to right."""
    nodes, edges = _build(plan)
    if not nodes:
        raise ValueError("the plan has no groups to draw")
    _assign_layers(nodes, edges)
    _route(nodes, edges)
    pairs = _chains(edges)
    layers = _order(nodes, pairs)
    _place(nodes, layers, pairs)
    return nodes, edges, layers


def draw_plan(plan: Plan, path, *, title: str | None = None) -> Path:
    """Draw ``plan`` to ``path`` (``.png`` or ``.svg``) and return the path."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"cannot draw a picture as {path.name!r}: use a .png or .svg file name")

    # the Agg canvas directly: no pyplot, no display, no global backend switch
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, PathPatch
    from matplotlib.path import Path as MPath

    nodes, edges, layers = layout(plan)

    # y: layer 0 at the top; each layer as tall as its tallest box, and the gap below it
    # taller when a group's label there has several lines (a group writing several tensors)
    heights = [max((nodes[k].h for k in layer if nodes[k].kind != "dummy"), default=0.2) for layer in layers]
    label_lines = [max(((nodes[k].label or "").count("\n") for k in layer), default=0) for layer in layers]
    centers, y = [], 0.0
    for h, extra in zip(heights, label_lines):
        centers.append(y - h / 2)
        y -= h + LAYER_GAP + extra * LINE_H
    top_of = {li: c + h / 2 for li, (c, h) in enumerate(zip(centers, heights))}
    bottom_of = {li: c - h / 2 for li, (c, h) in enumerate(zip(centers, heights))}

    # header: title, summary, legend (one row each)
    known = list(KIND_COLORS)
    kinds = sorted({g.kind for g in plan.groups}, key=lambda k: (known.index(k) if k in known else len(known), k))
    legend = [(k, KIND_COLORS.get(k, KIND_COLORS["opaque"])) for k in kinds]
    legend += [("graph input", INPUT_COLORS), ("graph output", OUTPUT_COLORS)]
    title = title or f"{plan.graph.source or 'model'}"
    n_rewrites = len(plan.rewrites)
    summary = (f"{len(plan.groups)} fused groups, {len(plan.crossing_values())} tensors written to memory"
               + (f", {n_rewrites} horizontal rewrite{'s' if n_rewrites > 1 else ''}" if n_rewrites else "")
               + "; arrows are tensors, labelled with their shapes")
    legend_w = [0.3 + len(text) * CHAR_W * 0.85 + 0.2 for text, _ in legend]
    header_w = max(len(title) * CHAR_W * (FONT + 2) / FONT, len(summary) * CHAR_W, sum(legend_w))

    xs = [n.x - n.span / 2 for n in nodes.values()] + [n.x + n.span / 2 for n in nodes.values()]
    margin, header = 0.3, 1.0
    x_min, x_max = min(xs) - margin, max(xs) + margin
    if x_max - x_min < header_w + 2 * margin:
        pad = (header_w + 2 * margin - (x_max - x_min)) / 2
        x_min, x_max = x_min - pad, x_max + pad
    y_max, y_min = header, bottom_of[len(layers) - 1] - margin
    width, height = x_max - x_min, y_max - y_min
    dpi = min(110.0, MAX_PIXELS / max(width, height))

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(x_min, x_max)
    ax.set_ylim(y_min, y_max)
    ax.axis("off")

    # edges first, under the boxes. Every hop (between layers) is drawn once, so a lane that
    # several edges share is one line; the hop into a box ends in an arrow, the incoming
    # arrows spread across the box's top side.
    hops = _chains(edges)
    incoming: dict[str, list[str]] = {}
    for a, b in hops:
        if nodes[b].kind != "dummy":
            incoming.setdefault(b, []).append(a)
    end_x: dict[tuple[str, str], float] = {}
    for b, sources in incoming.items():
        node = nodes[b]
        sources.sort(key=lambda a: nodes[a].x)
        step = min(0.14, node.w * 0.7 / len(sources))
        for i, a in enumerate(sources):
            end_x[(a, b)] = node.x + (i - (len(sources) - 1) / 2) * step
    style = dict(linewidth=0.9, color="#555555", zorder=1)
    for a, b in hops:
        na, nb = nodes[a], nodes[b]
        start = (na.x, bottom_of[na.layer] if na.kind == "dummy" else centers[na.layer] - na.h / 2)
        if nb.kind == "dummy":
            verts = [start, *_curve(start, (nb.x, top_of[nb.layer])), (nb.x, bottom_of[nb.layer])]
            codes = [MPath.MOVETO] + [MPath.CURVE4] * 3 + [MPath.LINETO]
            ax.add_patch(PathPatch(MPath(verts, codes), fill=False, capstyle="butt", **style))
        else:
            verts = [start, *_curve(start, (end_x[(a, b)], centers[nb.layer] + nb.h / 2))]
            codes = [MPath.MOVETO] + [MPath.CURVE4] * 3
            ax.add_patch(FancyArrowPatch(path=MPath(verts, codes), arrowstyle="-|>", mutation_scale=8,
                                         shrinkA=0, shrinkB=0, **style))

    for node in nodes.values():
        if node.kind == "dummy":
            continue
        if node.label:  # where the tensors leave the group, before any fan-out
            ax.text(node.x, centers[node.layer] - node.h / 2 - 0.04, node.label, fontsize=FONT - 0.5,
                    ha="center", va="top", color="#222222", zorder=3, linespacing=1.15,
                    bbox=dict(boxstyle="round,pad=0.1", facecolor="white", edgecolor="none", alpha=0.9))
        cy = centers[node.layer]
        fill, edge = node.color
        small = node.kind in ("input", "output")
        pad = 0.04 if small else 0.05
        rounding = min(0.12, node.h / 2) if small else 0.06
        ax.add_patch(FancyBboxPatch((node.x - node.w / 2 + pad, cy - node.h / 2 + pad),
                                    node.w - 2 * pad, node.h - 2 * pad,
                                    boxstyle=f"round,pad={pad},rounding_size={rounding}",
                                    facecolor=fill, edgecolor=edge, linewidth=1.0 if small else 1.2, zorder=2))
        if small:
            n = len(node.lines)
            for i, line in enumerate(node.lines):
                ax.text(node.x, cy + ((n - 1) / 2 - i) * LINE_H * SMALL / FONT, line, fontsize=SMALL,
                        ha="center", va="center", zorder=4, style="italic" if i == 0 else "normal")
            continue
        n = len(node.lines)
        for i, line in enumerate(node.lines):
            ly = cy + ((n - 1) / 2 - i) * LINE_H
            ax.text(node.x, ly, line, fontsize=FONT, ha="center", va="center", zorder=4,
                    fontweight="bold" if i == 0 else "normal", color="#111111" if i < 2 else "#333333")

    ax.text(x_min + margin, y_max - 0.2, title, fontsize=FONT + 2, fontweight="bold", ha="left", va="center")
    ax.text(x_min + margin, y_max - 0.45, summary, fontsize=FONT, ha="left", va="center", color="#333333")
    lx = x_min + margin
    for (text, (fill, edge)), w in zip(legend, legend_w):
        ax.add_patch(FancyBboxPatch((lx, y_max - 0.76), 0.2, 0.12, boxstyle="round,pad=0,rounding_size=0.03",
                                    facecolor=fill, edgecolor=edge, linewidth=1.0))
        ax.text(lx + 0.28, y_max - 0.70, text, fontsize=FONT, ha="left", va="center", color="#333333")
        lx += w

    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG text stays text (searchable)
        fig.savefig(path, format=fmt, dpi=dpi)
    return path


__all__ = ["FORMATS", "draw_plan", "group_label", "layout"]
