"""Checkpoint readers and parameter fillers shared by the model loaders."""

import glob
import os
import zlib
from collections.abc import Iterator

import torch
from torch import nn
from tqdm.auto import tqdm

DUMMY_WEIGHT_RANGE = 1e-3


def weight_shape(loaded) -> tuple[int, ...]:
    """Shape of a checkpoint tensor or of a lazy safetensors slice (``get_slice``)."""
    if isinstance(loaded, torch.Tensor):
        return tuple(loaded.shape)
    return tuple(loaded.get_shape())


def narrow_weight(loaded, dim: int, start: int, size: int) -> torch.Tensor:
    """``loaded[..., start:start + size, ...]`` along ``dim`` as a tensor.

    ``loaded`` is a tensor (a view is returned) or a lazy safetensors slice, of which only
    the requested range is read from the file: how a tensor-parallel rank reads its shard
    without materialising the full tensor.

    Raises:
        ValueError: the range does not fit the tensor's ``dim`` (naming both).
    """
    shape = weight_shape(loaded)
    if start < 0 or size < 0 or start + size > shape[dim]:
        raise ValueError(
            f"shard rows [{start}, {start + size}) of dim {dim} do not fit a checkpoint tensor "
            f"of shape {shape}"
        )
    if isinstance(loaded, torch.Tensor):
        return loaded.narrow(dim, start, size)
    index = [slice(None)] * len(shape)
    index[dim] = slice(start, start + size)
    return loaded[tuple(index)]


def as_tensor(loaded) -> torch.Tensor:
    """A checkpoint tensor itself, or the whole of a lazy safetensors slice read."""
    if isinstance(loaded, torch.Tensor):
        return loaded
    return loaded[tuple(slice(None) for _ in weight_shape(loaded))]


def default_weight_loader(param: nn.Parameter, loaded_weight) -> None:
    """Copy ``loaded_weight`` (a tensor or a lazy safetensors slice) into ``param``
    (dtype/device converted).

    Raises:
        ValueError: the shapes differ (naming both).
    """
    if tuple(param.shape) != weight_shape(loaded_weight):
        raise ValueError(
            f"checkpoint tensor has shape {weight_shape(loaded_weight)}, the parameter expects "
            f"{tuple(param.shape)}"
        )
    param.data.copy_(as_tensor(loaded_weight))


def safetensors_files(model_dir: str) -> list[str]:
    """Sorted ``*.safetensors`` files of an HF checkpoint directory.

    Raises:
        FileNotFoundError: the directory holds none.
    """
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors files in {model_dir!r}; load_format='safetensors' needs a "
            f"Hugging Face checkpoint directory saved with safe_serialization=True"
        )
    return files


def safetensors_weights_iterator(
    model_dir: str, lazy: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for every tensor of every safetensors file (on CPU),
    with a tqdm bar over the files.

    With ``lazy`` (tensor parallelism) each item is a safetensors slice (``get_slice``)
    instead, valid until the next item: the weight loaders read only this rank's rows or
    columns of it (:func:`narrow_weight`), so no rank materialises the full model.

    Raises:
        FileNotFoundError: the directory holds no safetensors file.
        ValueError: a file safetensors cannot read (truncated or corrupt), naming it.
    """
    from safetensors import SafetensorError, safe_open

    files = safetensors_files(model_dir)
    for path in tqdm(files, desc="Loading safetensors weights", unit="file"):
        try:
            f = safe_open(path, framework="pt", device="cpu")
        except SafetensorError as e:
            raise _unreadable(path, e) from e
        with f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                try:
                    tensor = f.get_slice(name) if lazy else f.get_tensor(name)
                except SafetensorError as e:
                    raise _unreadable(path, e, name) from e
                yield name, tensor


def _unreadable(path: str, error: Exception, tensor: str | None = None) -> ValueError:
    """The error of a safetensors file that cannot be read (``tensor``: the one that failed)."""
    what = f"tensor {tensor!r} of " if tensor is not None else ""
    return ValueError(
        f"cannot read {what}safetensors file {path!r}: {error} (is the file truncated or corrupt?)"
    )


def dummy_seed(name: str, seed: int) -> int:
    """Seed for a dummy parameter: ``zlib.crc32(name) + seed`` (the same on every PP stage)."""
    return zlib.crc32(name.encode("utf-8")) + seed


def fill_dummy_weights(
    model: nn.Module, seed: int, name_aliases: dict[str, str] | None = None
) -> None:
    """Fill every parameter with deterministic values for benchmarks.

    Norm weights (parameters of a module whose name contains ``norm``) are set to 1; every
    other parameter ``name`` is uniform in ``[-1e-3, 1e-3]`` from a ``torch.Generator`` on the
    parameter's device (a CPU generator takes minutes for a 30B model) seeded by
    :func:`dummy_seed` of ``name_aliases.get(name, name)``. Seeding by name makes every
    pipeline stage on the same device type agree on the layers it shares with another split.
    """
    name_aliases = name_aliases or {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            module_name = name.rsplit(".", 1)[0]
            if "norm" in module_name.rsplit(".", 1)[-1]:
                param.fill_(1.0)
                continue
            generator = torch.Generator(device=param.device)
            generator.manual_seed(dummy_seed(name_aliases.get(name, name), seed))
            values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
            values.uniform_(-DUMMY_WEIGHT_RANGE, DUMMY_WEIGHT_RANGE, generator=generator)
            param.copy_(values)
            del values
