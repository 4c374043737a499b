"""The ``tscomp`` command line.

Errors a user can cause are printed as one line (``tscomp: error: ...``) with a
non-zero exit code; ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import json
import sys

from tscomp.errors import TscompError


def _add_dim_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dim", action="append", default=[], metavar="SPEC",
                   help="name/bound a dynamic dimension: NAME=MIN:MAX (MIN may be 0: an empty KV "
                        "cache), NAME@PARAM=MIN:MAX or NAME@INPUT:AXIS=MIN:MAX; or derive it from "
                        "others: NAME=EXPR, e.g. total=past+sequence (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tscomp", description="Ahead-of-time compiler for dynamic-shape models")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="show symbolic shapes recovered from a model")
    p.add_argument("model")
    _add_dim_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--groups", action="store_true",
                   help="also run fusion and show the fused groups (kernels) and graph rewrites")
    p.add_argument("--picture", metavar="PATH",
                   help="with --groups: draw the fused groups and the tensors between them "
                        "to PATH (.png or .svg)")
    p.set_defaults(func=cmd_inspect)

    from tscomp.cli_commands import add_commands

    add_commands(sub, _add_dim_flag)
    return parser


def _check_picture(args) -> None:
    from pathlib import Path

    if args.picture is None:
        return
    from tscomp.graph.fusion.picture import FORMATS

    if not args.groups:
        raise TscompError("--picture draws the fused groups: add --groups")
    path = Path(args.picture)
    if path.suffix.lower() not in FORMATS:
        raise TscompError(f"--picture {args.picture}: the file name must end in "
                          f"{' or '.join(FORMATS)}")
    if not path.parent.is_dir():
        raise TscompError(f"--picture {args.picture}: no such directory {str(path.parent)!r}")


def cmd_inspect(args) -> int:
    from tscomp.graph import DimSpec, import_model, propagate_shapes, read_model, simplify
    from tscomp.inspect_report import groups_json, groups_text, inspect_json, inspect_text

    _check_picture(args)  # before the work, so a typo fails fast
    dims = [DimSpec.parse(d) for d in args.dim]
    graph = import_model(read_model(args.model), dims, source=args.model)
    imported = list(graph.nodes)
    propagate_shapes(graph)
    simplify(graph)
    # the report describes the simplified graph; fusion rewrites a copy of it (plan.graph)
    report = inspect_json(graph, imported) if args.json else inspect_text(graph, imported)
    if args.groups:
        from tscomp.graph.fusion import fuse

        simplified = list(graph.nodes)
        plan = fuse(graph)
        if args.json:
            report.update(groups_json(plan, simplified))
        else:
            report += "\n" + groups_text(plan, simplified)
        if args.picture is not None:
            from tscomp.graph.fusion.picture import draw_plan

            try:
                draw_plan(plan, args.picture)
            except OSError as e:
                raise TscompError(f"--picture {args.picture}: cannot write it: {e.strerror or e}") from e
            if args.json:
                report["picture"] = args.picture
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(report)
    if args.picture is not None:  # on stderr under --json, so stdout stays one JSON object
        print(f"picture: {args.picture}", file=sys.stderr if args.json else sys.stdout)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TscompError as e:
        if args.debug:
            raise
        print(f"tscomp: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("tscomp: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug in tscomp, not in the user's input
        if args.debug:
            raise
        print(f"tscomp: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
