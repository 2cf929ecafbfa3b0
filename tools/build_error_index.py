"""Build the index of PyTorch's own error-message templates that `course_utils.error_index` matches.

Every message PyTorch raises is written once in its sources, with holes for the values of the moment
(a shape, a device, a file name). This script collects those templates with the file each lives in:

* Python: every `raise X(<message>)`, `warnings.warn(<message>)`, `torch._check*(cond, lambda: <message>)`
  and Dynamo `unimplemented(...)` in the installed `torch` package, read with `ast` (a message kept in a
  module-level name is followed there). f-string fields, `%`
  placeholders, `.format` fields and any non-literal part become holes.
* C++: every `TORCH_CHECK*`/`AT_ERROR`/`C10_THROW_ERROR`/`throw std::...error(...)` message, every message
  built before it is raised (a `std::stringstream` streamed into, a `c10::str`/`fmt::format` kept in a
  variable named as a message), in the C++ headers the wheel ships (`torch/include`); with `--cpp-tree DIR`, in every C++
  file of a PyTorch source tree (ATen, c10, torch/csrc, caffe2/serialize; Debian's source package of a
  release holds one); with `--cpp-source DIR`, in PyTorch source files copied from pytorch/pytorch (their
  commits listed in DIR/MANIFEST.tsv). A C++ template is kept only
  when each of its literal pieces is a string in the installed wheel's shared libraries, so the index
  holds what this torch build can raise, not what another commit once said; and not when it starts with
  words of the Python interpreter's own strings (TorchScript mirrors Python's builtins' messages).
* The rest of the C++ messages, whose sources are not at hand: each string of the shared libraries that
  reads like an error message, with the source file inferred from where it lies in the library (see
  `layout_templates`).

Writes `course_utils/data/error_templates-<torch version>.json.gz`. Run it once per pinned torch:

    .venv/bin/python tools/build_error_index.py --cpp-tree /path/to/pytorch-v2.6.0 --tree-origin "..."
    .venv-torch2.14.1/bin/python tools/build_error_index.py --cpp-tree /path/to/pytorch-v2.6.0 --tree-origin "..."

(the stored indexes: the tree of http://deb.debian.org/debian/pool/main/p/pytorch/pytorch_2.6.0+dfsg.orig.tar.xz,
whose sha256 each index records; each build takes 2–3 minutes and under 2 GB of memory here)

or, after a change to how Python messages are read, `--refresh-python` (keeps the stored C++ side).

Older releases' wordings (1.x messages still fill the forums), each stored as the templates no newer index holds
and tried only when no pinned release's template matches; build them newest first:

    .venv/bin/python tools/build_error_index.py --release 1.13.1 /path/to/pytorch-1.13.1 --tree-origin "..."
    .venv/bin/python tools/build_error_index.py --release 1.11.0 /path/to/unpacked-wheel --tree-origin "..."

(stored: 1.13.1 from Debian's pytorch_1.13.1+dfsg.orig.tar.xz; 1.11.0, 1.8.1 and 1.4.0 from the Python files and
C++ headers of PyPI's macOS x86_64 wheels, CPU-only and small; each index records its file's sha256)

`tests/test_error_index.py` regenerates the Python side from the installed wheel and checks that it
equals the stored index, and that every stored C++ piece is still in the wheel's libraries.
"""
from __future__ import annotations

import argparse
import ast
import gzip
import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "course_utils" / "data"
HOLE = "\x00"          # marks where a value is filled in; a template is literal text with holes
MIN_LITERAL = 12       # shorter templates ("Invalid {}") say too little to place a message

# C++ macros whose arguments after `skip` leading ones are the message, streamed piece by piece.
CPP_MACROS = {"TORCH_CHECK": 1, "TORCH_CHECK_VALUE": 1, "TORCH_CHECK_INDEX": 1, "TORCH_CHECK_TYPE": 1,
              "TORCH_CHECK_LINALG": 1, "TORCH_CHECK_NOT_IMPLEMENTED": 1, "TORCH_CHECK_WITH": 2,
              "TORCH_CHECK_ALWAYS_SHOW_CPP_STACKTRACE": 1, "AT_ERROR": 0, "TORCH_CHECK_ERROR": 0,
              "C10_THROW_ERROR": 1, "C10D_THROW_ERROR": 1, "C10D_CHECK_WITH": 2,
              "TORCH_INTERNAL_ASSERT": 1, "C10_CUDA_CHECK_WARN": 1}
