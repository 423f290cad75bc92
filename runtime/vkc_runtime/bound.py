"""Bound calls: replay a validated op call without validating it again, while every fact validation read holds.

An op validates its inputs (dtypes, shapes, strides, alignment, devices, int32 ranges), picks its kernels and
turns the call into :class:`Launch` records. :meth:`CallCache.launch` runs them and records a *bound call*:
the launches with their arguments packed once, plus the facts the validation was a function of. The next
call of the op under the same key (what selects its code path besides the tensors: option values, workspace
objects) tries :meth:`CallCache.run` first; a bound call replays only if every fact still holds:

================  ==========================================================================================
re-checked        how (:class:`PyBoundCall.run` here; ``BoundCall::run`` in ``csrc/launcher.cpp`` the same)
================  ==========================================================================================
tensors           per :class:`TensorGuard`: exact Python type, ``is_cuda is True``, ``get_device()``, ``dtype``
                  (identity), ``shape``, ``stride()``, and ``data_ptr() % align == 0`` with the alignment the
                  validated pointer had (capped at 16: every alignment check of the ops asks for <= 16)
scalars           exact type and value (``eps``, ``scale``, ...; floats compare by value)
CUDA context      the current context is the one the kernels were loaded in
pointer relations per :class:`Relation`: two tensors' byte spans disjoint, or one pointer, as validation found
================  ==========================================================================================

Why that is enough: every check an op does, and every kernel choice it makes, is a function of the key,
those facts and the kernels' manifest data (a pointer with at least the recorded alignment passes every
alignment check the recorded one passed). A replay therefore launches what validation would have -- the
same kernels, grids and scalar arguments, with the new pointers patched in (:class:`Patch`) -- and a
difference in any fact makes ``run`` return False with no side effect, so the op validates again (with
the same errors). What is *not* re-checked is what validation does not read either: device data (block
tables, lengths) and the stream (global scratch does not depend on it: :mod:`vkc_runtime.scratch`).

Only torch (or torch-like: ``data_ptr``/``shape``/``stride()``/``dtype``/``is_cuda``/``get_device``) tensors
are guarded; calls with other inputs (cupy, DLPack, DeviceArray) always validate. ``VKC_FASTPATH=0``
turns bound calls off.

Two implementations of one contract: ``_native.BoundCall`` (C++, the path when the native launcher is used
and every kernel is a native-launched :class:`~vkc_runtime.loaders.triton_cubin.Kernel`) and
:class:`PyBoundCall` (the fallback without the native module, for kernels that are not Kernel objects --
the tests' recorders -- and the oracle the tests compare the native one against). ARCHITECTURE.md, "Bound
calls", has the decision to keep them.
"""
from __future__ import annotations

import os
import weakref
from typing import Any, NamedTuple

from . import driver
from .interop import torch_source
from .loaders.triton_cubin import Kernel
from .native import NATIVE, native_available
from .tensor import TensorRef

__all__ = ["Launch", "Compared", "disjoint", "same", "TensorGuard", "Relation", "Patch", "BoundLaunch", "PyBoundCall",
           "bind_call", "run_launches", "CallCache", "fastpath_enabled", "clear_bound_calls", "MAX_SLOTS"]

MAX_SLOTS = 16  # tensors per bound call (the native BoundCall's fixed pointer array)
DISJOINT, SAME = 0, 1
_RELATION_KINDS = {"disjoint": DISJOINT, "same": SAME}


class Launch(NamedTuple):
    """One kernel launch of an op: ``args`` are the visible arguments, a :class:`TensorRef` standing for its
    pointer; ``scratch`` the launch's global scratch (a workspace's GlobalScratch; None: the default)."""
    kernel: Any
    grid: Any
    args: tuple
    scratch: Any = None


class Compared(NamedTuple):
    """Two of a call's slots (TensorRefs) whose pointers validation compared, as an op states it: ``kind``
    "disjoint" (byte spans do not overlap) or "same" (one pointer). :func:`bind_call` turns it into a
    :class:`Relation` that every replay re-checks."""
    kind: str
    a: TensorRef
    b: TensorRef


def disjoint(a: TensorRef, b: TensorRef) -> Compared:
    return Compared("disjoint", a, b)


def same(a: TensorRef, b: TensorRef) -> Compared:
    return Compared("same", a, b)


class TensorGuard(NamedTuple):
    """What a replay re-reads from one tensor and compares (field order = the native BoundCall's slot tuple)."""
    type: type
    shape: tuple
    strides: tuple
    dtype: Any
    device: int
    align: int


