"""MNIST, Fashion-MNIST, EMNIST, CIFAR-10 and CIFAR-100 from local files,
partitioned over the clients (docs/datasets.md, "Image datasets").

Nothing is downloaded: fedsim runs where the network may be closed, and a
run must not depend on a mirror's state. Each dataset looks in a few usual
folders (torchvision's layout among them) under the data root, and a
missing dataset raises DataMissingError saying where to get it.

:meth:`ImageData.build` turns the files into a FederatedData: optional
class filter, seeded train/test subsets, the scenario's partition, then a
float32 conversion. The subsets draw from streams of their own, so asking
for fewer test samples never changes the training partition.

CIFAR's python pickles go through an unpickler that accepts only arrays and
plain containers: a pickle from an untrusted download must not run code.
"""

from __future__ import annotations

import gzip
import io
import pickle
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.data.base import DataInfo, DatasetSpec, FederatedData
from fedsim.data.errors import DataError, DataMissingError, data_root, find_dir, missing
from fedsim.data.partition import IidPartition, PartitionSpec, layout, split

# separates the subset streams from the partition's and other uses of the seed
_TAG_SUBSET = 0x1AA6E
_DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


def _read_bytes(path: Path) -> bytes:
    """The bytes of ``path`` (or of ``path.gz``), gunzipped when compressed.

    Compression is told by the gzip magic bytes, not the name: torchvision
    keeps unpacked files, the MNIST site serves .gz, and a .gz file renamed
    without its suffix still reads.

    Raises:
        DataError: The file is gzipped but damaged.
        OSError: The file cannot be read.
    """
    if not path.is_file() and Path(f"{path}.gz").is_file():
        path = Path(f"{path}.gz")
    raw = path.read_bytes()
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as exc:
        # EOFError would reach the CLI as a bare "Aborted." (click's end of input)
        raise DataError(
            f"{path}: damaged gzip file ({exc}); it is truncated or corrupt, "
            "obtain it again"
        ) from None


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file of unsigned bytes (MNIST format), ``path`` with or without
    its ``.gz``.

    Returns:
        uint8 array of the header's shape, a read-only view of the file bytes.

    Raises:
        DataError: Not an IDX file of unsigned bytes, or its size does not
            match the header (a truncated download).
    """
    b = _read_bytes(Path(path))
    # magic: two zero bytes, the element type (0x08: unsigned byte), the rank
    if len(b) < 4 or b[0] != 0 or b[1] != 0 or b[2] != 0x08:
        raise DataError(f"{path}: not an IDX file of unsigned bytes")
    nd = b[3]
    dims = [int.from_bytes(b[4 + 4 * i : 8 + 4 * i], "big") for i in range(nd)]
    count = int(np.prod(dims)) if dims else 0
    start = 4 + 4 * nd
    if len(b) - start != count:
        raise DataError(
            f"{path}: header says {dims} ({count} bytes) but {len(b) - start} "
            "bytes follow; the file is truncated or corrupt"
        )
    return np.frombuffer(b, np.uint8, offset=start).reshape(dims)


class _ArraysOnly(pickle.Unpickler):
    """Unpickles plain containers and NumPy arrays, nothing else.

    A pickle may name any importable callable; allowing only the few a CIFAR
    batch needs keeps a tampered file from running code when it is loaded.
    """

    _ALLOWED: ClassVar[set[tuple[str, str]]] = {
        # numpy 1 and numpy 2 (numpy._core) names of the same functions
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # bytes in protocol-2 pickles written by Python 3
    }

    def find_class(self, module: str, name: str) -> Any:
        """The allowed class; UnpicklingError for any other."""
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to unpickle {module}.{name}: a CIFAR batch holds only "
            "arrays and lists"
        )


def _load_pickle(path: Path) -> dict:
    """A CIFAR python batch as a dict with str keys.

    The batches were pickled by Python 2: ``latin1`` reads their byte strings
    back unchanged, and the keys (bytes there) are decoded here.

    Raises:
        DataError: The file is not a readable, safe CIFAR batch.
    """
    try:
        obj = _ArraysOnly(io.BytesIO(path.read_bytes()), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError) as exc:
        raise DataError(f"{path}: {exc}") from exc
    if not isinstance(obj, dict):
        raise DataError(f"{path}: not a CIFAR batch (expected a dict)")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in obj.items()}


def images_to_float(
    images: np.ndarray, order: np.ndarray, mean: tuple, std: tuple
) -> np.ndarray:
    """float32 [len(order), C, H, W] = (images[order] / 255 - mean) / std, per
    channel, converted in chunks so only one float copy is ever held.

    Args:
        images: uint8 [N, C, H, W].
        order: The rows to take, in the order to store them.
        mean: Per-channel mean (one value for grey images).
        std: Per-channel standard deviation.

    Returns:
        A new C-contiguous float32 array, rows in ``order``'s order.
    """
    n = len(order)
    out = np.empty((n, *images.shape[1:]), dtype=np.float32)
    std_ = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    # x * scale - shift in float32: changing this arithmetic (e.g. dividing by
    # 255 first) would change the last bits of every image, and every result
    scale = np.float32(1.0 / 255.0) / std_
    shift = np.asarray(mean, np.float32).reshape(1, -1, 1, 1) / std_
    # 8192 rows: at most ~100 MB of float temporaries (CIFAR's 3 x 32 x 32)
    for s in range(0, n, 8192):
        chunk = images[order[s : s + 8192]].astype(np.float32)
        out[s : s + 8192] = chunk * scale - shift
    return out


class ImageData(DatasetSpec):
    """Fields shared by the image datasets (docs/datasets.md, "Image datasets").

    Subclasses give the files (:meth:`load`) and the class variables: the
    title, the number of classes and the per-channel mean and std used to
    normalise (the values the literature uses, so results compare).
    """

    root: str | None = None
    files: Literal["train+test", "test"] = "train+test"
    test_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.2
    partition: PartitionSpec = IidPartition(kind="iid")
    classes: list[Annotated[int, Field(ge=0)]] | None = Field(None, min_length=2)
    train_samples: Annotated[int, Field(ge=1)] | None = None
    test_samples: Annotated[int, Field(ge=1)] | None = None
    normalize: bool = True

    clients: ClassVar[int | None] = None  # as many as the fleet has devices
    title: ClassVar[str] = "images"
    num_classes: ClassVar[int] = 10
    mean: ClassVar[tuple[float, ...]] = (0.5,)
    std: ClassVar[tuple[float, ...]] = (0.5,)
    # (train, test) samples of the official files, and one sample's [C, H, W]
    file_samples: ClassVar[tuple[int, int]] = (60_000, 10_000)
    image_shape: ClassVar[tuple[int, int, int]] = (1, 28, 28)

    @model_validator(mode="after")
    def _check_fields(self) -> ImageData:
        """Reject a natural partition and bad ``classes`` before any file is read."""
        if self.partition.kind == "natural":
            raise ValueError(
                f"{self.title} has no natural clients; use iid, dirichlet, shards "
                "or pns_mix"
            )
        if self.classes is not None:
            if len(set(self.classes)) != len(self.classes):
                raise ValueError("classes must be distinct")
            n = self._classes_total()
            if max(self.classes) >= n:
                raise ValueError(f"{self.title} has classes 0..{n - 1}")
        return self

    def _classes_total(self) -> int:
        """The classes in the files (EMNIST and CIFAR-100 depend on fields)."""
        return self.num_classes

    def _file_samples(self) -> tuple[int, int]:
        """(train, test) samples in the files (EMNIST's depend on the split)."""
        return self.file_samples

    def info(self, num_clients: int) -> DataInfo:
        """Images of ``image_shape``; the official files' sample counts less
        what ``files``, ``train_samples`` and ``test_samples`` leave out.

        Args:
            num_clients: Unused: the shape does not depend on the clients.
        """
        train, test = self._file_samples()
        train = 0 if self.files == "test" else min(train, self.train_samples or train)
        test = min(test, self.test_samples or test)
        n = len(self.classes) if self.classes is not None else self._classes_total()
        return DataInfo("image", self.image_shape, n, train + test)

    def build(self, num_clients: int, seed: int) -> FederatedData:
        """Load, filter, subset, partition and normalise an image dataset.

        Args:
            num_clients: The clients to partition the training set over.
            seed: The scenario seed; the result is a pure function of it and
                the fields (and the files).

        Returns:
            The training rows stored client after client, weighted by client
            size, and the test set, as float32 images and int64 labels.

        Raises:
            DataMissingError: The files are not there.
            DataError: A file is damaged, or the partition cannot be made.
        """
        *train, test_x, test_y = self.load()
        num_classes = self._classes_total()
        if self.files == "test":
            # only the test files: split them; stream 0, the subsets use 1, 2
            perm = _subset_rng(seed, 0).permutation(len(test_y))
            n_test = max(1, int(round(self.test_fraction * len(perm))))
            tr, te = perm[n_test:], perm[:n_test]
            train = [test_x[tr], test_y[tr]]
            test_x, test_y = test_x[te], test_y[te]
        train_x, train_y = train
        if self.classes is not None:
            # relabel the kept classes 0..k-1 in the order listed (the model has
            # k outputs); -1 marks the classes dropped
            lut = np.full(num_classes, -1, dtype=np.int64)
            lut[np.asarray(self.classes)] = np.arange(len(self.classes))
            keep, keep_t = lut[train_y] >= 0, lut[test_y] >= 0
            train_x, train_y = train_x[keep], lut[train_y[keep]]
            test_x, test_y = test_x[keep_t], lut[test_y[keep_t]]
            num_classes = len(self.classes)
        # subsets after the class filter, so train_samples counts kept samples
        train_idx = _subset(len(train_y), self.train_samples, seed, 1)
        test_idx = _subset(len(test_y), self.test_samples, seed, 2)
        labels = train_y[train_idx]
        order, offsets = layout(split(self.partition, labels, num_clients, seed))
        # one-element mean/std broadcast over any number of channels
        mean, std = (self.mean, self.std) if self.normalize else ((0.0,), (1.0,))
        return FederatedData(
            x=images_to_float(train_x, train_idx[order], mean, std),
            y=np.ascontiguousarray(labels[order]),
            offsets=offsets,
            weights=np.diff(offsets).astype(np.float64),
            test_x=images_to_float(test_x, test_idx, mean, std),
            test_y=np.ascontiguousarray(test_y[test_idx]),
            num_classes=num_classes,
        )

    def load(self) -> list[np.ndarray]:
        """(train images, train labels, test images, test labels) as uint8
        [N, C, H, W] and int64; only the test pair with ``files: test``."""
        raise NotImplementedError

    def _candidates(self, subdirs: list[str], extra: Sequence[Path] = ()) -> list[Path]:
        """The folders to search, in order: the subdirs of the data root,
        the root itself when the scenario named it, then ``extra``."""
        root, explicit = data_root(self.root)
        return [root / s for s in subdirs] + ([root] if explicit else []) + [*extra]


class _IdxData(ImageData):
    """An image dataset stored as IDX files (MNIST's format).

    Class variables: ``subdirs`` of the data root and ``extra_dirs`` to
    search, ``how_to_get`` for the error message, and ``transpose`` for
    files stored column-major (EMNIST).
    """

    subdirs: ClassVar[list[str]] = []
    extra_dirs: ClassVar[list[Path]] = []
    how_to_get: ClassVar[str] = ""
    transpose: ClassVar[bool] = False

    def _stems(self) -> list[str]:
        """File name stems of the (train and) test files."""
        return ["t10k"] if self.files == "test" else ["train", "t10k"]

    def _label_offset(self) -> int:
        """Subtracted from every label (EMNIST letters count from 1)."""
        return 0

    def load(self) -> list[np.ndarray]:
        """See :meth:`ImageData.load`; images get a channel axis of 1."""
        kinds = ("images-idx3-ubyte", "labels-idx1-ubyte")
        names = [f"{stem}-{kind}" for stem in self._stems() for kind in kinds]
        how = self.how_to_get.format(root=data_root(self.root)[0])
        where = self._candidates(self.subdirs, self.extra_dirs)
        folder = find_dir(self.title, where, names, how)
        arrays = []
        for img_name, lab_name in zip(names[::2], names[1::2], strict=True):
            x = read_idx(folder / img_name)
            y = read_idx(folder / lab_name).astype(np.int64) - self._label_offset()
            if x.ndim != 3 or len(x) != len(y):
                raise DataError(f"{folder / img_name}: expected N x H x W images")
            if self.transpose:
                x = x.transpose(0, 2, 1)
            arrays += [x[:, None], y]
        return arrays


_MNIST_FILES = (
    "the four MNIST files train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
    "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz"
)


class MnistData(_IdxData):
    """MNIST (LeCun et al.): 60,000 + 10,000 28x28 grey digits, 10 classes."""

    dataset: Literal["mnist"]
    title: ClassVar[str] = "MNIST"
    mean: ClassVar[tuple[float, ...]] = (0.1307,)
    std: ClassVar[tuple[float, ...]] = (0.3081,)
    subdirs: ClassVar[list[str]] = ["mnist", "MNIST/raw", "MNIST", "mnist-test"]
    how_to_get: ClassVar[str] = (
        f"place {_MNIST_FILES} (or copy a torchvision MNIST/raw folder) in "
        "{root}/mnist/; with only the two t10k files, set data.files: test"
    )


class FashionMnistData(_IdxData):
    """Fashion-MNIST (Xiao et al. 2017): 60,000 + 10,000 28x28 grey clothing
    images, 10 classes; also read from Debian's ``dataset-fashion-mnist``."""

    dataset: Literal["fashion_mnist"]
    title: ClassVar[str] = "Fashion-MNIST"
    mean: ClassVar[tuple[float, ...]] = (0.2860,)
    std: ClassVar[tuple[float, ...]] = (0.3530,)
    subdirs: ClassVar[list[str]] = [
        "fashion-mnist",
        "fashion_mnist",
        "FashionMNIST/raw",
        "FashionMNIST",
    ]
    extra_dirs: ClassVar[list[Path]] = [_DEBIAN_FASHION]
    how_to_get: ClassVar[str] = (
        "`apt-get install dataset-fashion-mnist` (Debian/Ubuntu; installs "
        f"{_DEBIAN_FASHION}), or place the four Fashion-MNIST .gz files "
        "(train-images-idx3-ubyte.gz, ...) in {root}/fashion-mnist/"
    )


_EmnistSplit = Literal["byclass", "bymerge", "balanced", "letters", "digits", "mnist"]
# classes of each EMNIST split
_EMNIST = dict(byclass=62, bymerge=47, balanced=47, letters=26, digits=10, mnist=10)
# (train, test) samples of each EMNIST split's files
_EMNIST_SAMPLES = {
    "byclass": (697_932, 116_323),
    "bymerge": (697_932, 116_323),
    "balanced": (112_800, 18_800),
    "letters": (124_800, 20_800),
    "digits": (240_000, 40_000),
    "mnist": (60_000, 10_000),
}


class EmnistData(_IdxData):
    """EMNIST (Cohen et al. 2017), one of its splits (``subset``); ``letters``
    labels 1..26 become 0..25. Images are transposed to upright, as
    torchvision does."""

    dataset: Literal["emnist"]
    subset: _EmnistSplit = "letters"
    title: ClassVar[str] = "EMNIST"
    mean: ClassVar[tuple[float, ...]] = (0.1736,)
    std: ClassVar[tuple[float, ...]] = (0.3317,)
    subdirs: ClassVar[list[str]] = ["emnist", "emnist/gzip", "EMNIST/raw", "EMNIST"]
    how_to_get: ClassVar[str] = (
        "unzip the EMNIST release 'gzip.zip' (NIST) and put its gzip/ folder's "
        "emnist-<subset>-*.gz files in {root}/emnist/ (or copy a torchvision "
        "EMNIST/raw folder)"
    )
    transpose: ClassVar[bool] = True

    def _classes_total(self) -> int:
        """The classes of the chosen split."""
        return _EMNIST[self.subset]

    def _file_samples(self) -> tuple[int, int]:
        """The chosen split's (train, test) samples."""
        return _EMNIST_SAMPLES[self.subset]

    def _stems(self) -> list[str]:
        """EMNIST's names: emnist-<subset>-train and -test, not MNIST's t10k."""
        parts = ["test"] if self.files == "test" else ["train", "test"]
        return [f"emnist-{self.subset}-{p}" for p in parts]

    def _label_offset(self) -> int:
        """1 for ``letters`` (labels 1..26), 0 for the other splits."""
        return 1 if self.subset == "letters" else 0


class _CifarData(ImageData):
    """A CIFAR dataset, from its binary or its python version.

    The binary version is tried first: it needs no unpickling at all.
    """

    file_samples: ClassVar[tuple[int, int]] = (50_000, 10_000)
    image_shape: ClassVar[tuple[int, int, int]] = (3, 32, 32)

    bin_dir: ClassVar[str] = ""
    py_dir: ClassVar[str] = ""
    # (train, test) files of the python version; the binary one's end in .bin
    py_files: ClassVar[tuple[list[str], list[str]]] = ([], [])

    def _label_format(self) -> tuple[int, int, str]:
        """(label bytes of a binary record, the label's index, pickle key)."""
        return 1, 0, "labels"

    def _read(self, fmt: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
        """One batch file: uint8 [N, 3, 32, 32] images and int64 labels.

        Raises:
            DataError: The file is damaged or not a CIFAR batch.
        """
        nbytes, index, key = self._label_format()
        if fmt == "bin":
            raw = np.fromfile(path, dtype=np.uint8)
            # a record: the label byte(s), then 3 x 32 x 32 pixels, planar RGB
            rec = nbytes + 3072
            if raw.size % rec:
                raise DataError(
                    f"{path}: size {raw.size} is not a multiple of {rec} bytes"
                )
            raw = raw.reshape(-1, rec)
            images, labels = raw[:, nbytes:], raw[:, index]
        else:
            d = _load_pickle(path)
            images, labels = np.asarray(d["data"], np.uint8), d[key]
        return images.reshape(-1, 3, 32, 32), np.asarray(labels, np.int64)

    def load(self) -> list[np.ndarray]:
        """See :meth:`ImageData.load`: the binary version, else the python one.

        Raises:
            DataMissingError: Neither version is there (the message lists
                every folder tried).
        """
        want = 1 if self.files == "test" else 0
        bin_files = tuple([f"{n}.bin" for n in group] for group in self.py_files)
        # [want:]: with files: test, only the test group is needed
        sets = {"bin": bin_files[want:], "py": self.py_files[want:]}
        tried: list[Path] = []
        for fmt, sub in (("bin", self.bin_dir), ("py", self.py_dir)):
            where = self._candidates([sub])
            out = self._load_version(fmt, where, sets[fmt])
            if out is not None:
                return out
            tried += where
        raise self._missing(bin_files, tried)

    def _load_version(
        self, fmt: str, where: list[Path], groups: Sequence[list[str]]
    ) -> list[np.ndarray] | None:
        """(images, labels) per group of files, from the first folder in
        ``where`` holding them all; None when no folder does."""
        names = [n for group in groups for n in group]
        try:
            folder = find_dir(self.title, where, names, "", gz=False)
        except DataMissingError:
            return None
        out = []
        for group in groups:
            xs, ys = zip(*(self._read(fmt, folder / n) for n in group), strict=True)
            out += [np.concatenate(xs), np.concatenate(ys)]
        return out

    def _missing(
        self, bin_files: tuple[list[str], ...], tried: list[Path]
    ) -> DataMissingError:
        """The error for a CIFAR dataset found in neither version."""
        expect = (
            f"{self.bin_dir}/ ({', '.join(bin_files[0] + bin_files[1])})"
            f" or {self.py_dir}/"
        )
        t = self.title.lower()
        how = (
            f"extract the {self.title} binary version ({t}-binary.tar.gz, "
            f"preferred) or python version ({t}-python.tar.gz) from the CIFAR page "
            f"of the University of Toronto into {data_root(self.root)[0]}/"
        )
        # dict.fromkeys: each folder once, in the order tried
        return missing(self.title, expect, list(dict.fromkeys(tried)), how)


class Cifar10Data(_CifarData):
    """CIFAR-10 (Krizhevsky 2009): 50,000 + 10,000 32x32 colour images, 10 classes."""

    dataset: Literal["cifar10"]
    title: ClassVar[str] = "CIFAR-10"
    mean: ClassVar[tuple[float, ...]] = (0.4914, 0.4822, 0.4465)
    std: ClassVar[tuple[float, ...]] = (0.2470, 0.2435, 0.2616)
    bin_dir: ClassVar[str] = "cifar-10-batches-bin"
    py_dir: ClassVar[str] = "cifar-10-batches-py"
    py_files: ClassVar[tuple[list[str], list[str]]] = (
        [f"data_batch_{i}" for i in range(1, 6)],
        ["test_batch"],
    )


class Cifar100Data(_CifarData):
    """CIFAR-100: 50,000 + 10,000 32x32 colour images, 100 fine classes (or
    the 20 coarse superclasses with ``labels: coarse``)."""

    dataset: Literal["cifar100"]
    labels: Literal["fine", "coarse"] = "fine"
    title: ClassVar[str] = "CIFAR-100"
    mean: ClassVar[tuple[float, ...]] = (0.5071, 0.4865, 0.4409)
    std: ClassVar[tuple[float, ...]] = (0.2673, 0.2564, 0.2762)
    bin_dir: ClassVar[str] = "cifar-100-binary"
    py_dir: ClassVar[str] = "cifar-100-python"
    py_files: ClassVar[tuple[list[str], list[str]]] = (["train"], ["test"])

    def _classes_total(self) -> int:
        """100 fine classes, or 20 coarse ones."""
        return 100 if self.labels == "fine" else 20

    def _label_format(self) -> tuple[int, int, str]:
        """A binary record starts with the coarse, then the fine label byte."""
        return 2, int(self.labels == "fine"), f"{self.labels}_labels"


def _subset_rng(seed: int, what: int) -> np.random.Generator:
    """The generator of one subset draw; ``what`` tells the draws apart
    (0: the test-file split, 1: the training subset, 2: the test subset)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), _TAG_SUBSET, what]))


def _subset(n: int, k: int | None, seed: int, what: int) -> np.ndarray:
    """Sorted indices of a seeded random ``k`` of ``range(n)`` (all: None).

    Sorted, so the subset keeps the files' order and the partition's draws
    depend only on which samples were kept.
    """
    if k is None or k >= n:
        return np.arange(n)
    return np.sort(_subset_rng(seed, what).choice(n, k, False))
