"""The ``tensor_sizes`` patch: fairseq's hub interface (``TransformerModel.from_pretrained``,
``translate``/``generate``) passes the source lengths to ``LanguagePairDataset`` as a torch
tensor, which the dataset converts with ``np.array``. With NumPy 2 that call warns that
``Tensor.__array__`` takes no ``copy`` keyword (a ``DeprecationWarning`` now, an error once
NumPy drops the fallback). Patched: sizes given as a tensor are converted with
``Tensor.numpy()`` first, the array fairseq would have made.
"""

import functools
import warnings

import torch
from fairseq.data import language_pair_dataset


def _sizes_as_arrays(init):
    @functools.wraps(init)
    def wrapper(self, src, src_sizes, *args, **kwargs):
        if isinstance(src_sizes, torch.Tensor):
            src_sizes = src_sizes.numpy()
        if isinstance(kwargs.get("tgt_sizes"), torch.Tensor):
            kwargs["tgt_sizes"] = kwargs["tgt_sizes"].numpy()
        return init(self, src, src_sizes, *args, **kwargs)

    wrapper.sret_patch = "tensor_sizes"
    return wrapper


def tensor_sizes_warn(dataset_class=None) -> bool:
    """Does building a ``LanguagePairDataset`` from tensor sizes, as the hub interface does,
    warn (NumPy's ``__array__`` deprecation)? Builds one of two sentences."""
    from fairseq.data import Dictionary

    dataset_class = dataset_class or language_pair_dataset.LanguagePairDataset
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset_class([torch.tensor([4, 2]), torch.tensor([2])], torch.LongTensor([2, 1]), Dictionary())
    return any(issubclass(w.category, DeprecationWarning) and "__array__" in str(w.message) for w in caught)


def install(patch) -> None:
    cls = language_pair_dataset.LanguagePairDataset
    patch.replace(cls, "__init__", _sizes_as_arrays(cls.__init__))