class Relation(NamedTuple):
    """Two guarded tensors' pointers as validation compared them (field order = the native relation tuple):
    ``kind`` DISJOINT (byte spans [ptr, ptr + span) do not overlap) or SAME (one pointer)."""
    kind: int
    i: int
    j: int
    span_i: int
    span_j: int


class Patch(NamedTuple):
    """Visible argument ``arg`` of a launch takes the current pointer of guarded tensor ``slot``."""
    arg: int
    slot: int


class BoundLaunch(NamedTuple):
    """A launch of a bound call: ``args`` resolved at bind time, ``patches`` overwritten on every replay,
    ``scratch`` the launch's global scratch source as at bind time."""
    kernel: Any
    grid: Any
    args: tuple
    patches: list
    scratch: Any = None


def fastpath_enabled() -> bool:
    return os.environ.get("VKC_FASTPATH", "1").strip() != "0"


def _as_launch(item) -> Launch:
    if type(item) is not Launch:
        raise TypeError(f"launches are vkc_runtime.bound.Launch records, got {type(item).__name__}")
    return item


def _resolve(args) -> tuple:
    return tuple([a.ptr if type(a) is TensorRef else a for a in args])


def _launch(kernel, grid, args, stream: int, scratch) -> None:
    if scratch is None:
        kernel.launch(grid, args, stream)
    else:
        kernel.launch(grid, args, stream, scratch=scratch)


def run_launches(launches, stream: int) -> None:
    """Run :class:`Launch` records in order."""
    for item in launches:
        k, grid, args, scratch = _as_launch(item)
        _launch(k, grid, _resolve(args), stream, scratch)


def _guard(ref: TensorRef) -> TensorGuard | None:
    src = torch_source(ref)
    if src is None or ref.device < 0:
        return None
    p = ref.ptr
    align = 16
    while align > 1 and p % align:
        align //= 2
    return TensorGuard(type(src), tuple(ref.shape), tuple(ref.strides), src.dtype, ref.device, align)


def _span(ref: TensorRef) -> int:
    """Bytes from the first to one past the last element of ``ref`` (0 when empty)."""
    if any(n == 0 for n in ref.shape):
        return 0
    return (sum((n - 1) * abs(st) for n, st in zip(ref.shape, ref.strides)) + 1) * ref.itemsize


class PyBoundCall:
    """A bound call in Python (the contract is in the module docstring; ``_native.BoundCall`` implements the
    same in C++)."""

    def __init__(self, ctx: int, guards: list[TensorGuard], scalars: tuple, launches: list[BoundLaunch],
                 relations: list[Relation] = ()):
        self.ctx, self.guards, self.scalars, self.launches = ctx, guards, scalars, launches
        self.relations = list(relations)
        self.hits = 0

    def _pointers(self, tensors, scalars) -> list[int] | None:
        """The tensors' current pointers when every guarded fact holds, else None."""
        if len(tensors) != len(self.guards) or len(scalars) != len(self.scalars):
            return None
        try:
            for a, b in zip(scalars, self.scalars):                                    # scalars
                if a is not b and (type(a) is not type(b) or not bool(a == b)):
                    return None
            if self.ctx and driver.current_context() != self.ctx:                      # CUDA context
                return None
            ptrs = []
            for t, g in zip(tensors, self.guards):                                     # tensors
                if (type(t) is not g.type or t.is_cuda is not True or t.get_device() != g.device
                        or t.dtype is not g.dtype or tuple(t.shape) != g.shape or tuple(t.stride()) != g.strides):
                    return None
                p = t.data_ptr()
                if type(p) is not int or p < 0 or p % g.align:
                    return None
                ptrs.append(p)
        except Exception:  # a property or comparison that raised: the op's validation names it
            return None
        for r in self.relations:                                                       # pointer relations
            a, b = ptrs[r.i], ptrs[r.j]
            if (a != b) if r.kind == SAME else (a < b + r.span_j and b < a + r.span_i):
                return None
        return ptrs

    def run(self, tensors, scalars, stream) -> bool:
        ptrs = self._pointers(tensors, scalars)
        if ptrs is None:
            return False
        self.hits += 1
        for bl in self.launches:
            a = list(bl.args)
            for p in bl.patches:
                a[p.arg] = ptrs[p.slot]
            _launch(bl.kernel, bl.grid, tuple(a), stream, bl.scratch)
        return True


