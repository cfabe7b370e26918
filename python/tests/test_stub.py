"""`_native.pyi` describes the native module exactly: the same names, the
same parameters in the same kinds with the same defaults, properties where
the module has properties, and values of the types it declares."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from turnsafe_store import _native

from conftest import ROOT

STUB = ROOT / "python" / "python" / "turnsafe_store" / "_native.pyi"

# What every class of the module has without declaring it.
INHERENT = {"__new__", "__doc__", "__module__", "__repr__", "__init__"}

# A parameter without a default, and the stub's `= ...` (some default).
REQUIRED, ANY = "<required>", "<any default>"


def stub() -> ast.Module:
    return ast.parse(STUB.read_text(encoding="utf-8"))


def classes() -> dict[str, ast.ClassDef]:
    return {c.name: c for c in stub().body if isinstance(c, ast.ClassDef)}


def defs(body: list[ast.stmt]) -> dict[str, ast.FunctionDef]:
    return {f.name: f for f in body if isinstance(f, ast.FunctionDef)}


def is_property(f: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)


def stub_params(f: ast.FunctionDef, method: bool) -> list[tuple]:
    """(name, kind, default) for each parameter."""
    a = f.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [(p.arg, "POSITIONAL_OR_KEYWORD", d) for p, d in zip(positional, defaults)]
    if a.vararg:
        out.append(("*", "VAR_POSITIONAL", None))
    out += [(p.arg, "KEYWORD_ONLY", d) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append(("**", "VAR_KEYWORD", None))
    if method:
        out = out[1:]
    def default(d):
        if d is None:
            return REQUIRED
        value = ast.literal_eval(d)
        return ANY if value is ... else value

    return [(n, k, default(d)) for n, k, d in out]


def runtime_params(obj, method: bool) -> list[tuple]:
    ps = list(inspect.signature(obj).parameters.values())
    if method:
        ps = ps[1:]
    out = []
    for p in ps:
        name = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(p.kind.name, p.name)
        kind = "POSITIONAL_OR_KEYWORD" if p.kind.name == "POSITIONAL_ONLY" else p.kind.name
        out.append((name, kind, REQUIRED if p.default is p.empty else p.default))
    return out


def same_params(stubbed: list[tuple], runtime: list[tuple]) -> bool:
    """Names and kinds equal, a default where the module has one, and the
    same default where the stub spells it out."""
    if [(n, k) for n, k, _ in stubbed] != [(n, k) for n, k, _ in runtime]:
        return False
    for (_, _, s), (_, _, r) in zip(stubbed, runtime):
        if (s is REQUIRED) != (r is REQUIRED):
            return False
        if s is not REQUIRED and s is not ANY and s != r:
            return False
    return True


def test_the_module_has_exactly_the_names_the_stub_gives():
    tree = stub()
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    stubbed |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    public = {n for n in vars(_native) if not n.startswith("_")}
    assert public == stubbed
    assert type(_native.SCHEMA_VERSION) is int


def test_every_function_takes_the_parameters_the_stub_gives():
    for name, f in defs(stub().body).items():
        assert same_params(stub_params(f, False), runtime_params(getattr(_native, name), False)), name


@pytest.mark.parametrize("name", sorted(classes()))
def test_every_class_has_the_members_and_parameters_the_stub_gives(name: str):
    cls = getattr(_native, name)
    members = defs(classes()[name].body)
    declared = {n for n in vars(cls) if n not in INHERENT}
    assert declared == set(members) - {"__init__"}, name
    for n, f in members.items():
        if n == "__init__":
            # The constructor's parameters are the class's own signature.
            assert same_params(stub_params(f, True), runtime_params(cls, False)), name
            continue
        member = vars(cls)[n]
        if is_property(f):
            assert inspect.isdatadescriptor(member), f"{name}.{n} is a property in the stub"
        else:
            assert not inspect.isdatadescriptor(member), f"{name}.{n} is a method in the stub"
            assert same_params(stub_params(f, True), runtime_params(member, True)), f"{name}.{n}"


def conforms(value, ann: ast.expr) -> bool:
    """`value` is of the stub's annotation, exactly (an int is no bool)."""
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        ann = ast.parse(ann.value, mode="eval").body
    if isinstance(ann, ast.Name):
        if ann.id == "Any":
            return True
        return type(value) is {"bool": bool, "int": int, "str": str}[ann.id]
    if isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name):
        outer, inner = ann.value.id, ann.slice
        if outer == "Optional":
            return value is None or conforms(value, inner)
        if outer == "List":
            return type(value) is list and all(conforms(v, inner) for v in value)
        if outer == "Dict" and isinstance(inner, ast.Tuple):
            key, item = inner.elts
            return type(value) is dict and all(conforms(k, key) and conforms(v, item) for k, v in value.items())
    raise AssertionError(f"the test cannot read the annotation {ast.unparse(ann)}")


def test_an_outcomes_attributes_are_its_keys_of_the_types_the_stub_gives(tmp_path: Path):
    props = {n: f for n, f in defs(classes()["Outcome"].body).items() if is_property(f)}
    with _native.Store(tmp_path / "home") as store:
        committed = store.append("s1", [{"role": "user", "content": "x"}], uids=["u1"])
        # The same uid with other bytes: handed back, with a cause and copy.
        refused = store.append("s1", [{"role": "user", "content": "DIFFERENT"}], uids=["u1"])
    assert committed.persisted and not refused.persisted and refused.copy is not None
    for out in (committed, refused):
        printed = out.to_dict()
        assert set(props) == set(printed)
        for n, f in props.items():
            value = getattr(out, n)
            assert conforms(value, f.returns), f"Outcome.{n} = {value!r} is not {ast.unparse(f.returns)}"
            # Each attribute is the key of the same name in what `append` prints.
            assert value == printed[n], n
