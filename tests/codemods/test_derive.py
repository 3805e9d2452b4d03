"""``derive``: building a move map from two versions of a module's source, by AST."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mm_schedule.codemods.movemap import bindings, derive, derive_cli, sources
from mm_schedule.codemods.movemap.schema import KINDS, MovedName, MoveMap, load_map
from mm_schedule.errors import MoveMapError

from .conftest import realworld_helpers

OLD = "pkg.sub.olds"
NEW = "pkg.sub.news"


def _write(root: Path, module: str, text: str) -> Path:
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _derive(tmp_path: Path, old: str, new_old: str | None, new: str) -> MoveMap:
    old_path = _write(tmp_path / "v1", OLD, old)
    new_paths = [_write(tmp_path / "v2", NEW, new)]
    if new_old is not None:
        new_paths.insert(0, _write(tmp_path / "v2", OLD, new_old))
    return derive.derive_map(old_path, new_paths, old_module=OLD, new_module=NEW)


# --------------------------------------------------------------------------- random scenarios


@dataclass
class Scenario:
    old: list[str] = field(default_factory=list)
    new_old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    moved: dict[str, MovedName] = field(default_factory=dict)
    reexported: set[str] = field(default_factory=set)
    import_origins: dict[str, str] = field(default_factory=dict)
    unmapped: dict[str, str] = field(default_factory=dict)
    rebound: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)


def _definition(rng: random.Random, name: str, kind: str) -> str:
    forms = {
        "function": ["def {n}(a, b=1):\n    return a\n", "async def {n}():\n    pass\n"],
        "class": ["class {n}:\n    x = 1\n", "class {n}(Base, metaclass=Meta):\n    pass\n"],
        "variable": [
            "{n} = 1\n", "{n}: int = 2\n", "[{n}] = [3]\n", "for {n} in range(2):\n    pass\n",
            "with open(__file__) as {n}:\n    pass\n", "if FLAG:\n    {n} = 1\nelse:\n    {n} = 2\n",
        ],
    }
    return rng.choice(forms[kind]).format(n=name)


# (written import, absolute origin); {o} is the original name, {n} the bound one.
_PLAIN_IMPORTS = [
    ("from pkg.util import {n}", "pkg.util"),
    ("from .sib import {n}", "pkg.sub.sib"),
    ("from ..top import {n}", "pkg.top"),
    ("from . import {n}", "pkg.sub"),
    ("from typing import (\n    {n},\n)", "typing"),
]
_ALIASED_IMPORTS = [
    ("from pkg.util import {o} as {n}", "from pkg.util import {o} as {n}"),
    ("from .sib import {o} as {n}", "from pkg.sub.sib import {o} as {n}"),
    ("import json as {n}", "import json as {n}"),
    ("import {n}.path", "import {n}.path"),
]
_REEXPORTS = [
    "from pkg.sub.news import {n}", "from pkg.sub.news import {n} as {n}", "from .news import {n}",
    "from .news import (\n    {n} as {n},\n)",
]


def _scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    used: set[str] = set()

    def fresh() -> str:
        while True:
            name = rng.choice(["", "_"]) + rng.choice("abcdefghXYZ") + str(rng.randint(0, 999))
            if name not in used:
                used.add(name)
                return name

    s = Scenario()
    for _ in range(rng.randint(2, 14)):
        name, kind = fresh(), rng.choice(KINDS)
        fate = rng.choice(["stay", "move", "reexport", "remove"])
        s.old.append(_definition(rng, name, kind))
        if fate == "stay":
            s.new_old.append(_definition(rng, name, kind))
        elif fate == "remove":
            s.removed.add(name)
        else:
            s.new.append(_definition(rng, name, kind))
            s.moved[name] = MovedName(kind=kind, private=name.startswith("_"))
            if fate == "reexport":
                s.reexported.add(name)
                s.new_old.append(rng.choice(_REEXPORTS).format(n=name) + "\n")
            elif rng.random() < 0.5:  # bound under another name: not a re-export of this one
                s.new_old.append(f"from .news import {name} as alias_{name}\n")
            if kind == "variable" and rng.random() < 0.5:
                s.rebound.add(name)
                s.new.append(f"def set_{name}(v):\n    global {name}\n    {name} = v\n")

    for _ in range(rng.randint(0, 10)):
        name = fresh()
        keep = rng.random() < 0.4
        if rng.random() < 0.7:
            written, origin = rng.choice(_PLAIN_IMPORTS)
            line = written.format(n=name) + "\n"
            if not keep:
                s.import_origins[name] = origin
        else:
            written, shown = rng.choice(_ALIASED_IMPORTS)
            line = written.format(n=name, o="orig_" + name) + "\n"
            if not keep:
                s.unmapped[name] = shown.format(n=name, o="orig_" + name)
        s.old.append(line)
        if keep:
            s.new_old.append(line)
        elif rng.random() < 0.5:
            # The new module importing it too must not make it a "moved" name.
            s.new.append(line.replace("from .sib", "from pkg.sub.sib"))

    # Decoys: a global only read, and a nested function's local of the same name.
    s.new.append("def reader():\n    global FLAG\n    return FLAG\n")
    s.new.append("def outer():\n    global nested_only\n    def inner():\n        nested_only = 1\n    return inner\n")
    for part in (s.old, s.new_old, s.new):
        rng.shuffle(part)
    return s


@pytest.mark.parametrize("seed", range(40))
def test_random_splits_match_their_ground_truth(tmp_path, seed):
    s = _scenario(seed)
    m = _derive(tmp_path, "\n".join(s.old), "\n".join(s.new_old), "\n".join(s.new))
    assert m.old_module == OLD and m.new_module == NEW
    assert m.moved == s.moved
    assert m.reexported == s.reexported
    assert m.import_origins == s.import_origins
    assert m.unmapped_imports == s.unmapped
    assert m.rebound_globals == s.rebound
    assert m.removed == s.removed


@pytest.mark.parametrize("seed", range(5))
def test_output_is_deterministic_and_order_independent(tmp_path, seed):
    s = _scenario(seed)
    first = _derive(tmp_path / "a", "\n".join(s.old), "\n".join(s.new_old), "\n".join(s.new))
    again = _derive(tmp_path / "a", "\n".join(s.old), "\n".join(s.new_old), "\n".join(s.new))
    assert first.to_json() == again.to_json()
    rng = random.Random(seed + 1000)
    for part in (s.old, s.new_old, s.new):
        rng.shuffle(part)
    shuffled = _derive(tmp_path / "b", "\n".join(s.old), "\n".join(s.new_old), "\n".join(s.new))
    assert shuffled == first
    data = json.loads(first.to_json())
    assert list(data["moved"]) == sorted(data["moved"])
    assert list(data["import_origins"]) == sorted(data["import_origins"])


# --------------------------------------------------------------------------- one rule at a time


def test_kinds_privacy_and_staying_names(tmp_path):
    m = _derive(
        tmp_path,
        old="""
            def f(): ...
            class C: ...
            V = 1
            _p: int = 2
            def stays(): ...
            """,
        new_old="def stays(): ...\n",
        new="def f(): ...\nclass C: ...\nV = 1\n_p: int = 3\n",
    )
    assert m.moved == {
        "f": MovedName("function", False), "C": MovedName("class", False),
        "V": MovedName("variable", False), "_p": MovedName("variable", True),
    }
    assert m.destination("stays") is None
    assert not m.reexported and not m.removed and not m.import_origins


def test_name_redefined_in_new_old_module_is_not_moved(tmp_path):
    # A copy left behind means the old import still works and still reaches a definition.
    m = _derive(tmp_path, old="def f(): ...\n", new_old="def f(): ...\n", new="def f(): ...\n")
    assert m.moved == {}


def test_reexport_forms(tmp_path):
    m = _derive(
        tmp_path,
        old="def a(): ...\ndef b(): ...\ndef c(): ...\ndef d(): ...\ndef e(): ...\n",
        new_old="""
            from pkg.sub.news import a
            from pkg.sub.news import b as b
            from .news import c
            from .news import d as renamed
            from pkg.elsewhere import e
            """,
        new="def a(): ...\ndef b(): ...\ndef c(): ...\ndef d(): ...\ndef e(): ...\n",
    )
    assert m.reexported == {"a", "b", "c"}
    assert set(m.moved) == {"a", "b", "c", "d", "e"}


def test_import_only_names_get_their_origin_not_the_new_module(tmp_path):
    m = _derive(
        tmp_path,
        old="""
            from pkg.items import Item, Kept
            from .cache import Cache
            from ..runtime import get_ctx
            from . import sibling_mod
            def f(x: Item): ...
            """,
        new_old="from pkg.items import Kept\n",
        new="from pkg.items import Item\nfrom pkg.sub.cache import Cache\ndef f(x: Item): ...\n",
    )
    assert m.import_origins == {
        "Item": "pkg.items", "Cache": "pkg.sub.cache", "get_ctx": "pkg.runtime", "sibling_mod": "pkg.sub",
    }
    assert set(m.moved) == {"f"}
    assert m.destination("Item") == "pkg.items"


def test_package_init_resolves_relative_imports_against_itself(tmp_path):
    old = _write(tmp_path / "v1", "pkg.sub.__init__", "from .inner import thing\n")
    new_old = _write(tmp_path / "v2", "pkg.sub.__init__", "\n")
    new = _write(tmp_path / "v2", "pkg.other", "x = 1\n")
    m = derive.derive_map(old, [new_old, new], package_root="pkg")
    assert (m.old_module, m.new_module) == ("pkg.sub", "pkg.other")
    assert m.import_origins == {"thing": "pkg.sub.inner"}


def test_unmapped_imports_keep_their_statement(tmp_path):
    m = _derive(
        tmp_path,
        old="import numpy as np\nimport os.path\nfrom .helpers import real as nick\nimport torch\n",
        new_old="import torch\n",
        new="\n",
    )
    assert m.unmapped_imports == {
        "np": "import numpy as np", "os": "import os.path", "nick": "from pkg.sub.helpers import real as nick",
    }
    assert m.import_origins == {}


def test_runtime_invisible_bindings_are_ignored(tmp_path):
    m = _derive(
        tmp_path,
        old="""
            from __future__ import annotations
            from typing import TYPE_CHECKING
            import typing
            if TYPE_CHECKING:
                from pkg.heavy import Heavy
            if typing.TYPE_CHECKING:
                from pkg.heavy import Heavier
            else:
                Fallback = None
            if __name__ == "__main__":
                main_only = 1
            declared_only: int
            __all__ = ["x"]
            def __getattr__(name): ...
            try:
                from pkg.fast import speedy
            except ImportError:
                def speedy(): ...
            """,
        new_old="from typing import TYPE_CHECKING\nimport typing\n",
        new="def speedy(): ...\nFallback = None\n__all__ = []\ndef __getattr__(name): ...\n",
    )
    assert m.moved == {"speedy": MovedName("function", False), "Fallback": MovedName("variable", False)}
    assert "annotations" not in m.import_origins and "Heavy" not in m.import_origins
    assert not m.removed  # declared_only and main_only never existed at import time


def test_removed_names(tmp_path):
    m = _derive(tmp_path, old="def gone(): ...\ndef kept(): ...\n", new_old="def kept(): ...\n", new="\n")
    assert m.removed == {"gone"}
    assert m.destination("gone") is None


def test_rebound_globals(tmp_path):
    m = _derive(
        tmp_path,
        old="cache = None\ncounter = 0\n",
        new_old="\n",
        new="""
            cache = None
            counter = 0
            flag = False
            state = {}
            def init(size):
                global cache
                cache = object()
            class Owner:
                def bump(self):
                    global counter
                    counter += 1
            def only_reads():
                global flag
                return flag
            def mutates():
                global state
                state["k"] = 1
            def via_loop():
                global loop_var
                for loop_var in range(3):
                    pass
            """,
    )
    assert m.rebound_globals == {"cache", "counter", "loop_var"}


def test_old_module_deleted(tmp_path):
    m = _derive(tmp_path, old="def f(): ...\nfrom pkg.x import Y\n", new_old=None, new="def f(): ...\n")
    assert set(m.moved) == {"f"}
    assert m.import_origins == {"Y": "pkg.x"}
    assert m.reexported == frozenset()


def test_star_import_in_old_module_is_noted(tmp_path):
    m = _derive(tmp_path, old="from pkg.base import *\ndef f(): ...\n", new_old="\n", new="def f(): ...\n")
    assert any("star-imports ['pkg.base']" in note for note in m.header["notes"])


def test_header_records_command_and_sources(tmp_path):
    m = _derive(tmp_path, old="def f(): ...\n", new_old="\n", new="def f(): ...\n")
    assert m.header["command"].startswith("mm-schedule-codemod derive --old ")
    assert "--old-module pkg.sub.olds --new-module pkg.sub.news" in m.header["command"]
    roles = [(s["role"], s["module"]) for s in m.header["sources"]]
    assert roles == [("old", OLD), ("new", OLD), ("new", NEW)]


# --------------------------------------------------------------------------- bad input


def test_relative_import_beyond_top_level(tmp_path):
    with pytest.raises(MoveMapError, match=r"olds\.py:1: relative import beyond"):
        _derive(tmp_path, old="from .... import x\n", new_old="\n", new="\n")


def test_syntax_error_names_the_file(tmp_path):
    with pytest.raises(MoveMapError, match=r"news\.py: cannot parse line 1"):
        _derive(tmp_path, old="x = 1\n", new_old="\n", new="def (:\n")


def test_missing_file(tmp_path):
    with pytest.raises(MoveMapError, match="cannot read"):
        derive.derive_map(tmp_path / "no.py", [tmp_path / "b.py"], old_module="a", new_module="b")


def test_module_names_required_without_package_root(tmp_path):
    with pytest.raises(MoveMapError, match="--old-module"):
        derive.derive_map(tmp_path / "a.py", [tmp_path / "b.py"])


def test_package_root_infers_modules_in_any_order(tmp_path):
    old = _write(tmp_path / "v1", OLD, "def f(): ...\n")
    new_old = _write(tmp_path / "v2", OLD, "from .news import f\n")
    new = _write(tmp_path / "v2", NEW, "def f(): ...\n")
    a = derive.derive_map(old, [new_old, new], package_root="pkg")
    b = derive.derive_map(old, [new, new_old], package_root="pkg")
    assert a == b and a.reexported == {"f"} and (a.old_module, a.new_module) == (OLD, NEW)
    with pytest.raises(MoveMapError, match="no directory named 'nothere'"):
        derive.derive_map(old, [new], package_root="nothere")


# --------------------------------------------------------------------------- wheels


def _wheel(path: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, textwrap.dedent(text))
        zf.writestr(f"{dist}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return path


def _two_wheels(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    old = _wheel(folder / "demo-1.0-py3-none-any.whl", "demo", "1.0", {
        "demo/core/util.py": "from demo.types import Item\ndef f(): ...\ndef g(): ...\nstate = None\n",
        "demo/core/other.py": "x = 1\n",
    })
    new = _wheel(folder / "demo-2.0-py3-none-any.whl", "demo", "2.0", {
        "demo/core/util.py": "from .sched import f as f\ndef g(): ...\n",
        "demo/core/sched.py": "def f(): ...\nstate = None\ndef init():\n    global state\n    state = 1\n",
        "demo/types.py": "class Item: ...\n",
    })
    return old, new


def test_from_wheels_paths(tmp_path):
    old, new = _two_wheels(tmp_path)
    m = derive.derive_from_wheels(str(old), str(new), old_module="demo.core.util", new_module="demo.core.sched")
    assert set(m.moved) == {"f", "state"} and m.reexported == {"f"}
    assert m.import_origins == {"Item": "demo.types"} and m.rebound_globals == {"state"}
    assert m.header["command"] == (
        "mm-schedule-codemod derive --from-wheels demo-1.0-py3-none-any.whl demo-2.0-py3-none-any.whl "
        "--old-module demo.core.util --new-module demo.core.sched"
    )
    assert [s["source"] for s in m.header["sources"]] == [
        "demo 1.0: demo/core/util.py", "demo 2.0: demo/core/util.py", "demo 2.0: demo/core/sched.py",
    ]


def test_history_records_when_each_module_bound_each_name(tmp_path):
    old, new = _two_wheels(tmp_path)
    early = _wheel(tmp_path / "demo-0.9-py3-none-any.whl", "demo", "0.9", {
        "demo/core/util.py": "def f(): ...\ndef g(): ...\ndef h(): ...\n"})
    later = _wheel(tmp_path / "demo-3.0-py3-none-any.whl", "demo", "3.0", {
        "demo/core/util.py": "def g(): ...\ndef h(): ...\n", "demo/core/sched.py": "state = None\n"})
    m = derive.derive_from_wheels(str(old), str(new), old_module="demo.core.util",
                                  new_module="demo.core.sched",
                                  history=[str(w) for w in (early, old, new, later)])
    assert m.releases == ("0.9", "1.0", "2.0", "3.0")
    assert m.lifetimes["old_module"]["h"] == (("0.9", "0.9"), ("3.0", "3.0"))
    assert m.lifetimes["old_module"]["f"] == (("0.9", "2.0"),)  # re-exported in 2.0
    assert m.lifetimes["new_module"]["f"] == (("2.0", "2.0"),)
    assert "--history demo-0.9-py3-none-any.whl" in m.header["command"]
    digest = m.header["history_sha256"]
    assert len(digest) == 64
    _wheel(later, "demo", "3.0", {"demo/core/util.py": "def g(): ...\n"})
    assert derive.derive_from_wheels(str(old), str(new), old_module="demo.core.util",
                                     new_module="demo.core.sched",
                                     history=[str(w) for w in (early, old, new, later)]
                                     ).header["history_sha256"] != digest
    aimed = m.for_target("3.0")  # f left the new module again: nothing to rewrite it to
    assert "f" not in aimed.moved and "f" in aimed.removed and "h" not in aimed.removed
    assert "which had it last in demo 2.0 (gone since 3.0)" in aimed.earlier["f"]
    with pytest.raises(MoveMapError, match=r"lists a release twice: \['1.0'\]"):
        derive.derive_from_wheels(str(old), str(new), old_module="demo.core.util",
                                  new_module="demo.core.sched", history=[str(old), str(old)])


def _serve_ranges(folder: Path):
    """A PEP 691 index of the wheels in ``folder`` that answers range requests, and the
    number of requests it answered."""
    import http.server
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _body(self) -> bytes:
            if self.path.startswith("/simple/"):
                files = [{"filename": w.name, "url": f"http://127.0.0.1:{server.server_port}/{w.name}"}
                         for w in sorted(folder.glob("*.whl"))]
                return json.dumps({"files": files}).encode()
            return (folder / self.path.lstrip("/")).read_bytes()

        def do_HEAD(self):
            body = self._body()
            self.send_response(200)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()

        def do_GET(self):
            seen.append(self.path)
            body = self._body()
            start, _, end = self.headers.get("Range", "bytes=0-").removeprefix("bytes=").partition("-")
            part = body[int(start): int(end or len(body) - 1) + 1]
            self.send_response(206 if "Range" in self.headers else 200)
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            self.wfile.write(part)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_history_pins_are_read_off_the_index_one_file_at_a_time(tmp_path):
    """A pin not in the cache: only the module's file is fetched (range requests), kept in
    the cache, and read from there the next time; a release without the module is None."""
    _two_wheels(tmp_path / "index")
    server, seen = _serve_ranges(tmp_path / "index")
    cache = tmp_path / "cache"
    try:
        index = f"http://127.0.0.1:{server.server_port}/simple"
        got = sources.release_source("demo==2.0", "demo.core.sched", cache, index)
        assert got.text.startswith("def f(): ...") and got.origin == "demo 2.0: demo/core/sched.py"
        assert sources.release_source("demo==1.0", "demo.core.sched", cache, index) is None
        asked = len(seen)
        assert sources.release_source("demo==2.0", "demo.core.sched", cache, index) == got
        assert len(seen) == asked  # from the cache now
    finally:
        server.shutdown()
    assert not list(cache.glob("*.whl"))  # no wheel was downloaded


def test_from_wheels_pinned_requirement_uses_the_cache(tmp_path):
    _two_wheels(tmp_path / "cache")
    m = derive.derive_from_wheels(
        "demo==1.0", "demo==2.0", old_module="demo.core.util", new_module="demo.core.sched",
        cache=tmp_path / "cache",
    )
    assert "--from-wheels demo==1.0 demo==2.0" in m.header["command"]
    assert set(m.moved) == {"f", "state"}


def test_source_tarball_is_read_too(tmp_path):
    import io
    import tarfile

    sdist = tmp_path / "demo-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for member, text in {
            "demo-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
            "demo-1.0/python/demo/core/util.py": "def f(): ...\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    source = sources.read_archive_source(sdist, "demo.core.util")
    assert source.origin == "demo 1.0: demo-1.0/python/demo/core/util.py"
    assert source.text == "def f(): ...\n" and source.package == "demo.core"


def test_from_wheels_errors(tmp_path):
    old, new = _two_wheels(tmp_path)
    with pytest.raises(MoveMapError, match=r"has no file for module 'demo\.core\.absent'"):
        derive.derive_from_wheels(str(old), str(new), old_module="demo.core.absent", new_module="demo.core.sched")
    with pytest.raises(MoveMapError, match="neither an existing file nor a pinned requirement"):
        sources.fetch_archive("demo>=1", cache=tmp_path)
    text = tmp_path / "notes.txt"
    text.write_text("x")
    with pytest.raises(MoveMapError, match="not a wheel"):
        sources.read_archive_source(text, "demo")


# --------------------------------------------------------------------------- CLI


def _cli_files(tmp_path: Path) -> list[str]:
    old = _write(tmp_path / "v1", OLD, "def f(): ...\ndef g(): ...\n")
    new_old = _write(tmp_path / "v2", OLD, "def g(): ...\n")
    new = _write(tmp_path / "v2", NEW, "def f(): ...\n")
    return ["--old", str(old), "--new", str(new_old), str(new), "--old-module", OLD, "--new-module", NEW]


def test_cli_writes_the_same_map_as_the_api(tmp_path, capsys):
    args = _cli_files(tmp_path)
    out = tmp_path / "map.json"
    assert derive_cli.main([*args, "-o", str(out)]) == 0
    api = derive.derive_map(args[1], args[3:5], old_module=OLD, new_module=NEW)
    assert out.read_text() == api.to_json()
    assert derive_cli.main(["derive", *args]) == 0  # as dispatched by the umbrella CLI
    assert capsys.readouterr().out == api.to_json()


@pytest.mark.parametrize("where", ["missing_folder", "under_a_file", "a_folder"])
def test_cli_refuses_an_output_it_cannot_write_before_deriving(tmp_path, capsys, monkeypatch,
                                                              where):
    args = _cli_files(tmp_path)
    (tmp_path / "plain.txt").write_text("")
    out, reason = {"missing_folder": (tmp_path / "no" / "m.json", f"{tmp_path / 'no'} does not exist"),
                   "under_a_file": (tmp_path / "plain.txt" / "m.json",
                                    f"{tmp_path / 'plain.txt'} is not a folder"),
                   "a_folder": (tmp_path, "is a folder")}[where]
    monkeypatch.setattr(derive_cli, "derive_map", lambda *a, **k: pytest.fail("derived anyway"))
    with pytest.raises(SystemExit) as exit_info:
        derive_cli.main([*args, "-o", str(out)])
    assert exit_info.value.code == 3  # a usage error, as for the migration command: nothing touched
    assert f"error: -o {out}: {reason}\n" in capsys.readouterr().err


def test_cli_reports_a_failed_write_and_leaves_no_temporary_file(tmp_path, capsys, monkeypatch):
    args = _cli_files(tmp_path)
    out = tmp_path / "map.json"

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(derive_cli.os, "replace", disk_full)
    assert derive_cli.main([*args, "-o", str(out)]) == 2
    assert f"error: cannot write {out}: No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1", "v2"]


def test_cli_check_reports_drift(tmp_path, capsys):
    args = _cli_files(tmp_path)
    checked = tmp_path / "checked.json"
    assert derive_cli.main([*args, "-o", str(checked)]) == 0
    assert derive_cli.main([*args, "--check", str(checked)]) == 0
    # A header-only difference is not drift.
    data = json.loads(checked.read_text())
    data["header"]["command"] = "edited"
    checked.write_text(json.dumps(data))
    assert derive_cli.main([*args, "--check", str(checked)]) == 0
    # A content difference is: the map lists a name the sources no longer move.
    data["moved"]["g"] = {"kind": "function", "private": False}
    checked.write_text(json.dumps(data))
    capsys.readouterr()
    assert derive_cli.main([*args, "--check", str(checked)]) == 1
    captured = capsys.readouterr()
    assert '-    "g": {' in captured.out
    assert "drift" in captured.err


def test_cli_input_errors_exit_3_like_the_migration_command(tmp_path, capsys):
    """Unreadable inputs and bad options are usage errors (status 3: nothing was written),
    the migration command's numbering; a failed write of the result is status 2."""
    args = _cli_files(tmp_path)
    assert derive_cli.main([*args, "--check", str(tmp_path / "missing.json")]) == 3
    assert "cannot read move map" in capsys.readouterr().err
    assert derive_cli.main(["--old", str(tmp_path / "none.py"), "--new", "b.py", "--old-module", "a",
                        "--new-module", "b"]) == 3
    with pytest.raises(SystemExit) as info:
        derive_cli.main(["--old", "a.py"])
    assert info.value.code == 3


