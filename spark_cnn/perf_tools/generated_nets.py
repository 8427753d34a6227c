"""Hand-written CNNs from no zoo, drawn at random: the time model judged on networks nobody chose (issue 36).

    spark-cnn validate --generated --batch-sizes 1,8,32,64 --sweeps 3 --calibrate-each \\
        --json docs/zoo-generated.json --markdown docs/zoo-generated.md

`draw_network(rng)` draws one network from five families the zoo has little of:

- "vgg": plain conv-bn-relu stacks with odd channel widths (37, 91, 203, ...) and max pooling;
- "dwse": depthwise-separable inverted residuals with squeeze-excite (relu6 / silu / hardswish, sigmoid gate);
- "dense": a small conv trunk, then a wide dense head (flatten or global pooling, Linear layers of 1-4k);
- "oddk": kernels of 5, 7 and 1x7 / 7x1, strides of 3, branches joined by concatenation;
- "grouped": ResNeXt-like blocks whose grouped 3x3 convs have odd widths divisible by their group count.

Each draws an odd input size and its widths until the network costs MIN_GFLOPS..MAX_GFLOPS per image (conv and
linear FLOPs, counted on the meta device: nothing is allocated while drawing).

The set judged is `frozen_set()`: NETWORKS networks drawn from `random.Random(SEED)`. SEED is the SHA-256 of
SEED_PHRASE, committed before any of these networks was measured; the judgement (`validate --generated`) takes no
seed, so it cannot pick a set that suits the model. Each network is built by name through the loader's factory
kind (`spark_cnn.perf_tools.generated_nets:gen03_dwse`), so a measuring process builds the very same network.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from spark_cnn.errors import ModelError

__all__ = ["FAMILIES", "NETWORKS", "SEED", "SEED_PHRASE", "GeneratedNet", "draw_network", "frozen_set",
           "input_shape_of", "source_of"]

# Fixed before any measurement (2026-12-04, issue 36 item 4) and never to be changed to suit a result: a new
# phrase is a new held-out set, to be reported as such.
SEED_PHRASE = "spark_cnn issue 36 item 4: hand-written networks from no zoo, frozen 2026-12-04"
SEED = int.from_bytes(hashlib.sha256(SEED_PHRASE.encode()).digest()[:8], "big")
# Ten networks, two per family: measuring each at 1, 8, 32 and 64 images (and calibrating before each) takes
# about as long as the 12 held-out timm networks on 2 cores (~20-30 minutes).
NETWORKS = 10
FAMILIES = ("vgg", "dwse", "dense", "oddk", "grouped")
# Cheap enough that a batch of 64 takes seconds on one core, dear enough that a batch is not all overhead.
MIN_GFLOPS = 0.2
MAX_GFLOPS = 2.5
_MAX_TRIES = 200
_MODULE = __name__


@dataclass(frozen=True)
class GeneratedNet:
    """One drawn network: its name (`gen03_dwse`), family, image shape (C, H, W) and builder."""

    name: str
    family: str
    input_shape: tuple[int, int, int]
    build: Callable[[], nn.Module]


def draw_network(rng: random.Random, *, family: str | None = None, index: int = 0) -> tuple[str, nn.Module, tuple]:
    """(name, module in eval mode, input shape) of one network drawn with `rng` (from `family`, else a family drawn
    too).

    >>> name, module, shape = draw_network(random.Random(1), family="vgg")
    >>> name, module(torch.zeros(2, *shape)).shape[0]
    ('gen00_vgg', 2)
    """
    net = _draw(rng, family or rng.choice(FAMILIES), index)
    return net.name, net.build(), net.input_shape


@functools.lru_cache(maxsize=4)
def frozen_set(seed: int = SEED, n: int = NETWORKS) -> tuple[GeneratedNet, ...]:
    """The held-out set: `n` networks drawn from `seed`, each family `n // len(FAMILIES)` times or more, in an
    order drawn too. Deterministic for a seed."""
    rng = random.Random(seed)
    families = [FAMILIES[i % len(FAMILIES)] for i in range(n)]
    rng.shuffle(families)
    return tuple(_draw(rng, family, i) for i, family in enumerate(families))


def source_of(net: GeneratedNet) -> str:
    """The model source that builds `net` in any process (the loader's `module:factory` kind)."""
    return f"{_MODULE}:{net.name}"


def input_shape_of(source: str) -> tuple[int, int, int]:
    """The image shape of the frozen set's network named by `source` (its name or its model source)."""
    return _by_name(source.rpartition(":")[2]).input_shape


def _by_name(name: str) -> GeneratedNet:
    for net in frozen_set():
        if net.name == name:
            return net
    raise ModelError(f"{name!r} is not in the generated set (names: "
                     f"{', '.join(n.name for n in frozen_set())})")


def __getattr__(name: str) -> Callable[[], nn.Module]:
    """`spark_cnn.perf_tools.generated_nets:gen03_dwse` as a factory: the frozen set's network of that name."""
    if name.startswith("gen") and "_" in name:
        return _by_name(name).build
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- drawing -----------------------------------------------------------------------------------------------------


def _draw(rng: random.Random, family: str, index: int) -> GeneratedNet:
    """Draw `family`'s parameters until the network's cost is within MIN_GFLOPS..MAX_GFLOPS."""
    if family not in _FAMILY_DRAWS:
        raise ModelError(f"family {family!r}: expected one of {', '.join(FAMILIES)}")
    for _ in range(_MAX_TRIES):
        size = _odd(rng, 97, 257)
        shape = (3, size, size)
        make = _FAMILY_DRAWS[family](rng, size)
        if MIN_GFLOPS <= _gflops(make, shape) <= MAX_GFLOPS:
            weights_seed = rng.getrandbits(31)
            return GeneratedNet(f"gen{index:02d}_{family}", family, shape, _seeded(make, weights_seed))
    raise ModelError(f"no {family} network within {MIN_GFLOPS}-{MAX_GFLOPS} GFLOPs in {_MAX_TRIES} draws")


def _seeded(make: Callable[[], nn.Module], seed: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return make().eval()
    return build


def _gflops(make: Callable[[], nn.Module], shape: tuple[int, ...]) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        module = make().eval()
        image = torch.zeros(1, *shape)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(image)
    return counter.get_total_flops() / 1e9


def _odd(rng: random.Random, low: int, high: int) -> int:
    return rng.randrange(low | 1, high + 1, 2)


def _act(kind: str) -> nn.Module:
    return {"relu": nn.ReLU(inplace=True), "relu6": nn.ReLU6(inplace=True), "silu": nn.SiLU(inplace=True),
            "hardswish": nn.Hardswish(inplace=True)}[kind]


def _cba(cin: int, cout: int, kernel, stride=1, groups: int = 1, act: str | None = "relu") -> nn.Sequential:
    """Conv (padding keeping the size at stride 1), batch norm, activation."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, (kh, kw), stride, (kh // 2, kw // 2), groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if act:
        layers.append(_act(act))
    return nn.Sequential(*layers)


def _linear_stack(features: int, widths: list[int]) -> nn.Sequential:
    """Linear layers of these widths from `features` inputs, with a ReLU between each two."""
    layers: list[nn.Module] = []
    for i, width in enumerate(widths):
        layers.append(nn.Linear(features, width))
        if i < len(widths) - 1:
            layers.append(nn.ReLU(inplace=True))
        features = width
    return nn.Sequential(*layers)


class _Head(nn.Module):
    """Global average pooling, flatten, one or more Linear layers (ReLU between them)."""

    def __init__(self, cin: int, widths: list[int]):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = _linear_stack(cin, widths)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(x), 1))


class _Net(nn.Module):
    def __init__(self, features: nn.Module, head: nn.Module):
        super().__init__()
        self.features, self.head = features, head

    def forward(self, x):
        return self.head(self.features(x))


def _classes(rng: random.Random) -> int:
    return rng.choice((10, 37, 100, 257, 1000))


# (a) plain VGG-like stacks


def _draw_vgg(rng: random.Random, size: int) -> Callable[[], nn.Module]:
    stages = rng.randint(3, 5)
    width = _odd(rng, 17, 63)
    plan = []
    for _ in range(stages):
        plan.append((rng.randint(1, 3), width))
        width = min(_odd(rng, int(width * 1.5), width * 2 + 1), 515)
    pool = rng.choice((2, 3))
    classes = _classes(rng)

    def make() -> nn.Module:
        layers: list[nn.Module] = []
        cin = 3
        for convs, cout in plan:
            for _ in range(convs):
                layers.append(_cba(cin, cout, 3))
                cin = cout
            layers.append(nn.MaxPool2d(pool, 2, ceil_mode=True))
        return _Net(nn.Sequential(*layers), _Head(cin, [classes]))
    return make


# (b) depthwise-separable + squeeze-excite


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.act = nn.ReLU(inplace=True)
        self.expand = nn.Conv2d(reduced, channels, 1)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        return x * self.gate(self.expand(self.act(self.reduce(self.pool(x)))))


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int, act: str, se: bool):
        super().__init__()
        hidden = cin * expand
        self.expand = _cba(cin, hidden, 1, act=act) if expand > 1 else nn.Identity()
        self.depthwise = _cba(hidden, hidden, kernel, stride, groups=hidden, act=act)
        self.se = _SqueezeExcite(hidden, max(8, hidden // 4)) if se else nn.Identity()
        self.project = _cba(hidden, cout, 1, act=None)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


def _draw_dwse(rng: random.Random, size: int) -> Callable[[], nn.Module]:
    act = rng.choice(("relu6", "silu", "hardswish"))
    stem = _odd(rng, 15, 41)
    blocks = []
    cin = stem
    for _ in range(rng.randint(4, 6)):
        cout = _odd(rng, cin, int(cin * 1.8) + 2)
        stride = rng.choice((1, 2, 2))
        for repeat in range(rng.randint(1, 3)):
            blocks.append((cin, cout, rng.choice((3, 4, 6)), rng.choice((3, 5)), stride if repeat == 0 else 1,
                           rng.random() < 0.75))
            cin = cout
    last = _odd(rng, 2 * cin, 4 * cin)
    classes = _classes(rng)

    def make() -> nn.Module:
        layers: list[nn.Module] = [_cba(3, stem, 3, 2, act=act)]
        layers += [_InvertedResidual(a, b, e, k, s, act, se) for a, b, e, k, s, se in blocks]
        layers.append(_cba(cin, last, 1, act=act))
        return _Net(nn.Sequential(*layers), _Head(last, [classes]))
    return make


# (c) wide dense heads


class _FlattenHead(nn.Module):
    """Adaptive pooling to `side` x `side`, flatten, wide Linear layers with ReLU."""

    def __init__(self, cin: int, side: int, widths: list[int], pool: str):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(side) if pool == "avg" else nn.AdaptiveMaxPool2d(side)
        self.flatten = nn.Flatten()
        self.fc = _linear_stack(cin * side * side, widths)

    def forward(self, x):
        return self.fc(self.flatten(self.pool(x)))


def _draw_dense(rng: random.Random, size: int) -> Callable[[], nn.Module]:
    trunk = []
    cin = 3
    for i in range(rng.randint(3, 5)):
        cout = _odd(rng, 31, 161) if i else _odd(rng, 15, 47)
        trunk.append((cin, cout, rng.choice((1, 2)) if i else 2))
        cin = cout
    side = rng.choice((1, 3, 5, 7))
    widths = [rng.choice((1023, 1536, 2047, 3001, 4096)) for _ in range(rng.randint(1, 3))] + [_classes(rng)]
    pool = rng.choice(("avg", "max"))

    def make() -> nn.Module:
        features = nn.Sequential(*[_cba(a, b, 3, s) for a, b, s in trunk])
        return _Net(features, _FlattenHead(cin, side, widths, pool))
    return make


# (d) unusual kernel sizes and strides


class _Factorised(nn.Module):
    """Two branches joined by concatenation: 1xk then kx1, and a plain 3x3."""

    def __init__(self, cin: int, left: int, right: int, k: int):
        super().__init__()
        self.left = nn.Sequential(_cba(cin, left, (1, k)), _cba(left, left, (k, 1)))
        self.right = _cba(cin, right, 3)

    def forward(self, x):
        return torch.cat([self.left(x), self.right(x)], 1)


def _draw_oddk(rng: random.Random, size: int) -> Callable[[], nn.Module]:
    stem_k, stem_s = rng.choice(((7, 3), (5, 3), (7, 2)))
    stem = _odd(rng, 23, 61)
    plan = []
    cin = stem
    for _ in range(rng.randint(3, 5)):
        kind = rng.choice(("k5", "k7", "fact", "s3"))
        if kind == "fact":
            left, right = _odd(rng, 21, 97), _odd(rng, 21, 97)
            plan.append(("fact", cin, (left, right), rng.choice((5, 7))))
            cin = left + right
        else:
            cout = _odd(rng, 31, 193)
            kernel, stride = {"k5": (5, 1), "k7": (7, 1), "s3": (rng.choice((3, 5)), 3)}[kind]
            plan.append((kind, cin, cout, (kernel, stride)))
            cin = cout
        if rng.random() < 0.5:
            plan.append(("pool", cin, cin, rng.choice((2, 3))))
    classes = _classes(rng)

    def make() -> nn.Module:
        layers: list[nn.Module] = [_cba(3, stem, stem_k, stem_s)]
        for kind, a, b, extra in plan:
            if kind == "fact":
                layers.append(_Factorised(a, b[0], b[1], extra))
            elif kind == "pool":
                layers.append(nn.MaxPool2d(extra, extra, ceil_mode=True))
            else:
                layers.append(_cba(a, b, extra[0], extra[1]))
        return _Net(nn.Sequential(*layers), _Head(cin, [classes]))
    return make


# (e) grouped convs with odd widths


class _GroupedBlock(nn.Module):
    def __init__(self, cin: int, width: int, groups: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(_cba(cin, width, 1), _cba(width, width, 3, stride, groups=groups),
                                  _cba(width, cout, 1, act=None))
        self.shortcut = (nn.Identity() if stride == 1 and cin == cout else _cba(cin, cout, 1, stride, act=None))
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.body(x) + self.shortcut(x))


def _draw_grouped(rng: random.Random, size: int) -> Callable[[], nn.Module]:
    stem = _odd(rng, 23, 49)
    blocks = []
    cin = stem
    for stage in range(rng.randint(3, 4)):
        groups = rng.choice((3, 5, 7, 9))
        width = groups * _odd(rng, 3, 15)
        cout = _odd(rng, max(cin, 41), 2 * cin + 41)
        for repeat in range(rng.randint(1, 2)):
            blocks.append((cin, width, groups, cout, 2 if repeat == 0 and stage else 1))
            cin = cout
    classes = _classes(rng)

    def make() -> nn.Module:
        layers: list[nn.Module] = [_cba(3, stem, 3, 2), nn.MaxPool2d(3, 2, 1)]
        layers += [_GroupedBlock(*block) for block in blocks]
        return _Net(nn.Sequential(*layers), _Head(cin, [classes]))
    return make


_FAMILY_DRAWS: dict[str, Callable[[random.Random, int], Callable[[], nn.Module]]] = {
    "vgg": _draw_vgg, "dwse": _draw_dwse, "dense": _draw_dense, "oddk": _draw_oddk, "grouped": _draw_grouped}
