"""Writes the reference part of docs/CONFIG.md: every key of edge.toml and server.toml from the pydantic models.

The page's first part, the guide (the keys that matter first, presets, track fusion, secrets), is written
by hand; everything from :data:`MARKER` on is generated.

The models are the source of truth (extra="forbid": any other key is an error);
tests/test_docs.py fails when this file is stale. Run: .venv/bin/python scripts/gen-config-docs.py
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent
#: Where the hand-written guide ends and the generated reference begins.
MARKER = "<!-- Generated below by scripts/gen-config-docs.py from the configuration models: edit those, not this. -->"


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(ann)[0])
    if origin is typing.Literal:
        return " \\| ".join(repr(a).replace("'", '"') for a in typing.get_args(ann))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(ann))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(ann))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if ann is type(None):
        return "none"
    return getattr(ann, "__name__", str(ann))


def _nested(ann: Any) -> type[BaseModel] | None:
    for a in (ann, *typing.get_args(ann)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
        for b in typing.get_args(a):
            if isinstance(b, type) and issubclass(b, BaseModel):
                return b
    return None


def _default(field: Any) -> str:
    if field.default is PydanticUndefined:
        return "required" if field.default_factory is None else "(see below)"
    d = field.default
    if isinstance(d, BaseModel):
        return "(see below)"
    if isinstance(d, str | Path):
        return f'`"{d}"`'
    return f"`{d!r}`".replace("None", "none").replace("True", "true").replace("False", "false")


def _constraints(field: Any) -> str:
    parts = []
    for m in field.metadata:
        for name, sym in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"), ("min_length", "len ≥")):
            v = getattr(m, name, None)
            if v is not None:
                parts.append(f"{sym} {v}")
    return ", ".join(parts)


def table(model: type[BaseModel], prefix: str, out: list[str], sections: list[tuple[str, type[BaseModel]]]) -> None:
    out.append("| key | type | default | allowed | meaning |")
    out.append("|---|---|---|---|---|")
    for name, field in model.model_fields.items():
        nested = _nested(field.annotation)
        key = f"{prefix}{name}"
        if nested is not None and nested is not model:
            sections.append((key, nested))
            out.append(f"| `{key}` | table | {_default(field)} | | see [`[{key}]`](#{key.replace('.', '')}) |")
            continue
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        out.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | {_constraints(field)} | {desc} |")


def document(title: str, model: type[BaseModel], intro: str) -> list[str]:
    out = [f"## {title}", "", intro, ""]
    sections: list[tuple[str, type[BaseModel]]] = []
    pending = [("", model)]
    first = True
    while pending:
        key, m = pending.pop(0)
        if not first:
            out += [f"### [{key}]", ""]
            doc = (m.__doc__ or "").strip().splitlines()
            if doc and not doc[0].startswith("Attributes"):
                out += [doc[0], ""]
        sections = []
        table(m, "" if first else f"{key}.", out, sections)
        out.append("")
        pending = sections + pending
        first = False
    return out


def main() -> int:
    from peep.edge.config import EdgeConfig
    from peep.server.config import ServerConfig
    from peep.server.config.qbbs import QbbsConfig

    lines = [
        MARKER,
        "",
        "## Configuration reference",
        "",
        "Every key, its type, default and bounds, generated from the configuration models by",
        "`scripts/gen-config-docs.py` (a test fails when it is stale). Unknown keys are errors; every error names",
        "the key path, what was expected and the value received (`peep-edge run --validate-config`,",
        "`peep serve --validate-config`). Secrets never go in these files: edge keys ending in `_env` /",
        "`_credential` name an environment variable / systemd credential; server secrets are references",
        '`"env:NAME"`, `"credential:NAME"` or `"file:/path"`.',
        "",
    ]
    lines += document("edge.toml (`peep-edge`)", EdgeConfig, "Example: `deploy/edge/edge.toml`.")
    lines += document("server.toml (`peep serve`, `peep train`, `peep erase`, `peep retention`)", ServerConfig,
                      "Example: `deploy/server/server.toml`.")  # fmt: skip
    lines += document("[qbbs] in server.toml (soft-biometric module)", QbbsConfig,
                      "Present = QBBS is hosted; `store_path` and `ledger_path` are required then.")  # fmt: skip
    generated = "\n".join(lines).rstrip() + "\n"
    target = ROOT / "docs" / "CONFIG.md"
    current = target.read_text() if target.is_file() else ""
    if MARKER not in current:
        print(f"{target}: expected the guide followed by the line {MARKER!r}; not found", file=sys.stderr)
        return 2
    text = current[: current.index(MARKER)] + generated
    if "--check" in sys.argv:
        return 0 if current == text else 1
    target.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