_CPP_CALL = re.compile(r"\b(" + "|".join(CPP_MACROS) + r"|throw\s+(?:std|c10)::\w+|fmt::format|c10::str)\s*\(")


def squeeze(text: str) -> str:
    """Whitespace runs as one space, as `course_utils.explain.normalise` sees a pasted message."""
    return re.sub(r"\s+", " ", text)


def _join(pieces: list[str]) -> str:
    text = squeeze("".join(pieces))
    return re.sub(HOLE + r"(\s*" + HOLE + r")+", HOLE, text).strip()


def literal_length(template: str) -> int:
    return len(template.replace(HOLE, "").strip())


# ---------------------------------------------------------------- Python: the installed package
def _py_pieces(node: ast.AST, assigned: dict[str, ast.AST], depth: int = 0) -> list[str]:
    """The message an expression builds, as literal pieces and holes."""
    if depth > 6:
        return [HOLE]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value if isinstance(v, ast.Constant) else HOLE for v in node.values]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _py_pieces(node.left, assigned, depth + 1) + _py_pieces(node.right, assigned, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
            and isinstance(node.left.value, str):
        return [re.sub(r"%(\([^)]*\))?[-#0 +]*\d*(\.\d+)?[sdrfgixeEc]", HOLE, node.left.value)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        target = node.func.value
        if node.func.attr == "format":     # "...{}...".format(x), or a name holding the format string
            text = "".join(p if p == HOLE else re.sub(r"\{[^{}]*\}", HOLE, p)
                           for p in _py_pieces(target, assigned, depth + 1))
            return [text]
        if node.func.attr in {"strip", "rstrip", "lstrip"}:
            return _py_pieces(target, assigned, depth + 1)
        if node.func.attr == "join" and isinstance(target, ast.Constant):
            return [HOLE]
    if isinstance(node, ast.Call) and node.args and getattr(node.func, "attr", getattr(node.func, "id", "")) \
            in {"dedent", "cleandoc"}:
        return _py_pieces(node.args[0], assigned, depth + 1)
    if isinstance(node, ast.Name) and node.id in assigned:
        return _py_pieces(assigned[node.id], assigned, depth + 1)
    if isinstance(node, ast.Lambda):
        return _py_pieces(node.body, assigned, depth + 1)
    return [HOLE]


def _error_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


class _PythonRaises(ast.NodeVisitor):
    """Collects (template, function, error name) for each message-raising statement of one module."""

    CHECKS = {"_check", "_check_with", "_check_value", "_check_index", "_check_type", "_check_is_size",
              "_check_not_implemented"}
    WARNINGS = {"warn", "warn_explicit", "warn_once"}     # warnings.warn(message, ...): a learner pastes these too
    GRAPH_BREAKS = {"unimplemented", "unimplemented_v2", "unsupported"}

    def __init__(self) -> None:
        self.found: list[tuple[str, str, str]] = []
        self.scope: list[str] = []
        self.assigned: list[dict[str, ast.AST]] = [{}]

    def _function(self, node) -> None:
        self.scope.append(node.name)
        self.assigned.append({})
        self.generic_visit(node)
        self.assigned.pop()
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.assigned[-1][target.id] = node.value
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name) and isinstance(node.op, ast.Add):
            before = self.assigned[-1].get(node.target.id, ast.Constant(HOLE))
            self.assigned[-1][node.target.id] = ast.BinOp(before, ast.Add(), node.value)
        self.generic_visit(node)

    def _add(self, message: ast.AST | None, error: str) -> None:
        if message is not None:     # a name is looked up in the function, then in the module ("err_msg_format")
            names = {**self.assigned[0], **self.assigned[-1]}
            self.found.append((_join(_py_pieces(message, names)), ".".join(self.scope), error))

    def visit_Raise(self, node: ast.Raise) -> None:
        call = node.exc
        if isinstance(call, ast.Call):
            message = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg in
                                                           {"msg", "message"}), None)
            self._add(message, _error_name(call))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _error_name(node)
        if name in self.CHECKS:
            message = node.args[-1] if len(node.args) >= (3 if name == "_check_with" else 2) else None
            self._add(message, name)
        elif name in self.WARNINGS and node.args:
            self._add(node.args[0], "warning")
        elif name in self.GRAPH_BREAKS:
            keywords = {k.arg: k.value for k in node.keywords}
            for key in ("gb_type", "explanation", "msg"):
                if key in keywords:
                    self._add(keywords[key], "Unsupported")
            if node.args:
                self._add(node.args[0], "Unsupported")
        self.generic_visit(node)


