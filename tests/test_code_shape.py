"""Every function in ``src/`` stays short and simple enough to read in one go: at most
``MAX_LINES`` lines (from its ``def`` to its last line) and a cyclomatic complexity of at most
``MAX_COMPLEXITY`` as radon computes it (``radon cc``)."""

from __future__ import annotations

import ast
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Function

SRC = Path(__file__).resolve().parent.parent / "src"
MAX_LINES = 60
MAX_COMPLEXITY = 20


def sources() -> list[tuple[str, str]]:
    return [(path.relative_to(SRC).as_posix(), path.read_text(encoding="utf-8"))
            for path in sorted(SRC.rglob("*.py"))]


def long_functions(name: str, source: str) -> dict[str, int]:
    """``file:function`` -> lines, for every function (methods and nested ones too) over the limit."""
    found = {}
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                found[f"{name}:{node.name}"] = lines
    return found


def functions(blocks: list) -> list[Function]:
    """radon's function blocks (methods are listed with them) and the functions nested in them."""
    found = []
    for block in blocks:
        if isinstance(block, Function):
            found += [block, *functions(block.closures)]
    return found


def complex_functions(name: str, source: str) -> dict[str, int]:
    """``file:function`` -> radon's cyclomatic complexity, for every function over the limit."""
    return {f"{name}:{block.name}": block.complexity for block in functions(cc_visit(source))
            if block.complexity > MAX_COMPLEXITY}


def over(measure) -> dict[str, int]:
    found: dict[str, int] = {}
    for name, source in sources():
        found.update(measure(name, source))
    return found


def test_no_function_is_longer_than_the_limit() -> None:
    assert over(long_functions) == {}, f"functions over {MAX_LINES} lines"


def test_no_function_is_more_complex_than_the_limit() -> None:
    assert over(complex_functions) == {}, f"functions over complexity {MAX_COMPLEXITY}"


def test_the_measures_see_what_they_measure() -> None:
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(MAX_COMPLEXITY))
    method = f"class C:\n    def method(self, x):\n{body.replace('    ', '        ')}        return -1\n"
    assert complex_functions("_probe.py", method) == {"_probe.py:method": MAX_COMPLEXITY + 1}
    assert long_functions("_probe.py", method) == {}
    statements = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1))
    assert long_functions("_probe.py", f"def f():\n{statements}") == {}
    assert long_functions("_probe.py", f"def f():\n{statements}    return x0\n") == {"_probe.py:f": MAX_LINES + 1}
    nested = f"def outer():\n    def inner(x):\n{body.replace('    ', '        ')}        return -1\n    return inner\n"
    assert complex_functions("_probe.py", nested) == {"_probe.py:inner": MAX_COMPLEXITY + 1}
