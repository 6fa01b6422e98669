"""The `ast` allowlist every model-written heuristic passes before it reaches the sandbox.

This is hygiene, not the boundary (the bubblewrap sandbox is): it refuses, with a one-line reason, code
that is not one plain function over `np` and `math` -- imports, dunders and private names, I/O, dynamic
code (eval, exec, getattr, ...), classes, `global`, `raise`, `try`, `with`, lambdas that could hide any of
these. A refused heuristic scores None and its proposal still counts against the budget.
"""

from __future__ import annotations

import ast

# node types a heuristic may contain (everything else is refused)
_ALLOWED_NODES: tuple[type, ...] = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign,
    ast.If, ast.For, ast.While, ast.Break, ast.Continue, ast.Pass, ast.Expr, ast.Expression,
    ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.keyword, ast.Starred,
    ast.Name, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Dict, ast.Set, ast.Constant,
    ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.comprehension,
    ast.Load, ast.Store, ast.Del,
    ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)
# builtins the sandbox runner exposes to the heuristic; any other bare name must be a local or np/math
SAFE_BUILTINS = ("abs", "all", "any", "bool", "dict", "enumerate", "float", "int", "isinstance", "len", "list",
                 "max", "min", "pow", "range", "reversed", "round", "set", "sorted", "sum", "tuple", "zip")
_MODULES = ("np", "math")
# numpy attributes that read or write files, load code or reach the C level
_DENIED_ATTRS = frozenset({
    "load", "loads", "save", "savez", "savez_compressed", "savetxt", "loadtxt", "genfromtxt", "fromfile", "tofile",
    "fromregex", "memmap", "DataSource", "ctypeslib", "ctypes", "lib", "f2py", "distutils", "testing", "core",
    "dump", "dumps", "frombuffer", "fromstring", "from_dlpack", "show_config", "info", "source", "get_include",
    "emath", "rec", "char", "format_parser", "exec_command", "system", "popen", "open", "getattr", "setattr",
})
_DENIED_NAMES = frozenset({"eval", "exec", "compile", "open", "input", "print", "getattr", "setattr", "delattr",
                           "globals", "locals", "vars", "dir", "type", "object", "super", "breakpoint", "help",
                           "exit", "quit", "memoryview", "bytearray", "bytes", "classmethod", "staticmethod",
                           "property", "id", "hash", "iter", "next", "callable", "format", "repr", "chr", "ord"})
MAX_CODE_CHARS = 4000


class UnsafeCode(ValueError):
    """A heuristic failed the allowlist (the message is one line: what and where)."""


def check_heuristic(code: str, function: str, arguments: tuple[str, ...]) -> None:
    """Raise UnsafeCode unless `code` is exactly one function `function(arguments...)` in the allowlist."""
    if not isinstance(code, str) or not code.strip():
        raise UnsafeCode("empty program")
    if len(code) > MAX_CODE_CHARS:
        raise UnsafeCode(f"program of {len(code)} characters (limit {MAX_CODE_CHARS})")
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as e:
        raise UnsafeCode(f"syntax error: {getattr(e, 'msg', e)}") from None
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    others = [n for n in tree.body if not isinstance(n, ast.FunctionDef)
              and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if len(defs) != 1 or others:
        raise UnsafeCode(f"expected exactly one top-level `def {function}` and nothing else")
    fn = defs[0]
    if fn.name != function:
        raise UnsafeCode(f"function is called {fn.name!r}, expected {function!r}")
    got = tuple(a.arg for a in fn.args.args)
    if got != arguments or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs or fn.args.posonlyargs:
        raise UnsafeCode(f"signature ({', '.join(got)}), expected ({', '.join(arguments)})")
    if fn.decorator_list or fn.returns is not None:
        raise UnsafeCode("decorators and return annotations are not allowed")
    nested = [n for n in ast.walk(fn) if isinstance(n, ast.FunctionDef) and n is not fn]
    if nested:
        raise UnsafeCode(f"nested function {nested[0].name!r} (line {nested[0].lineno})")
    for node in ast.walk(tree):
        _check_node(node)


def check_expression(expression: str) -> None:
    """Raise UnsafeCode unless `expression` is one allowlisted Python expression (L1 heuristics)."""
    if not isinstance(expression, str) or not expression.strip():
        raise UnsafeCode("empty expression")
    if len(expression) > MAX_CODE_CHARS:
        raise UnsafeCode(f"expression of {len(expression)} characters (limit {MAX_CODE_CHARS})")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as e:
        raise UnsafeCode(f"syntax error: {getattr(e, 'msg', e)}") from None
    for node in ast.walk(tree):
        _check_node(node)


def _check_node(node: ast.AST) -> None:
    where = f" (line {getattr(node, 'lineno', '?')})"
    if not isinstance(node, _ALLOWED_NODES):
        raise UnsafeCode(f"{type(node).__name__} is not allowed{where}")
    if isinstance(node, ast.Name):
        if node.id.startswith("_"):
            raise UnsafeCode(f"name {node.id!r}: names starting with '_' are not allowed{where}")
        if node.id in _DENIED_NAMES:
            raise UnsafeCode(f"{node.id!r} is not allowed{where}")
        if isinstance(node.ctx, ast.Store) and node.id in _MODULES:
            raise UnsafeCode(f"assigning to {node.id!r} is not allowed{where}")
    elif isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            raise UnsafeCode(f"attribute {node.attr!r}: attributes starting with '_' are not allowed{where}")
        if node.attr in _DENIED_ATTRS:
            raise UnsafeCode(f"attribute {node.attr!r} (I/O or low-level access) is not allowed{where}")
        if isinstance(node.ctx, ast.Store):
            raise UnsafeCode(f"assigning to an attribute ({node.attr!r}) is not allowed{where}")
    elif isinstance(node, ast.Constant) and isinstance(node.value, (bytes, str)) and len(node.value) > 200:
        raise UnsafeCode(f"string constant of {len(node.value)} characters{where}")
    elif isinstance(node, ast.arg) and node.arg.startswith("_"):
        raise UnsafeCode(f"argument {node.arg!r}: names starting with '_' are not allowed{where}")