def bind_call(slots, scalars: tuple, launches, stream: int, relations=()):
    """A bound call for launches just made from validated inputs, or None when the call cannot be bound.

    ``slots``: the call's tensor arguments as the op read them (TensorRefs, in the order :meth:`CallCache.run`
    will get the objects); ``scalars``: host values the op's choices depended on; ``launches``: the
    :class:`Launch` records given to :func:`run_launches` -- a TensorRef among ``args`` that is one of
    ``slots`` (by identity) becomes a :class:`Patch`, any other value is fixed; ``relations``:
    :class:`Compared` records (:func:`disjoint`, :func:`same`) for two slots whose pointers validation
    compared."""
    if not fastpath_enabled():
        return None
    guards = []
    for r in slots:
        g = _guard(r)
        if g is None:
            return None
        guards.append(g)
    index = {id(r): i for i, r in enumerate(slots)}
    if len(index) != len(slots) or len(slots) > MAX_SLOTS:
        return None
    rels = []
    for rel in relations:
        if type(rel) is not Compared:
            raise TypeError(f"relations are vkc_runtime.bound.Compared records, got {type(rel).__name__}")
        kind, a, b = rel
        if id(a) not in index or id(b) not in index:
            return None
        rels.append(Relation(_RELATION_KINDS[kind], index[id(a)], index[id(b)], _span(a), _span(b)))
    bound = []
    for item in launches:
        k, grid, args, scratch = _as_launch(item)
        patches = [Patch(i, index[id(a)]) for i, a in enumerate(args) if type(a) is TensorRef and id(a) in index]
        bound.append(BoundLaunch(k, grid, _resolve(args), patches, scratch))
    kernels = [b.kernel for b in bound]
    if NATIVE is not None and native_available() and all(type(k) is Kernel and k.native for k in kernels):
        ctxs = {k.ctx for k in kernels}
        if len(ctxs) > 1:
            return None
        native_launches = []
        for b in bound:
            lau, gx, gy, gz, sp = b.kernel.bind(b.grid, stream, b.scratch)
            native_launches.append((lau, gx, gy, gz, b.args, list(b.patches), sp))
        # stream -1: the native BoundCall replays on any stream (scratch pointers do not depend on it)
        return NATIVE.BoundCall(ctxs.pop() if ctxs else 0, guards, tuple(scalars), native_launches, -1, rels)
    ctx = kernels[0].ctx if kernels and all(type(k) is Kernel for k in kernels) else 0
    return PyBoundCall(ctx, guards, tuple(scalars), bound, rels)


_call_caches: "weakref.WeakSet[CallCache]" = weakref.WeakSet()


class CallCache:
    """Bound calls of one op, a few per key (most recent first); the key holds what selects the op's code path
    besides the tensors (option values, workspace objects -- kept alive by the key, so identity is safe)."""

    def __init__(self, per_key: int = 4, max_keys: int = 64):
        self.per_key, self.max_keys = per_key, max_keys
        self._calls: dict = {}
        _call_caches.add(self)

    def run(self, key, tensors: tuple, scalars: tuple, stream: int) -> bool:
        """Replay a bound call recorded under ``key`` whose facts hold for ``tensors``/``scalars``."""
        try:
            calls = self._calls.get(key)
        except TypeError:  # an unhashable option value: never bound, the op validates (and names what is wrong)
            return False
        if calls:
            for c in calls:
                if c.run(tensors, scalars, stream):
                    return True
        return False

    def launch(self, key, slots, scalars: tuple, launches, stream: int, relations=()) -> None:
        """:func:`run_launches`, then record them as a bound call under ``key`` (``slots`` None: do not bind,
        e.g. the op allocated its output)."""
        run_launches(launches, stream)
        if slots is not None:
            self.record(key, slots, scalars, launches, stream, relations)

    def record(self, key, slots, scalars: tuple, launches, stream: int, relations=()) -> None:
        try:
            hash(key)
        except TypeError:
            return
        c = bind_call(slots, scalars, launches, stream, relations)
        if c is None:
            return
        calls = self._calls.get(key)
        if calls is None:
            if len(self._calls) >= self.max_keys:
                self._calls.clear()
            calls = self._calls[key] = []
        calls.insert(0, c)
        del calls[self.per_key:]

    def clear(self) -> None:
        self._calls.clear()

    @property
    def hits(self) -> int:
        """Replays so far by the bound calls currently held."""
        return sum(c.hits for calls in self._calls.values() for c in calls)


def clear_bound_calls() -> None:
    """Forget every recorded bound call (the next call of each op validates again)."""
    for c in list(_call_caches):
        c.clear()
