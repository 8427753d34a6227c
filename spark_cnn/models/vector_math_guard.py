"""Keep the CPU's vector exp fast in front of the activations that use it. Imports torch: sidecar side only.

Torch's SLEEF-based vector kernels (silu, sigmoid, gelu, elu) can fall into a state where they run about twice
as slow until the process makes an MKL call, which a network running its convolutions in oneDNN never does; an
8 x 8 matrix product before each such activation ends it for 1.4 us (docs/perf-model-journal.md, "The vector-exp
guard", has the measurements).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["GUARDED_ACTIVATIONS", "GUARDED_TIMM_ACTIVATIONS", "guard_vector_math", "is_guarded"]

# The module kinds whose CPU kernels are SLEEF's vector exp (silu, sigmoid, elu) or slowed with it (gelu), as
# measured (docs/perf-model-journal.md). Functional calls (torch.sigmoid inside a forward) cannot be hooked.
GUARDED_ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.SiLU, nn.Sigmoid, nn.GELU, nn.ELU)
# timm's own classes that call the same kernels (torch.sigmoid, F.gelu, x * sigmoid): by module and name, so
# timm is not imported here. timm builds its squeeze-excitation gates (rexnet) and convnext's GELU from them.
TIMM_ACTIVATIONS_MODULE = "timm.layers.activations"
GUARDED_TIMM_ACTIVATIONS = frozenset({"Sigmoid", "GELU", "GELUTanh", "QuickGELU", "Swish"})

# The smallest matrix product that ended the state (8 x 8 ended it in 128 of 128 calls, as 16 x 256 x 256 did).
_GUARD_SIDE = 8

_GUARD_HOOK = "_spark_cnn_vector_math_guard"


def _guard_hook() -> object:
    operand = torch.ones(_GUARD_SIDE, _GUARD_SIDE)

    def before_activation(module: nn.Module, args: tuple) -> None:
        torch.mm(operand, operand)  # the call, not its result, is the point: it ends the slow state
    return before_activation


def guard_vector_math(module: nn.Module) -> int:
    """Run a tiny MKL matrix product before every GUARDED_ACTIVATIONS module of `module` (itself included), and
    before timm's GUARDED_TIMM_ACTIVATIONS, so
    their vector exp runs at full speed on the CPU; the outputs are unchanged. Returns how many modules it
    guarded; a module guarded before is not guarded twice. For CPU modules only (CUDA kernels do not need it).

    >>> net = nn.Sequential(nn.Conv2d(3, 8, 1), nn.SiLU(), nn.ReLU(), nn.Sigmoid())
    >>> guard_vector_math(net), guard_vector_math(net)
    (2, 0)
    >>> is_guarded(net[1]), is_guarded(net[2])
    (True, False)
    """
    hook = _guard_hook()
    guarded = 0
    for sub in module.modules():
        if _uses_vector_exp(sub) and not is_guarded(sub):
            setattr(sub, _GUARD_HOOK, sub.register_forward_pre_hook(hook))
            guarded += 1
    return guarded


def _uses_vector_exp(module: nn.Module) -> bool:
    kind = type(module)
    return isinstance(module, GUARDED_ACTIVATIONS) or (
        kind.__module__ == TIMM_ACTIVATIONS_MODULE and kind.__name__ in GUARDED_TIMM_ACTIVATIONS)


def is_guarded(module: nn.Module) -> bool:
    """Whether guard_vector_math put its guard on this module."""
    return hasattr(module, _GUARD_HOOK)
