#!/usr/bin/env python3
"""Check that the Metal/Foundation stubs in tools/metal_check/include name only real Apple API.

run.sh type-checks csrc/gpu/metal/*.mm against hand-written stub headers; this script
checks the stubs themselves against Apple's SDK, as recorded by PyObjC: the macOS wheels of
pyobjc-framework-Metal and pyobjc-framework-Cocoa carry `Metal/_metadata.py` and
`Foundation/_metadata.py`, generated from the SDK headers.

Usage:
    check_api_names.py [WHEEL ...] [--include DIR] [--clang CLANG] [--self-test]

With no WHEEL it downloads both wheels into a temporary directory with
    pip download --no-deps --only-binary :all: --platform macosx_11_0_universal2 \
        --python-version 3.12 pyobjc-framework-Metal==12.2.2 pyobjc-framework-Cocoa==13.0
--self-test also proves the check bites: it re-runs it on copies of the stubs with a
misspelt selector, a wrong argument type, a wrong enum value, an unknown function and so on,
each of which must fail.

How the stubs are read: clang itself parses them (`-Xclang -ast-dump=json`), so every
declaration is seen exactly as the compiler sees it, including the getters and setters that
@property declares.

How the metadata is read: `_metadata.py` is a Python module, but it is data and is never
imported or executed here. It is parsed with `ast.parse` and only these shapes are read:
  * `enums = "$NAME@VALUE$..."`: every enum constant with its value (checked: name and value);
  * `constants = "$NAME$..."`: extern constants (checked: name);
  * `functions = {NAME: (ENCODING, ...)}`: C functions with their type encoding
    (checked: name, return and argument encodings, and `already_cfretained` against
    NS_RETURNS_RETAINED);
  * `misc.update({NAME: objc.createStructType(..., ENCODING, [FIELDS]) | NewType(NAME, ...)})`:
    structs (checked: encoding and field names) and enum/option type names (checked: name);
  * `r(b"CLASS", b"SELECTOR", {...})` (objc.registerMetaDataForSelector): selectors.
    Protocol methods are all registered on class NSObject with a "required" key; class
    methods on their class. Where the entry gives types, the stub's return and argument
    encodings must match them (including a block's arguments);
  * `objc.registerNewKeywordsFromSelector("CLASS", b"init...")`: a class's init methods.
Dict literals are evaluated by a small literal evaluator that knows only constants,
containers and the metadata's own `sel32or64(a, b)` / `selAorI(a, b)` (64-bit arm64 picks).

What the metadata does not list, so this script cannot verify (it says so on every run):
  * selectors that need no bridging information: PyObjC records a class's method only when
    it has a non-object, non-integer type to describe (pointers, BOOL, structs, blocks).
    Those the stubs declare are listed in UNLISTED below, each with its reason; any other
    selector missing from the metadata fails the check;
  * protocol names, protocol inheritance and which protocol declares a selector (the
    metadata registers every protocol method on NSObject), and class inheritance;
  * the types of a selector that several protocols declare: the metadata keeps one
    protocol's; where that is not ours the types are reported unverified (MERGED_SELECTORS);
  * types the metadata leaves out: a class method's entry describes only its special
    arguments, so its object and integer arguments go unchecked;
  * basic typedefs of the Objective-C runtime (NSInteger, NSUInteger, BOOL) and macros
    (nil, YES, NO, NS_ENUM, ...), and availability annotations.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_INCLUDE = HERE / "include"
# Pinned to the versions this check was last verified with; bump deliberately.
PIP_PACKAGES = ["pyobjc-framework-Metal==12.2.2", "pyobjc-framework-Cocoa==13.0"]
METADATA_MEMBERS = ["Metal/_metadata.py", "Foundation/_metadata.py"]

# Declared in the stubs, absent from PyObjC's metadata for the reason given.
# Checked by hand against Apple's documentation (URL in the reason).
UNLISTED = {
    ("NSObject", "alloc"): "root-class method of libobjc (objc/NSObject.h), bridged by pyobjc-core "
    "without metadata; developer.apple.com/documentation/objectivec/nsobject/alloc",
    ("NSObject", "init"): "root-class method of libobjc (objc/NSObject.h), bridged by pyobjc-core "
    "without metadata; developer.apple.com/documentation/objectivec/nsobject/init()",
    ("NSError", "localizedDescription"): "object-typed property needs no bridging metadata; "
    "developer.apple.com/documentation/foundation/nserror/localizeddescription",
    ("MTLCompileOptions", "mathMode"): "integer-typed property (macOS 15) needs no bridging metadata; "
    "its type MTLMathMode and values are checked; developer.apple.com/documentation/metal/mtlcompileoptions/mathmode",
    ("MTLCompileOptions", "setMathMode:"): "setter of mathMode, see there",
    ("MTLCompileOptions", "mathFloatingPointFunctions"): "integer-typed property (macOS 15) needs no bridging "
    "metadata; its type and values are checked; "
    "developer.apple.com/documentation/metal/mtlcompileoptions/mathfloatingpointfunctions",
    ("MTLCompileOptions", "setMathFloatingPointFunctions:"): "setter of mathFloatingPointFunctions, see there",
    ("MTLCompileOptions", "languageVersion"): "integer-typed property needs no bridging metadata; its type "
    "MTLLanguageVersion and values are checked; developer.apple.com/documentation/metal/mtlcompileoptions/languageversion",
    ("MTLCompileOptions", "setLanguageVersion:"): "setter of languageVersion, see there",
    ("NSArray", "firstObject"): "object-typed property needs no bridging metadata; "
    "developer.apple.com/documentation/foundation/nsarray/firstobject",
    ("MTLDevice", "architecture"): "object-typed property (macOS 14) needs no bridging metadata; "
    "developer.apple.com/documentation/metal/mtldevice/architecture",
    ("MTLArchitecture", "name"): "object-typed property (macOS 14) needs no bridging metadata; "
    "developer.apple.com/documentation/metal/mtlarchitecture/name",
    ("NSArray", "objectAtIndex:"): "object result, integer argument: needs no bridging metadata; "
    "developer.apple.com/documentation/foundation/nsarray/objectatindex(_:)",
    ("NSURL", "fileURLWithPath:"): "class method with an object argument and result: needs no bridging metadata; "
    "developer.apple.com/documentation/foundation/nsurl/fileurlwithpath(_:)",
    ("NSDictionary", "objectForKey:"): "object result and argument need no bridging metadata; "
    "developer.apple.com/documentation/foundation/nsdictionary/object(forkey:)",
    ("NSError", "userInfo"): "object-typed property needs no bridging metadata; "
    "developer.apple.com/documentation/foundation/nserror/userinfo",
    ("MTLCommandBufferDescriptor", "setErrorOptions:"): "setter of an integer-typed property needs no bridging "
    "metadata; its type MTLCommandBufferErrorOption and values are checked; "
    "developer.apple.com/documentation/metal/mtlcommandbufferdescriptor/erroroptions",
}
# Declared in the stubs with no member, absent from PyObjC's metadata for the reason given.
UNLISTED_CLASSES = {
    "MTLArchitecture": "its one member, name, is object-typed, so PyObjC records no selector of it (macOS 14); "
    "developer.apple.com/documentation/metal/mtlarchitecture",
    "MTLResidencySetDescriptor": "its members (label, initialCapacity) are object- and integer-typed, so PyObjC "
    "records no selector of it (the selector taking it, newResidencySetWithDescriptor:error:, is checked); "
    "developer.apple.com/documentation/metal/mtlresidencysetdescriptor",
}
# PyObjC registers protocol methods on NSObject by selector, so a selector that several
# protocols declare carries the types of only one of them. Where that one is not ours,
# the type comparison is reported as not verified, with the reason.
MERGED_SELECTORS = {
    ("MTLCommandBuffer", "status"): "the metadata's 'status' is MTLIOCommandBuffer's (MTLIOStatus, NSInteger); "
    "MTLCommandBuffer's is MTLCommandBufferStatus, NS_ENUM(NSUInteger): "
    "developer.apple.com/documentation/metal/mtlcommandbufferstatus",
}
RUNTIME_TYPEDEFS = {"NSInteger", "NSUInteger", "BOOL"}


# ---------------------------------------------------------------------------------------------
# PyObjC metadata


class Unsupported(ValueError):
    pass


def literal(node: ast.AST):
    """ast.literal_eval plus the metadata's sel32or64/selAorI helpers; never runs code."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):  # {**other}
            raise Unsupported("dict unpacking")
        return {literal(k): literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [literal(e) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -literal(node.operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2:
        if node.func.id == "sel32or64":
            return literal(node.args[1])  # 64-bit
        if node.func.id == "selAorI":
            return literal(node.args[0])  # arm64
    raise Unsupported(ast.dump(node)[:80])


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Metadata:
    selectors: dict = field(default_factory=dict)  # (class, selector) -> [info dict | None]
    init_keywords: set = field(default_factory=set)  # (class, selector)
    enums: dict = field(default_factory=dict)  # name -> value
    constants: set = field(default_factory=set)
    functions: dict = field(default_factory=dict)  # name -> tuple | None
    structs: dict = field(default_factory=dict)  # name -> (encoding, [fields])
    type_names: set = field(default_factory=set)  # NewType names
    aliases: dict = field(default_factory=dict)
    sources: list = field(default_factory=list)

    def add(self, source: str, label: str) -> None:
        self.sources.append(label)
        module = ast.parse(source)
        for node in ast.walk(module):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self._assignment(node.targets[0].id, node.value)
            elif isinstance(node, ast.Call):
                self._call(node)

    def _assignment(self, name: str, value: ast.AST) -> None:
        if name in ("enums", "constants"):
            try:
                table = literal(value)
            except Unsupported:
                return
            for entry in filter(None, text(table).split("$")):
                entry_name, _, entry_value = entry.partition("@")
                if name == "constants":
                    self.constants.add(entry_name)
                else:
                    self.enums[entry_name] = parse_number(entry_value)
        elif name == "functions" and isinstance(value, ast.Dict):
            self._functions(value)
        elif name == "aliases" and isinstance(value, ast.Dict):
            for k, v in zip(value.keys, value.values):
                try:
                    self.aliases[literal(k)] = literal(v)
                except Unsupported:
                    pass

    def _functions(self, table: ast.Dict) -> None:
        for k, v in zip(table.keys, table.values):
            try:
                self.functions[literal(k)] = literal(v)
            except Unsupported:
                self.functions[literal(k)] = None

    def _call(self, node: ast.Call) -> None:
        func = node.func
        callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        args = node.args
        if callee in ("r", "registerMetaDataForSelector") and len(args) >= 2:
            try:
                key = (text(literal(args[0])), text(literal(args[1])))
            except Unsupported:
                return
            try:
                info = literal(args[2]) if len(args) > 2 else {}
            except Unsupported:
                info = None
            self.selectors.setdefault(key, []).append(info)
        elif callee == "registerNewKeywordsFromSelector" and len(args) == 2:
            self.init_keywords.add((text(literal(args[0])), text(literal(args[1]))))
        elif callee == "update" and isinstance(func.value, ast.Name) and args and isinstance(args[0], ast.Dict):
            if func.value.id == "functions":
                self._functions(args[0])
            elif func.value.id == "misc":
                for k, v in zip(args[0].keys, args[0].values):
                    self._misc(literal(k), v)

    def _misc(self, name: str, value: ast.AST) -> None:
        if not isinstance(value, ast.Call):
            return
        callee = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
        if callee == "createStructType" and len(value.args) >= 3:
            self.structs[name] = (text(literal(value.args[1])), [text(f) for f in literal(value.args[2])])
        elif callee == "NewType":
            self.type_names.add(name)


def parse_number(value: str):
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


def find_wheels(given: list[str], workdir: Path) -> list[Path]:
    if given:
        return [Path(w) for w in given]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--platform", "macosx_11_0_universal2", "--python-version", "3.12", "-d", str(workdir),
               *PIP_PACKAGES]
    print("check_api_names: downloading", " ".join(PIP_PACKAGES), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return sorted(workdir.glob("*.whl"))


def load_metadata(wheels: list[Path]) -> Metadata:
    meta = Metadata()
    found = set()
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in METADATA_MEMBERS:
                if member in archive.namelist():
                    meta.add(archive.read(member).decode("utf-8"), f"{wheel.name}:{member}")
                    found.add(member)
    missing = [m for m in METADATA_MEMBERS if m not in found]
    if missing:
        sys.exit(f"check_api_names: no {', '.join(missing)} in {', '.join(map(str, wheels))}")
    return meta


# ---------------------------------------------------------------------------------------------
# The stubs, as clang parses them


@dataclass
class Method:
    container: str
    is_protocol: bool
    selector: str
    returns: dict
    params: list  # clang type dicts
    where: str


@dataclass
class Stubs:
    methods: list = field(default_factory=list)
    classes: dict = field(default_factory=dict)  # name -> superclass
    protocols: set = field(default_factory=set)
    enum_constants: list = field(default_factory=list)  # (name, value, where)
    enum_types: dict = field(default_factory=dict)  # name -> underlying clang type
    typedefs: dict = field(default_factory=dict)  # name -> clang type dict
    structs: dict = field(default_factory=dict)  # name -> [(field, clang type dict)]
    functions: list = field(default_factory=list)  # (name, returns, params, retained, where)
    variables: list = field(default_factory=list)  # (name, where)


class StubError(RuntimeError):
    pass


def parse_stubs(include: Path, clang: str) -> Stubs:
    headers = sorted(p.relative_to(include) for p in include.rglob("*.h"))
    source = "".join(f"#import <{h.as_posix()}>\n" for h in headers)
    command = [clang, "-x", "objective-c++", "-std=c++20", "-fobjc-arc", "-fblocks",
               "-fobjc-runtime=macosx-11.0", "-fsyntax-only", "-Xclang", "-ast-dump=json",
               "-I", str(include), "-"]
    run = subprocess.run(command, input=source, capture_output=True, text=True)
    if run.returncode != 0:
        raise StubError(f"clang could not parse the stubs:\n{run.stderr}")
    stubs = Stubs()
    include_text = str(include.resolve())
    current = {"file": "", "line": 0}

    def where(node) -> str:
        # clang's JSON gives a location's file and line only when they change.
        loc = node.get("loc", {})
        loc = loc.get("expansionLoc", loc)
        current.update({k: loc[k] for k in ("file", "line") if k in loc})
        name = os.path.relpath(current["file"], include.parent) if current["file"] else "?"
        return f"{name}:{current['line']}"

    def ours() -> bool:
        return bool(current["file"]) and str(Path(current["file"]).resolve()).startswith(include_text)

    previous_record = None
    for node in json.loads(run.stdout)["inner"]:
        where(node)
        if not ours():
            continue
        kind = node["kind"]
        if kind in ("ObjCInterfaceDecl", "ObjCProtocolDecl"):
            is_protocol = kind == "ObjCProtocolDecl"
            name = node["name"]
            if is_protocol:
                stubs.protocols.add(name)
            else:
                stubs.classes[name] = node.get("super", {}).get("name")
            for member in node.get("inner", []):
                if member["kind"] == "ObjCMethodDecl":
                    params = [p["type"] for p in member.get("inner", []) if p["kind"] == "ParmVarDecl"]
                    stubs.methods.append(Method(name, is_protocol, member["name"], member["returnType"],
                                                params, where(member)))
        elif kind == "EnumDecl":
            if node.get("name"):
                stubs.enum_types[node["name"]] = node["fixedUnderlyingType"]
            for constant in node.get("inner", []):
                if constant["kind"] == "EnumConstantDecl":
                    stubs.enum_constants.append((constant["name"], enum_value(constant), where(constant)))
        elif kind == "TypedefDecl":
            stubs.typedefs[node["name"]] = node["type"]
            owned = (node.get("inner") or [{}])[0].get("ownedTagDecl", {})
            if owned.get("kind") == "CXXRecordDecl" and not owned.get("name") and previous_record is not None:
                stubs.structs[node["name"]] = previous_record
        elif kind == "CXXRecordDecl":
            previous_record = [(f["name"], f["type"]) for f in node.get("inner", []) if f["kind"] == "FieldDecl"]
        elif kind in ("FunctionDecl", "LinkageSpecDecl", "VarDecl"):
            for decl in [node] if kind != "LinkageSpecDecl" else node.get("inner", []):
                if decl["kind"] == "FunctionDecl":
                    params = [p["type"] for p in decl.get("inner", []) if p["kind"] == "ParmVarDecl"]
                    signature = decl["type"].get("desugaredQualType", decl["type"]["qualType"])
                    returns = signature.split("(")[0].strip()
                    retained = "ns_returns_retained" in signature or any(
                        a["kind"] == "NSReturnsRetainedAttr" for a in decl.get("inner", []))
                    stubs.functions.append((decl["name"], {"qualType": returns}, params, retained, where(decl)))
                elif decl["kind"] == "VarDecl":
                    stubs.variables.append((decl["name"], where(decl)))
    return stubs


def enum_value(constant: dict):
    for expr in constant.get("inner", []):
        if "value" in expr:
            return int(expr["value"])
    return None


# ---------------------------------------------------------------------------------------------
# Objective-C type encodings of clang types (arm64 macOS)

QUALIFIERS = re.compile(r"\b(const|volatile|__strong|__autoreleasing|__unsafe_unretained|__weak|"
                        r"_Nullable|_Nonnull|_Null_unspecified|NS_RETURNS_RETAINED|struct|enum)\b")
SCALARS = {"void": "v", "bool": "Z", "char": "c", "signed char": "c", "unsigned char": "C",
           "short": "s", "unsigned short": "S", "int": "i", "unsigned int": "I",
           "long": "q", "unsigned long": "Q", "long long": "q", "unsigned long long": "Q",
           "float": "f", "double": "d", "SEL": ":"}


class Encoder:
    def __init__(self, stubs: Stubs):
        self.stubs = stubs

    def encode(self, clang_type: dict | str) -> str:
        if isinstance(clang_type, str):
            return self._encode(clang_type)
        try:
            return self._encode(clang_type["qualType"])
        except ValueError:
            if "desugaredQualType" not in clang_type:
                raise
            return self._encode(clang_type["desugaredQualType"])

    def _encode(self, spelled: str) -> str:
        t = " ".join(QUALIFIERS.sub(" ", spelled).split())
        if "(^" in t:
            return "@?"
        if t == "id" or t.startswith("id<") or t == "instancetype":
            return "@"
        if t.endswith("*"):
            pointee = t[:-1].strip()
            class_name = pointee.split("<", 1)[0].strip()  # NSArray<id<MTLDevice>>: generic arguments
            if class_name in self.stubs.classes or pointee == "id" or pointee.startswith("id<"):
                return "@"
            if pointee == "char":
                return "*"
            return "^" + self._encode(pointee)
        if t in SCALARS:
            return SCALARS[t]
        if t in self.stubs.structs:
            return "{%s=%s}" % (t, "".join(self.encode(ftype) for _, ftype in self.stubs.structs[t]))
        if t in self.stubs.enum_types:
            return self.encode(self.stubs.enum_types[t])
        if t in self.stubs.typedefs:
            typedef = self.stubs.typedefs[t]
            return self._encode(typedef.get("desugaredQualType", typedef["qualType"]))
        raise ValueError(f"no encoding for type '{spelled}'")


def same_encoding(ours: str, theirs) -> bool:
    def norm(e: str) -> str:
        e = e.lstrip("rnNoORV")  # const/in/out/... modifiers
        return {"^t": "*", "B": "Z", "^?": "@?"}.get(e, e)

    return norm(ours) == norm(text(theirs))


# ---------------------------------------------------------------------------------------------
# The check


@dataclass
class Report:
    errors: list = field(default_factory=list)
    unverified: list = field(default_factory=list)
    checked: int = 0


def check(stubs: Stubs, meta: Metadata) -> Report:
    report = Report()
    enc = Encoder(stubs)

    def superclasses(name):
        while name:
            yield name
            name = stubs.classes.get(name)

    for m in stubs.methods:
        label = f"{'<' + m.container + '>' if m.is_protocol else m.container} {m.selector} ({m.where})"
        if m.is_protocol and m.container != "NSObject":
            entries = [i for i in meta.selectors.get(("NSObject", m.selector), []) if i is None or "required" in i]
        else:
            owners = list(superclasses(m.container)) if not m.is_protocol else ["NSObject"]
            entries = [i for c in owners for i in meta.selectors.get((c, m.selector), [])]
            entries += [{} for c in owners if (c, m.selector) in meta.init_keywords]
        if not entries:
            reason = UNLISTED.get((m.container, m.selector))
            if reason:
                report.unverified.append(f"{label}: {reason}")
            else:
                report.errors.append(f"selector {m.selector!r} of {label}: not in the SDK metadata "
                                     f"({'protocol methods' if m.is_protocol else 'methods of ' + m.container})")
            continue
        report.checked += 1
        try:
            mismatches = [e for info in entries if info for e in compare_method(m, info, enc, label)]
        except ValueError as e:
            mismatches = [f"{label}: {e}"]
        merged = MERGED_SELECTORS.get((m.container, m.selector))
        if mismatches and merged:
            report.unverified.append(f"types of {label}: {merged}")
        else:
            report.errors += mismatches

    for name, value, spot in stubs.enum_constants:
        real = meta.enums.get(meta.aliases.get(name, name))
        if real is None:
            report.errors.append(f"enum constant {name} ({spot}): not in the SDK metadata")
        elif real != value:
            report.errors.append(f"enum constant {name} ({spot}) = {value}, the SDK says {real}")
        else:
            report.checked += 1

    enum_type_names = set(stubs.enum_types) | {n for n, t in stubs.typedefs.items()
                                               if n not in stubs.structs and n not in RUNTIME_TYPEDEFS}
    for name in sorted(enum_type_names):
        if name in meta.type_names:
            report.checked += 1
        else:
            report.errors.append(f"type {name}: not in the SDK metadata")

    for name, fields in stubs.structs.items():
        real = meta.structs.get(name)
        ours = enc.encode(name)
        if real is None:
            report.errors.append(f"struct {name}: not in the SDK metadata")
        elif [f for f, _ in fields] != real[1] or not same_encoding(ours, real[0]):
            report.errors.append(f"struct {name} {ours} {[f for f, _ in fields]}: the SDK says {real[0]} {real[1]}")
        else:
            report.checked += 1

    for name, returns, params, retained, spot in stubs.functions:
        if name not in meta.functions:
            report.errors.append(f"function {name} ({spot}): not in the SDK metadata")
            continue
        real = meta.functions[name]
        report.checked += 1
        if not real:
            continue
        ours = enc.encode(returns) + "".join(enc.encode(p) for p in params)
        if not split_encoding_equal(ours, text(real[0])):
            report.errors.append(f"function {name} ({spot}) has encoding {ours}, the SDK says {text(real[0])}")
        sdk_retained = bool(len(real) > 2 and real[2].get("retval", {}).get("already_cfretained"))
        if sdk_retained != retained:
            report.errors.append(f"function {name} ({spot}): NS_RETURNS_RETAINED is "
                                 f"{'missing' if sdk_retained else 'wrong'} (SDK already_cfretained={sdk_retained})")

    for name, spot in stubs.variables:
        if name in meta.constants:
            report.checked += 1
        else:
            report.errors.append(f"constant {name} ({spot}): not in the SDK metadata")

    for name in sorted(stubs.classes):
        if not any(c == name for c, _ in meta.selectors) and not any(c == name for c, _ in meta.init_keywords):
            if name in UNLISTED_CLASSES:
                report.unverified.append(f"class {name}: {UNLISTED_CLASSES[name]}")
            else:
                report.errors.append(f"class {name}: no selector of it in the SDK metadata")
    report.unverified.append(f"protocol names {', '.join(sorted(stubs.protocols))}, which protocol declares "
                             "each selector, and class/protocol inheritance: not recorded in the metadata")
    return report


def compare_method(m: Method, info: dict, enc: Encoder, label: str) -> list:
    errors = []
    want = info.get("retval", {}).get("type")
    if want is not None and not same_encoding(enc.encode(m.returns), want):
        errors.append(f"{label}: returns {enc.encode(m.returns)} ({m.returns['qualType']}), the SDK says {text(want)}")
    arguments = info.get("arguments", {})
    for i, param in enumerate(m.params):
        sdk = arguments.get(i + 2, {})
        ours = enc.encode(param)
        if "type" in sdk and not same_encoding(ours, sdk["type"]):
            errors.append(f"{label}: argument {i + 1} is {ours} ({param['qualType']}), the SDK says {text(sdk['type'])}")
        if "callable" in sdk:
            errors += compare_block(param["qualType"], sdk["callable"], enc, f"{label}: block argument {i + 1}")
    return errors


def compare_block(spelled: str, callable_info: dict, enc: Encoder, label: str) -> list:
    match = re.match(r"(.*)\(\^[^)]*\)\((.*)\)\s*$", spelled)
    if not match:
        return [f"{label}: {spelled} is not a block"]
    returns, params = match.group(1), [p for p in split_params(match.group(2)) if p != "void"]
    sdk_args = callable_info.get("arguments", {})
    sdk_params = [sdk_args[k].get("type") for k in sorted(sdk_args) if k != 0]  # 0: the block itself
    ours = [enc.encode(p) for p in params]
    want_return = callable_info.get("retval", {}).get("type", "v")
    if len(ours) != len(sdk_params) or not all(same_encoding(o, s) for o, s in zip(ours, sdk_params)) \
            or not same_encoding(enc.encode(returns), want_return):
        return [f"{label}: {enc.encode(returns)}({', '.join(ours)}), the SDK says "
                f"{text(want_return)}({', '.join(text(s) for s in sdk_params)})"]
    return []


def split_params(spelled: str) -> list:
    depth, part, parts = 0, "", []
    for ch in spelled:
        if ch == "," and depth == 0:
            parts.append(part.strip())
            part = ""
            continue
        depth += ch in "(<"
        depth -= ch in ")>"
        part += ch
    if part.strip():
        parts.append(part.strip())
    return parts


def split_encoding_equal(ours: str, theirs: str) -> bool:
    def parts(e):
        out, i = [], 0
        while i < len(e):
            j = i
            while j < len(e) and e[j] in "rnNoORV":
                j += 1
            if e[j] == "{":
                depth, k = 0, j
                while True:
                    depth += e[k] == "{"
                    depth -= e[k] == "}"
                    k += 1
                    if depth == 0:
                        break
            elif e[j] == "^":
                k = j + 1
                while e[k] == "^":
                    k += 1
                k += 1
            elif e[j:j + 2] == "@?":
                k = j + 2
            else:
                k = j + 1
            out.append(e[i:k])
            i = k
        return out

    a, b = parts(ours), parts(theirs)
    return len(a) == len(b) and all(same_encoding(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------------------------------------
# Self-test: each mutation of the stubs must make the check fail, naming the culprit.

MUTATIONS = [
    ("Metal/Metal.h", "- (void)commit;", "- (void)comit;", "'comit'"),
    ("Metal/Metal.h", "atIndex:(NSUInteger)index;\n- (void)setThreadgroupMemoryLength",
     "atIndex:(uint32_t)index;\n- (void)setThreadgroupMemoryLength", "setBytes:length:atIndex:"),
    ("Metal/Metal.h", "MTLCommandBufferStatusError = 5", "MTLCommandBufferStatusError = 4",
     "MTLCommandBufferStatusError"),
    ("Metal/Metal.h", "MTLDispatchTypeConcurrent = 1", "MTLDispatchTypeParallel = 1", "MTLDispatchTypeParallel"),
    ("Metal/Metal.h", "MTL_EXTERN id<MTLDevice> MTLCreateSystemDefaultDevice(void) NS_RETURNS_RETAINED;",
     "MTL_EXTERN id<MTLDevice> MTLCreateSystemDefaultDevice(void);", "NS_RETURNS_RETAINED"),
    ("Metal/Metal.h", "MTL_EXTERN id<MTLDevice> MTLCreateSystemDefaultDevice(void) NS_RETURNS_RETAINED;",
     "MTL_EXTERN id<MTLDevice> MTLCreateDefaultDevice(void) NS_RETURNS_RETAINED;", "MTLCreateDefaultDevice"),
    ("Metal/Metal.h", "void (^)(void* pointer, NSUInteger length)", "void (^)(void* pointer)", "block argument"),
    ("Metal/Metal.h", "@property(readonly) NSUInteger threadExecutionWidth;",
     "@property(readonly) float threadExecutionWidth;", "threadExecutionWidth"),
    ("Metal/Metal.h", "NSUInteger width, height, depth;", "unsigned int width, height, depth;", "MTLSize"),
    ("Metal/Metal.h", "@interface MTLCompileOptions : NSObject\n",
     "@interface MTLCompileOptions : NSObject\n@property(readwrite, nonatomic) BOOL fastMath;\n", "'fastMath'"),
    ("Metal/Metal.h", "MTLGPUFamilyApple7 = 1007", "MTLGPUFamilyApple7 = 1006", "MTLGPUFamilyApple7"),
    ("Metal/Metal.h", "MTLLanguageVersion3_1 = (3 << 16) + 1", "MTLLanguageVersion3_1 = (3 << 16) + 2",
     "MTLLanguageVersion3_1"),
    ("Metal/Metal.h", "- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily;", "- (BOOL)supportsFamily:(uint32_t)gpuFamily;",
     "supportsFamily:"),
    ("Metal/Metal.h", "@property(readonly) uint64_t recommendedMaxWorkingSetSize;",
     "@property(readonly) uint64_t recommendedWorkingSetSize;", "'recommendedWorkingSetSize'"),
    ("Metal/Metal.h", "NSArray<id<MTLDevice>>* MTLCopyAllDevices(void) NS_RETURNS_RETAINED;",
     "NSArray<id<MTLDevice>>* MTLCopyAllDevices(void);", "MTLCopyAllDevices"),
    ("Foundation/Foundation.h", "NSUTF8StringEncoding = 4", "NSUTF8StringEncoding = 8", "NSUTF8StringEncoding"),
    ("Foundation/Foundation.h", "@property(readonly) const char* UTF8String;",
     "@property(readonly) const char* UTF8string;", "'UTF8string'"),
]


def self_test(include: Path, clang: str, meta: Metadata) -> bool:
    ok = True
    for header, old, new, culprit in MUTATIONS:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "include"
            shutil.copytree(include, copy)
            target = copy / header
            original = target.read_text()
            if old not in original:
                print(f"check_api_names: FAILED self-test: '{old[:40]}...' no longer in {header}: update MUTATIONS")
                ok = False
                continue
            target.write_text(original.replace(old, new, 1))
            try:
                errors = check(parse_stubs(copy, clang), meta).errors
            except StubError as e:
                errors = [f"{header}: {e}"]
            hits = [e for e in errors if culprit in e]
            if hits:
                print(f"check_api_names: ok self-test catches {hits[0]}".replace(str(copy), "include"))
            else:
                print(f"check_api_names: FAILED self-test: {header} with {new!r} not caught ({errors})")
                ok = False
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheels", nargs="*", help="pyobjc-framework-Metal and -Cocoa macOS wheels")
    parser.add_argument("--include", type=Path, default=DEFAULT_INCLUDE, help="stub include directory")
    parser.add_argument("--clang", default=os.environ.get("CLANGXX", "clang++"))
    parser.add_argument("--self-test", action="store_true", help="also prove the check catches mistakes")
    args = parser.parse_args()
    if shutil.which(args.clang) is None:
        sys.exit(f"check_api_names: {args.clang} not found (Debian: apt-get install -y clang)")

    with tempfile.TemporaryDirectory() as workdir:
        meta = load_metadata(find_wheels(args.wheels, Path(workdir)))
    try:
        stubs = parse_stubs(args.include, args.clang)
    except StubError as e:
        print(f"check_api_names: ERROR {e}")
        return 1
    report = check(stubs, meta)
    print(f"check_api_names: metadata from {', '.join(meta.sources)}")
    for note in report.unverified:
        print(f"check_api_names: NOT VERIFIED (not in the metadata) {note}")
    for error in report.errors:
        print(f"check_api_names: ERROR {error}")
    print(f"check_api_names: {report.checked} stub declarations match the SDK, "
          f"{len(report.unverified)} not verifiable, {len(report.errors)} errors")
    ok = not report.errors
    if args.self_test:
        ok = self_test(args.include, args.clang, meta) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