def test_runs_as_a_module(tmp_path):
    args = _cli_files(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "mm_schedule.codemods.movemap.derive_cli", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert MoveMap.from_dict(json.loads(proc.stdout)).moved == {"f": MovedName("function", False)}


# --------------------------------------------------------------------------- the shipped map


@pytest.mark.realworld
def test_shipped_sglang_map_is_exactly_what_derive_produces():
    rw = realworld_helpers()
    old, new = rw.sglang_wheel("0.5.17"), rw.sglang_wheel("0.5.18")
    assert old.is_file() and new.is_file()
    shipped = load_map(aimed=False)
    history = shipped.header["command"].split("--history ")[1].split()
    assert history[0] == "sglang==0.4.4.post2" and history[-1] == "sglang==0.5.23"
    m = derive.derive_from_wheels("sglang==0.5.17", "sglang==0.5.18", history=history,
                                  cache=rw.wheel_cache())
    assert m.to_json() == shipped.to_json()
    # 0.5.18's own embed_mm_inputs (in mm_utils) calls get_embedding_and_mask through
    # mm_utils' globals, so patching it there still reaches that caller
    assert m.looked_up_in["get_embedding_and_mask"] == ("sglang.srt.managers.mm_utils",)
    assert m.header["split_version"] == "0.5.18" and "target_version" not in m.header
    assert m.releases == tuple(h.split("==")[1] for h in history)
    # renamed to init_mm_embedding_cache in 0.5.5.post1
    assert m.lifetimes["old_module"]["init_embedding_cache"] == (("0.4.6.post5", "0.5.5"),)
    assert m.lifetimes["new_module"]["_acknowledge_deferred_cuda_ipc_cache_hits"] == (
        ("0.5.18", "0.5.21"),)
    # The facts the SGLang split is known for (reference, section 1.2/1.3).
    assert len(m.moved) == 20 and sum(v.private for v in m.moved.values()) == 14
    assert m.reexported == {"DataEmbeddingFunc", "get_embedding_and_mask", "init_mm_embedding_cache"}
    assert m.rebound_globals == {"embedding_cache"}
    assert m.import_origins["MultimodalDataItem"] == "sglang.srt.managers.schedule_batch"


# --------------------------------------------------------------------------- releases far apart


def _source(module: str, text: str, origin: str) -> sources.Source:
    return sources.Source(module=module, text=textwrap.dedent(text), is_package=False, origin=origin)


def test_names_that_moved_again_or_vanished_between_distant_releases_are_not_rewritten():
    """Between non-adjacent releases a name the new module only imports has its home
    where that import reads from, and an import-only name whose origin no longer has it
    in the newer release is removed (a finding), not sent to a module that lacks it."""
    old = _source(OLD, """
        from pkg.items import Item, Gone
        from pkg.helpers import helper
        def f(): ...
        def g(): ...
        """, "pkg 1.0: old")
    new = _source(NEW, """
        from pkg.elsewhere import g
        def f(): ...
        """, "pkg 3.0: new")
    newer_release = {("pkg.items", "Item"), ("pkg.helpers", "helper")}
    m = derive.classify(old, _source(OLD, "x = 1\n", "pkg 3.0: old"), new, {},
                        release_binds=lambda module, name: (module, name) in newer_release)
    assert set(m.moved) == {"f"}
    assert m.import_origins == {"g": "pkg.elsewhere", "Item": "pkg.items", "helper": "pkg.helpers"}
    assert m.removed == {"Gone"}
    # without the newer release to check against, the old origin is trusted
    trusting = derive.classify(old, _source(OLD, "x = 1\n", "pkg 3.0: old"), new, {})
    assert trusting.import_origins["Gone"] == "pkg.items"


def test_reexported_names_record_where_they_are_looked_up(tmp_path):
    m = _derive(
        tmp_path,
        old="def a(): ...\ndef b(): ...\ndef c(): ...\n",
        new_old=f"from {NEW} import a, b, c\ndef caller():\n    return a()\n",
        new="def a(): ...\ndef b(): ...\ndef c(): ...\ndef user():\n    return b()\n",
    )
    assert m.reexported == {"a", "b", "c"}
    assert m.looked_up_in == {"a": (OLD,), "b": (NEW,), "c": ()}


@pytest.mark.realworld
@pytest.mark.parametrize("old_version", ["0.4.6", "0.5.9"])
def test_maps_between_distant_sglang_releases_only_rewrite_to_homes_that_exist(old_version):
    """Every rewrite target of a map from an old release straight to 0.5.18 is checked
    against the 0.5.18 wheel itself; every name the old module bound that 0.5.18's
    module no longer binds is accounted for (moved, sent to a checked origin, or reported)."""
    import ast

    rw = realworld_helpers()
    old_wheel, new_wheel = rw.sglang_wheel(old_version), rw.sglang_wheel("0.5.18")
    m = derive.derive_from_wheels(str(old_wheel), str(new_wheel))

    def top_level(module: str) -> set[str] | None:
        try:
            text = sources.read_archive_source(new_wheel, module).text
        except MoveMapError:
            return None
        names = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                return None  # cannot tell
        return names

    new_module = top_level(derive.SGLANG_NEW_MODULE)
    for name in m.moved:
        assert name in new_module, f"{name} is claimed moved but 0.5.18's mm_schedule lacks it"
    for name, origin in m.import_origins.items():
        if origin.startswith("sglang."):
            bound = top_level(origin)
            assert bound is None or name in bound, f"{name} is sent to {origin}, which lacks it in 0.5.18"
    before = bindings.scan(sources.read_archive_source(old_wheel, derive.SGLANG_OLD_MODULE))
    still = top_level(derive.SGLANG_OLD_MODULE)
    accounted = set(m.moved) | set(m.import_origins) | set(m.removed) | set(m.unmapped_imports)
    for name in set(before.defined) | set(before.imported):
        if not name.startswith("__") and name not in still:
            assert name in accounted, f"{name} vanished from mm_utils and the map says nothing"