def python_templates(package: Path) -> list[dict]:
    """Templates raised by the Python files of an installed `torch` package (paths relative to site-packages)."""
    out = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).as_posix()
        if "/testing/" in relative or "/test/" in relative or relative.startswith("torch/include/"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        visitor = _PythonRaises()
        visitor.visit(tree)
        for template, function, error in visitor.found:
            if literal_length(template) >= MIN_LITERAL:
                out.append({"t": template, "file": relative, "function": function, "error": error})
    return out


# ---------------------------------------------------------------- C++: headers and copied sources
def _cpp_arguments(text: str, start: int, code: str | None = None) -> tuple[list[str], int]:
    """Top-level comma-separated arguments of the call whose '(' is at text[start]; and the end index. `code` is
    the text with its literals blanked (`_blanked`, computed when not given), which says where brackets and commas
    are code rather than a string's characters."""
    code = _blanked(text) if code is None else code
    depth, begin, args = 0, start + 1, []
    for i in range(start, len(code)):
        ch = code[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                args.append(text[begin:i].strip())
                return args, i + 1
        elif ch == "," and depth == 1:
            args.append(text[begin:i].strip())
            begin = i + 1
    return args, len(text)


_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "'": "'", "\\": "\\"}


def _cpp_literal_value(literal: str) -> str:
    if literal.startswith('R"'):
        return literal[literal.index("(") + 1:literal.rindex(")")]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), ""), literal[1:-1])


def _cpp_pieces(argument: str) -> list[str]:
    """An argument made only of adjacent string literals gives its text; `fmt::format("..{}..", ...)` and
    `c10::str(...)` give their pieces; anything else is a hole."""
    strings = [literal.group() for literal in _LITERAL.finditer(argument) if literal.group()[0] != "'"]
    if strings and not _LITERAL.sub("", argument).strip():
        return ["".join(_cpp_literal_value(string) for string in strings)]
    call = re.match(r"\s*(fmt::format|c10::str)\s*\(", argument)
    if call:
        inner, _ = _cpp_arguments(argument, call.end() - 1)
        if call.group(1) == "fmt::format" and inner:
            return [re.sub(r"\{[^{}]*\}", HOLE, "".join(_cpp_pieces(inner[0])))]
        return [piece for arg in inner for piece in _cpp_pieces(arg)]
    return [HOLE]


_FORMAT_FIELD = re.compile(r"\{(:[^{}]*)?\}|%(ll|l|z)?[sdiuf]\b")


# the error machinery's own framing, which every C++ error carries (c10's, and Vulkan's copy of it): it says nothing
# about where an error came from
_FRAMING = "Exception raised from"


def _cpp_entry(pieces: list[str], relative: str, error: str) -> dict | None:
    """A template of the message pieces (literals, and holes for the rest), if it says enough to place one."""
    # a literal formatted later (`throw TypeError("{}(): argument '{}' ...", name, ...)`, printf's "%s"):
    # its placeholders are holes too
    template = _join([_FORMAT_FIELD.sub(HOLE, piece) for piece in pieces])
    if literal_length(template) < MIN_LITERAL or template.startswith(_FRAMING):
        return None
    # each literal argument apart: the library holds "…equal to 0 " and "but received {" as two strings
    literals = [squeeze(piece).strip() for piece in pieces if piece != HOLE]
    return {"t": template, "file": relative, "function": "", "error": error,
            "pieces": [piece for piece in literals if len(piece) >= 6]}


