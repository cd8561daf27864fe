"""The interpreter tests run in one pytest child process, with TRITON_INTERPRET=1 set there only.

Triton decides at `@triton.jit` time whether a kernel is compiled or interpreted, so the variable
must be set before `kernels.*` is imported, and whatever process imports them that way keeps
interpreted kernels for good. Setting it here for the whole test run (as this file once did)
would make a CUDA test later in the same run interpret its kernels without a word.

So, in an ordinary run (TRITON_INTERPRET unset), each module of INTERPRETER_MODULES is collected
as one item; the first of them to run starts a single `python -m pytest MODULE...` child for
every such module collected in this run (one interpreter start, one import of torch and triton,
not one per module), whose environment has TRITON_INTERPRET=1, and each item then passes or
fails with its own module's part of the child's JUnit report. Inside that child (or any run
started with TRITON_INTERPRET=1) the modules are collected as usual, test by test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # `kernels` and `engine` importable without an editable install
    sys.path.insert(0, ROOT)

# the modules that run the Triton kernels on CPU tensors
INTERPRETER_MODULES = (
    "test_kernel_store_kv.py",
    "test_kernel_decode_attention.py",
    "test_kernel_extend_attention.py",
    "test_kernel_backend.py",
    "test_kernel_engine_e2e.py",
    "test_kernel_warmup.py",
    "test_kernel_fused_ops.py",
)
CHILD_TIMEOUT_S = 1200  # all the modules, on a shared 2-core machine


def in_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class InterpreterFailure(Exception):
    """The child pytest failed for a module; the message is its part of the report."""


@dataclass
class ModuleResult:
    passed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass
class ChildRun:
    """The one child pytest of this run: its exit code, output and results per module."""

    returncode: int
    output: str
    modules: dict[str, ModuleResult]


def _module_of(classname: str) -> str | None:
    parts = classname.split(".")
    return next((f"{p}.py" for p in parts if f"{p}.py" in INTERPRETER_MODULES), None)


def run_child(paths: list[str]) -> ChildRun:
    """`python -m pytest PATHS` under TRITON_INTERPRET=1, read back from its JUnit XML."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *paths]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
            return ChildRun(-1, f"timed out after {CHILD_TIMEOUT_S}s\n{(out or '')[-4000:]}", {})
        modules = {os.path.basename(p): ModuleResult() for p in paths}
        if os.path.exists(junit):
            for case in ET.parse(junit).getroot().iter("testcase"):
                name = _module_of(case.get("classname", ""))
                if name not in modules:
                    continue
                res, bad = modules[name], case.find("failure")
                if bad is None:
                    bad = case.find("error")
                if bad is not None:
                    res.failures.append(f"{case.get('name')}: {bad.get('message', '')}\n"
                                        f"{(bad.text or '')[-3000:]}")
                elif case.find("skipped") is not None:
                    res.skipped += 1
                else:
                    res.passed += 1
    return ChildRun(proc.returncode, proc.stdout[-6000:] + proc.stderr[-2000:], modules)


class InterpretedModule(pytest.File):
    """A test module run in the child pytest under TRITON_INTERPRET=1."""

    def collect(self):
        item = InterpretedRun.from_parent(self, name="under_TRITON_INTERPRET")
        item.add_marker(pytest.mark.heavy)
        yield item


_CHILD: dict[str, ChildRun] = {}


class InterpretedRun(pytest.Item):
    def runtest(self) -> None:
        if "run" not in _CHILD:
            paths = [str(it.path) for it in self.session.items if isinstance(it, InterpretedRun)]
            _CHILD["run"] = run_child(paths)
        child = _CHILD["run"]
        res = child.modules.get(self.path.name)
        if res is None or child.returncode not in (0, 1):  # 1: some test failed, seen below
            raise InterpreterFailure(f"TRITON_INTERPRET=1 pytest exited {child.returncode}:\n"
                                     f"{child.output}")
        self.user_properties.append(("child", f"{res.passed} passed, {res.skipped} skipped"))
        if res.failures:
            raise InterpreterFailure(f"TRITON_INTERPRET=1 pytest {self.path.name}: "
                                     f"{len(res.failures)} failed\n" + "\n".join(res.failures))
        if res.passed == 0:  # nothing ran: a failure too
            raise InterpreterFailure(f"TRITON_INTERPRET=1 pytest {self.path.name} ran no test:\n"
                                     f"{child.output}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, InterpreterFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.path.name} in the child pytest under TRITON_INTERPRET=1"


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name in INTERPRETER_MODULES and not in_interpreter():
        return InterpretedModule.from_parent(parent, path=module_path)
    return None


@pytest.fixture(autouse=True)
def _interpreter_does_not_leak():
    """No test here may leave TRITON_INTERPRET set behind it in this process."""
    before = os.environ.get("TRITON_INTERPRET")
    yield
    assert os.environ.get("TRITON_INTERPRET") == before, "a test changed TRITON_INTERPRET"
