"""adapterdoc oracle stub (.ci/oracles/vllm.sh): PyPI's torchvision needs a CUDA torch (on this CPU torch it fails
with "operator torchvision::nms does not exist"), and vLLM's LoRA loading never runs an image transform; transformers'
image utilities only import names from it. Every ``torchvision.*`` module is made on demand; every name in it is an
inert placeholder (``InterpolationMode`` is an enum)."""

import enum
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.28.0"


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Placeholder:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        raise RuntimeError("torchvision is a stub in this oracle environment")

    def __getattr__(self, name):
        return _Placeholder()


def _getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return InterpolationMode if name == "InterpolationMode" else _Placeholder()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = _getattr
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__getattr__ = _getattr
