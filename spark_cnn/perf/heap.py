"""Page faults of a forward: glibc's allocator replayed over a model's layers.

glibc's malloc (the CPU allocator under torch) maps an allocation at or above its mmap threshold afresh,
so every page of it faults when written, and returns it on free; smaller ones come from the heap, which
grows (new pages fault) and is trimmed back to the kernel whenever its free top exceeds the trim threshold.
Both thresholds move: freeing a mapped chunk of up to 32 MiB raises the mmap threshold to its size and the
trim threshold to twice that. Which tensors fault therefore depends on their sizes and lifetimes, so the
model replays a forward's allocations through a reduced allocator and charges each layer the bytes that
faulted while it ran. Lifetimes come from the layers' shapes (LayerCost has no edges): a layer reads the
most recent tensor of its input shape, plus, when it reads more bytes than that (add, mul, cat), the
tensors that a residual, a squeeze-excitation or a concatenation would (see resolve_inputs).

The sidecar starts with malloc settings that keep freed memory (`spark_cnn.task.sidecar_env`): `retained=True`
replays such a heap, which stops faulting once it has grown to the batch's peak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from spark_cnn.perf.layers import LayerCost

__all__ = ["GLIBC_TOP_PAD", "PAGE_BYTES", "Heap", "faulted_bytes", "resolve_inputs"]

PAGE_BYTES = 4096
GLIBC_MMAP_THRESHOLD_MIN = 128 << 10   # DEFAULT_MMAP_THRESHOLD_MIN: where the dynamic thresholds start
GLIBC_TOP_PAD = 128 << 10              # DEFAULT_TOP_PAD: kept mapped above the top when the heap is trimmed
# Forwards replayed: the thresholds and the heap settle by the third; the last one's faults are charged.
REPLAYED_FORWARDS = 3
_MERGES = {"add", "cat", "stack"}
# Ops taken to write in place when their output has their input's shape, as torchvision's do
# (ReLU(inplace=True), `out += identity`): no new tensor.
_IN_PLACE = {"relu", "relu6", "hardtanh", "clamp", "clamp_min", "hardswish", "hardsigmoid", "silu", "add",
             "leaky_relu"}


class Heap:
    """glibc's main arena reduced to what decides page faults: best-fit free chunks, a top that grows and is
    trimmed, and the dynamic mmap and trim thresholds. Addresses are byte offsets; `faulted` counts bytes."""

    def __init__(self, max_mmap_threshold: int, *, settled: bool = True, retained: bool = False):
        self.max_mmap_threshold = max_mmap_threshold
        self.mmap_threshold = self.trim_threshold = GLIBC_MMAP_THRESHOLD_MIN
        if settled:  # a process that has freed a large mapped chunk (loading a model does): thresholds at the top
            self.mmap_threshold, self.trim_threshold = max_mmap_threshold, 2 * max_mmap_threshold
        if retained:  # SIDECAR_MALLOC_ENV: no mmap, no trim, fixed thresholds
            self.max_mmap_threshold = self.mmap_threshold = self.trim_threshold = math.inf
        self.chunks: list[list] = []  # [start, size, free], in address order, ending at self.top
        self.top = 0                  # where the free top region starts
        self.mapped = 0               # pages below this are resident
        self.faulted = 0

    def malloc(self, size: int) -> list:
        """A free chunk (best fit) if one is large enough, else the top if its mapped part is, else a fresh
        mapping when `size` is at least the mmap threshold, else a top grown into fresh pages."""
        size = max(int(size), 1)
        fits = [c for c in self.chunks if c[2] and c[1] >= size]
        if fits:
            chunk = min(fits, key=lambda c: c[1])
            index = self.chunks.index(chunk)
            if chunk[1] > size:
                self.chunks.insert(index + 1, [chunk[0] + size, chunk[1] - size, True])
            chunk[1], chunk[2] = size, False
            return chunk
        if size >= self.mmap_threshold and self.mapped - self.top < size:
            self.faulted += size
            return [None, size, False]
        chunk = [self.top, size, False]
        self.chunks.append(chunk)
        self.top += size
        if self.top > self.mapped:
            self.faulted += self.top - self.mapped
            self.mapped = self.top
        return chunk

    def free(self, chunk: list) -> None:
        if chunk[0] is None:  # a mapped chunk: unmapped, and the thresholds may rise to its size, which
            # (request + header, rounded up to a page) exceeds the request: the same request comes from the heap
            mapped = -(-(chunk[1] + 16) // PAGE_BYTES) * PAGE_BYTES
            if self.mmap_threshold < mapped <= self.max_mmap_threshold:
                self.mmap_threshold, self.trim_threshold = mapped, 2 * mapped
            return
        chunk[2] = True
        index = self.chunks.index(chunk)
        if index + 1 < len(self.chunks) and self.chunks[index + 1][2]:
            chunk[1] += self.chunks.pop(index + 1)[1]
        if index > 0 and self.chunks[index - 1][2]:
            self.chunks[index - 1][1] += self.chunks.pop(index)[1]
        while self.chunks and self.chunks[-1][2]:
            self.top = self.chunks.pop()[0]
        if self.mapped - self.top >= self.trim_threshold:
            self.mapped = self.top + GLIBC_TOP_PAD


class _Tensor:
    __slots__ = ("shape", "nbytes", "merge", "consumers", "reshapers", "merged")

    def __init__(self, shape: tuple, nbytes: int, merge: bool = False):
        self.shape, self.nbytes, self.merge = shape, nbytes, merge
        self.consumers: list[int] = []
        self.reshapers = 0    # consumers whose output had another shape: this tensor fed a branch
        self.merged = False   # already read by a merge (add, mul, cat): its branch has been joined


def resolve_inputs(layers: Sequence[LayerCost]) -> tuple[list[list[_Tensor]], list[_Tensor | None]]:
    """Each layer's input tensors and its new output tensor (None when it writes in place or moves nothing),
    reconstructed from shapes and byte counts."""
    produced: list[_Tensor] = []
    inputs: list[list[_Tensor]] = []
    outputs: list[_Tensor | None] = []
    current: _Tensor | None = None
    for i, layer in enumerate(layers):
        in_shape = tuple(layer.shape.get("in_shape") or ())
        out_shape = tuple(layer.shape.get("out_shape") or in_shape)
        if current is None:  # the sidecar's pixels -> the first layer's new tensor
            inputs.append([])
            current = _Tensor(out_shape, layer.output_bytes)
            produced.append(current)
            outputs.append(current)
            continue
        primary = next((t for t in reversed(produced) if t.shape == in_shape), current)
        chosen = [primary]
        missing = layer.input_bytes - primary.nbytes
        if missing > 0:
            chosen += _extra_inputs(layer.op, produced, primary, current, missing)
        for tensor in chosen:
            tensor.consumers.append(i)
            if out_shape != tensor.shape:
                tensor.reshapers += 1
            if layer.op in _MERGES or layer.op == "mul":
                tensor.merged = True
        inputs.append(chosen)
        if layer.output_bytes == 0 or (layer.op in _IN_PLACE and out_shape == primary.shape):
            if layer.op in _MERGES:
                primary.merge = True
            outputs.append(None)
            current = primary
        else:
            current = _Tensor(out_shape, layer.output_bytes, merge=layer.op in _MERGES)
            produced.append(current)
            outputs.append(current)
    return inputs, outputs


def _extra_inputs(op: str, produced: list[_Tensor], primary: _Tensor, current: _Tensor,
                  missing: int) -> list[_Tensor]:
    """The other inputs of a layer that reads `missing` more bytes than its primary input."""
    others = [t for t in reversed(produced) if t is not primary]
    if op in ("cat", "stack"):  # same spatial size; unconsumed branch outputs first, most recent first
        spatial = primary.shape[2:]
        fits = [t for t in others if t.shape[2:] == spatial]
        chosen = []
        for tensor in sorted(fits, key=lambda t: bool(t.consumers)):
            if missing <= 0:
                break
            if tensor.nbytes <= missing:
                chosen.append(tensor)
                missing -= tensor.nbytes
        return chosen
    if current is not primary and current.nbytes <= missing:  # a scale or gate just computed
        return [current]
    same = [t for t in others if t.nbytes == missing and not t.merged]
    for rule in (lambda t: not t.consumers, lambda t: t.merge, lambda t: t.reshapers > 0):
        found = next((t for t in same if rule(t)), None)
        if found is not None:
            return [found]
    return same[-1:] if same else []  # the oldest of that size: where the run of equal shapes began


def faulted_bytes(layers: Sequence[LayerCost], batch: int, scale: float, *, mmap_threshold_bytes: int,
                  temporaries: Sequence[int], retained: bool = False) -> list[int]:
    """Bytes of fresh pages each layer writes in the steady state of repeated forwards at `batch`: outputs of
    `layer.output_bytes * batch * scale`, `temporaries[i]` bytes of scratch allocated and freed by layer i,
    in a glibc heap whose largest mmap threshold is `mmap_threshold_bytes` (`retained`: an allocator that
    never maps nor trims, SIDECAR_MALLOC_ENV). The first layer is the normalisation of the staged pixels."""
    inputs, outputs = resolve_inputs(layers)
    last_use: dict[int, int] = {}
    for i, tensors in enumerate(inputs):
        for tensor in tensors:
            last_use[id(tensor)] = i
    end = len(layers) - 1
    for tensor in outputs:
        if tensor is not None:
            last_use.setdefault(id(tensor), end)  # never read (a model output): lives to the end
    dies: dict[int, list[_Tensor]] = {}
    for tensor in outputs:
        if tensor is not None:
            dies.setdefault(last_use[id(tensor)], []).append(tensor)
    pixels = batch * layers[0].input_bytes  # the staged uint8 batch
    heap = Heap(mmap_threshold_bytes, retained=retained)
    faulted = [0] * len(layers)
    for _ in range(REPLAYED_FORWARDS):
        staged = heap.malloc(pixels)
        live: dict[int, list] = {}
        for i, tensor in enumerate(outputs):
            before = heap.faulted
            if tensor is not None:
                live[id(tensor)] = heap.malloc(tensor.nbytes * batch * scale)
            if temporaries[i]:
                heap.free(heap.malloc(temporaries[i]))
            for dead in dies.get(i, ()):
                heap.free(live.pop(id(dead)))
            faulted[i] = heap.faulted - before
        heap.free(staged)
    return faulted