# a message built before it is raised: `std::stringstream ss; ss << "invalid gradient at index " << i << ...;`
# then `TORCH_CHECK(false, ss.str())`, or `std::string msg = c10::str("the derivative for '", name, "' ...")` (a
# variable named as a message: a `c10::str` kept as `repr` or `key` is not one)
_STREAM = re.compile(r"\b(?:std::)?o?stringstream\s+(\w+)\s*(?:\{\s*\}|\(\s*\))?\s*;")
_BUILT = re.compile(r"\b\w*(?:msg|message|err|error|reason|what)\w*\s*\+?=\s*(c10::str|fmt::format)\s*\(",
                    flags=re.IGNORECASE)
# a raw string's delimiter is up to 16 characters other than parentheses, a backslash and white space
_LITERAL = re.compile(r'R"([^()\\\s"]{0,16})\(.*?\)\1"|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)\'', flags=re.DOTALL)


def _blanked(text: str) -> str:
    """The text with every string and character literal's inside blanked (same length): its braces and
    semicolons are not code."""
    return _LITERAL.sub(lambda m: m.group()[0] + " " * (len(m.group()) - 2) + m.group()[-1], text)


def _streamed(text: str, code: str, start: int) -> list[str]:
    """The operands of one `name << a << b ...;` statement that starts at text[start] (after `name`); `code` is
    the text with its literals blanked, which says where the statement ends and where it splits."""
    depth, begin, operands = 0, start, []
    for i in range(start, len(code)):
        ch = code[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                break
        elif ch == ";" and depth == 0:
            break
        elif code.startswith("<<", i) and depth == 0 and i >= begin:
            operands.append(text[begin:i])
            begin = i + 2
    else:
        i = len(code)
    operands.append(text[begin:i])
    return [operand for operand in operands if operand.strip()]


def _stream_templates(text: str, relative: str) -> list[dict]:
    """Each string stream's message: the operands streamed into it, statement after statement, until its
    `.str()` is taken or it is returned. What is streamed only inside a branch (an `if`'s braces) is a hole:
    two branches' words one after the other would be a message neither branch writes."""
    code, out = _blanked(text), []
    for declared in _STREAM.finditer(code):
        name = declared.group(1)
        made_a_string = rf"(?<![\w.]){name}\s*\.\s*str\s*\(\s*\)|\breturn\s+{name}\s*;"
        used = re.compile(made_a_string).search(code, declared.end())
        again = re.compile(rf"stringstream\s+{name}\b").search(code, declared.end())
        if used is None or (again is not None and again.start() < used.start()):
            continue                                      # never made a string: not a message
        pieces = []
        for statement in re.finditer(rf"(?<![\w.]){name}\s*<<", code[:used.start()]):
            if statement.start() < declared.end():
                continue
            branch = code[declared.end():statement.start()]
            inside = branch.count("{") > branch.count("}")
            try:
                operands = [_cpp_pieces(operand) for operand in _streamed(text, code, statement.end())]
            except (ValueError, IndexError):              # a call whose arguments do not parse: a hole
                operands = [[HOLE]]
            pieces += [HOLE if inside else piece for operand in operands for piece in operand]
        entry = _cpp_entry(pieces, relative, "stringstream")
        if entry:
            out.append(entry)
    return out


def cpp_templates(path: Path, relative: str) -> list[dict]:
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", path.read_text(encoding="utf-8", errors="replace"), flags=re.DOTALL)
    out = _stream_templates(text, relative) if "stringstream" in text else []
    for built in _BUILT.finditer(text):
        try:
            entry = _cpp_entry(_cpp_pieces(text[built.start(1):]), relative, built.group(1).split("::")[-1])
        except (ValueError, IndexError):
            continue
        if entry:
            out.append(entry)
    code = _blanked(text)
    for match in _CPP_CALL.finditer(text):
        name = match.group(1)
        if name in {"fmt::format", "c10::str"}:
            continue                                  # reached as an argument of a check or a throw
        try:
            args, _ = _cpp_arguments(text, match.end() - 1, code)
        except (ValueError, IndexError):
            continue
        skip = CPP_MACROS.get(name, 0)
        message = args[skip:]
        if name == "TORCH_INTERNAL_ASSERT" or not message:
            continue
        entry = _cpp_entry([piece for arg in message for piece in _cpp_pieces(arg)], relative, name.split("::")[-1])
        if entry:
            out.append(entry)
    return out


def _libraries(package: Path) -> list[Path]:
    return sorted((package / "lib").glob("*.so*")) + sorted(package.glob("_C*.so"))


def library_strings(library: Path, minimum: int = 6) -> list[tuple[int, str]]:
    """(byte offset, text) of each printable string of one shared library, in file order: binutils'
    `strings -a -t d` where it exists (seconds for a GiB), else the same scan in Python (about a minute)."""
    if shutil.which("strings"):
        out = subprocess.run(["strings", "-a", "-t", "d", "-n", str(minimum), str(library)], capture_output=True,
                             check=True).stdout.decode("ascii", errors="replace")
        return [(int(offset), text) for offset, _, text in
                (line.strip(" ").partition(" ") for line in out.splitlines()) if offset.isdigit()]
    return [(m.start(), m.group().decode("ascii"))
            for m in re.finditer(rb"[\x20-\x7e\t]{%d,}" % minimum, library.read_bytes())]


# A string of a shared library belongs to the translation unit whose __FILE__ path precedes it: the linker
# lays out each object file's strings together, and a TORCH_CHECK stores its file's path among them. On the
# four C++ source files this index also reads, the nearest preceding path within 20 KB names the right file
# for 103 of 107 message pieces (none was placed beyond 20 KB; past the last PyTorch file lie oneDNN's and
# protobuf's strings, which the limit keeps out). Any source path counts as a mark, third_party/ ones too
# (miniz, fmt, ...), so a vendored library's strings land in its own file, which no chapter teaches.
_FILE_MARK = re.compile(r'(?:^|")(?:[\w/.+-]*/pytorch/)?((?:[\w.+-]+/)+[\w.+-]+\.(?:c|cpp|cu|cc|h|hpp|cuh))(?:"|$|:)')
_ERROR_WORDS = re.compile(r"\b(expected|expects|must|should|cannot|can't|could not|not|invalid|unsupported|failed|"
                          r"error|only|mismatch|out of|exceeds?|requires?|supported|unable|missing|wrong|illegal|"
                          r"too (large|small|many|few)|unknown|timed out|timeout)\b", re.IGNORECASE)
LAYOUT_REACH = 20_000


def _message_like(text: str) -> bool:
    """A library string that reads like (part of) an error message, not a path, an operator schema, or the
    generated `Expected x to be true, but got false` of a TORCH_CHECK without a message."""
    return (len(text) >= MIN_LITERAL and " " in text and len(re.findall(r"[A-Za-z]{2,}", text)) >= 3
            and bool(_ERROR_WORDS.search(text)) and not _FILE_MARK.search(text)
            and not text.startswith(("aten::", "prim::")) and "(Tensor" not in text
            and "to be true, but got false" not in text)


def layout_templates(package: Path) -> list[dict]:
    """Message pieces of the libraries that no source file gave, each with the file the layout places it in."""
    out = []
    for library in _libraries(package):
        mark_offset, mark_file = None, None
        for offset, text in library_strings(library):
            mark = _FILE_MARK.search(text)
            if mark:
                mark_offset, mark_file = offset, mark.group(1).removeprefix("aten/src/")   # third_party/...: untaught
                continue
            text = squeeze(text).strip()
            if mark_offset is not None and offset - mark_offset <= LAYOUT_REACH and _message_like(text):
                out.append({"t": _join([_FORMAT_FIELD.sub(HOLE, text)]), "file": mark_file, "function": "",
                            "error": "library string"})
    return out


def library_index(package: Path) -> tuple[set[str], str]:
    """The libraries' strings, whitespace squeezed as in the templates: as a set (most literal pieces are
    one whole string) and joined into one text (for the pieces that are part of a longer string)."""
    strings = {squeeze(text).strip() for library in _libraries(package) for _, text in library_strings(library)}
    return strings, " ".join(strings)


def in_library(entry: dict, index: tuple[set[str], str]) -> bool:
    """Every literal piece of 6+ characters of a C++ template (each literal argument of its check, as the
    compiler stores it) occurs in the libraries' strings."""
    strings, text = index
    pieces = entry.get("pieces") or [p.strip() for p in entry["t"].split(HOLE) if len(p.strip()) >= 6]
    return bool(pieces) and all(piece in strings or piece in text for piece in pieces)


# TorchScript's interpreter mirrors Python's builtins word for word ("could not convert string to float: '...'",
# "invalid literal for int() with base 10"): such a template is Python's message, which any program raises
_LEADING_WORDS = re.compile(r"[^'\"`%{\x00\d]*")


def python_strings() -> str:
    """The Python interpreter's own strings (its error messages among them), joined into one text."""
    library = Path(sysconfig.get_config_var("LIBDIR") or "") / (sysconfig.get_config_var("LDLIBRARY") or "")
    binary = library if library.is_file() else Path(sys.executable).resolve()
    return " ".join(squeeze(text) for _, text in library_strings(binary))


def pythons_own(entry: dict, python_text: str) -> bool:
    """The template starts with 20+ characters of words that the Python interpreter's own strings hold."""
    leading = _LEADING_WORDS.match(entry["t"]).group().strip(" :")
    return len(leading) >= 20 and leading in python_text


# The parts of a PyTorch source tree whose C++ messages a user meets (tests and vendored libraries left out).
TREE_PARTS = ("aten/src/ATen", "c10", "torch/csrc", "caffe2/serialize")
TREE_SUFFIXES = {".cpp", ".cc", ".cu", ".cuh", ".h", ".hpp", ".mm"}


def tree_files(tree: Path) -> list[Path]:
    """The C++ (and Objective-C++: MPS) files of a PyTorch source tree that raise users' errors."""
    return sorted(path for part in TREE_PARTS for path in (tree / part).rglob("*")
                  if path.suffix in TREE_SUFFIXES and "test" not in path.relative_to(tree).parts)


def header_and_source_templates(package: Path, cpp_source: Path | None,
                                cpp_tree: Path | None = None) -> tuple[list[dict], dict]:
    out = []
    for header in sorted((package / "include").rglob("*.h")):
        out += cpp_templates(header, header.relative_to(package / "include").as_posix())
    manifest = {}
    if cpp_tree is not None:
        # a whole release's sources (pytorch/pytorch is too large to fetch here; Debian's source package of
        # PyTorch holds the same tree): older than the pinned wheels, so `build` keeps only the templates
        # whose every piece this wheel's libraries still hold
        for path in tree_files(cpp_tree):
            out += cpp_templates(path, path.relative_to(cpp_tree).as_posix().removeprefix("aten/src/"))
    if cpp_source is not None:
        for line in (cpp_source / "MANIFEST.tsv").read_text().splitlines():
            if not line.strip():
                continue
            relative, commit, _ = line.split("\t")
            manifest[relative] = commit
            out += cpp_templates(cpp_source / relative, relative.removeprefix("aten/src/"))
    return out, manifest


def build(cpp_source: Path | None, cpp_tree: Path | None = None, tree_origin: str = "") -> dict:
    import torch
    package = Path(torch.__file__).parent
    python = python_templates(package)
    cpp, manifest = header_and_source_templates(package, cpp_source, cpp_tree)
    index = library_index(package)
    python_text = python_strings()
    cpp_kept = [entry for entry in cpp if in_library(entry, index) and not pythons_own(entry, python_text)]
    known = " ".join(e["t"] for e in cpp_kept)
    layout = {e["t"]: e for e in layout_templates(package) if e["t"] not in known}     # first place wins
    templates = sorted({json.dumps(e, sort_keys=True) for e in python + cpp_kept + list(layout.values())})
    return {"torch": torch.__version__.split("+")[0],
            "python_source": f"torch {torch.__version__} wheel, {package.name}/**/*.py",
            "cpp_source": {"headers": f"torch {torch.__version__} wheel, torch/include",
                           "pytorch/pytorch files (path: commit)": manifest,
                           "source tree": (f"{tree_origin or cpp_tree.name}: {', '.join(TREE_PARTS)}"
                                           if cpp_tree is not None else None),
                           "kept": f"{len(cpp_kept)} of {len(cpp)} C++ templates found in this wheel's libraries "
                                   f"(Python's own messages left out)",
                           "library strings": f"{len(layout)} message pieces of the libraries, file inferred from "
                                              f"their layout (error: 'library string')"},
            "templates": [json.loads(e) for e in templates]}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def release_index(sources: Path, release: str, origin: str) -> dict:
    """The templates of an older release that no newer stored index holds: the wordings of the threads written
    before the pinned releases (1.x messages still fill the forums). `sources`: the release's source tree (its
    Python files and C++ tree) or its unpacked wheel (Python files and C++ headers). Its own files, so no C++
    template needs a library's strings to be kept."""
    newer = set()
    for path in DATA.glob("error_templates-*.json.gz"):
        if _version(path.name) > _version(release):
            with gzip.open(path, "rt", encoding="utf-8") as file:
                newer |= {entry["t"] for entry in json.load(file)["templates"]}
    if (sources / "aten").is_dir():
        cpp_files = [(path, path.relative_to(sources).as_posix().removeprefix("aten/src/"))
                     for path in tree_files(sources)]
        cpp_parts = ", ".join(TREE_PARTS)
    else:
        include = sources / "torch" / "include"
        cpp_files = [(path, path.relative_to(include).as_posix()) for path in sorted(include.rglob("*.h"))]
        cpp_parts = "torch/include"
    python = python_templates(sources / "torch")
    cpp = [entry for path, relative in cpp_files for entry in cpp_templates(path, relative)]
    python_text = python_strings()
    kept = [entry for entry in python + cpp if entry["t"] not in newer and not pythons_own(entry, python_text)]
    templates = sorted({json.dumps({k: v for k, v in e.items() if k != "pieces"}, sort_keys=True) for e in kept})
    return {"torch": release, "retired": True,
            "python_source": f"{origin}: torch/**/*.py",
            "cpp_source": {"files": f"{origin}: {cpp_parts}",
                           "kept": "the templates no newer stored index holds (the release's own files: no "
                                   "library filter)"},
            "templates": [json.loads(e) for e in templates]}


def index_path(version: str) -> Path:
    return DATA / f"error_templates-{version}.json.gz"


def refresh_python(stored: dict) -> dict:
    """The stored index with its Python side rebuilt from the installed wheel and its C++ side kept (the C++
    side needs the copied sources; the Python side needs only the wheel)."""
    import torch
    python = python_templates(Path(torch.__file__).parent)
    cpp = [e for e in stored["templates"] if not e["file"].endswith(".py")]
    templates = sorted({json.dumps(e, sort_keys=True) for e in python + cpp})
    return {**stored, "templates": [json.loads(e) for e in templates]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpp-source", type=Path, help="folder of pytorch/pytorch files with a MANIFEST.tsv")
    parser.add_argument("--cpp-tree", type=Path, help="a whole PyTorch source tree (e.g. Debian's orig tarball)")
    parser.add_argument("--tree-origin", default="", help="where the tree came from, recorded in the index")
    parser.add_argument("--release", nargs=2, metavar=("VERSION", "SOURCES"),
                        help="an older release's source tree or unpacked wheel: store the wordings no newer index "
                             "holds (e.g. 1.13.1 /path/to/pytorch-1.13.1; --tree-origin says where it came from)")
    parser.add_argument("--refresh-python", action="store_true",
                        help="rebuild only the Python side of the stored index of the installed torch")
    args = parser.parse_args(argv)
    if args.refresh_python:
        import torch
        with gzip.open(index_path(torch.__version__.split("+")[0]), "rt", encoding="utf-8") as file:
            index = refresh_python(json.load(file))
    elif args.release:
        index = release_index(Path(args.release[1]), args.release[0], args.tree_origin)
    else:
        index = build(args.cpp_source, args.cpp_tree, args.tree_origin)
    DATA.mkdir(exist_ok=True)
    path = index_path(index["torch"])
    with gzip.open(path, "wt", encoding="utf-8") as file:
        json.dump(index, file, indent=0, sort_keys=True)
    print(f"{path.relative_to(ROOT)}: {len(index['templates'])} templates ({index['cpp_source']['kept']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
