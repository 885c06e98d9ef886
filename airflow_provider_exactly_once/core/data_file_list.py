"""A write's data files, which a commit task need not parse to commit them.

A commit whose prepared manifests stand needs of its descriptors only their number, rows, bytes and
paths, and parsing 10,000 of them cost more than the rest of the commit: ``DataFiles`` knows those
and parses the descriptors the first time anything asks for one, then whole. The contract:
design.md, "The meta store" (the write's head) and D16.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, get_args, overload

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from .errors import InvalidPreCommit


class _Described(Protocol):
    """What this module reads of a descriptor (``precommit.DataFileDescriptor``)."""

    @property
    def path(self) -> str: ...
    @property
    def record_count(self) -> int: ...
    @property
    def file_size_in_bytes(self) -> int: ...


Descriptor = TypeVar("Descriptor", bound=_Described)


class DataFiles(Sequence[Descriptor], Generic[Descriptor]):
    """The data files of one table's write (``DataFiles[precommit.DataFileDescriptor]``): a sequence
    of descriptors, parsed when first read when the write came from the meta store (``unread``)."""

    __slots__ = ("_bytes", "_count", "_files", "_load", "_lock", "_names", "_records")

    def __init__(self, files: Sequence[Descriptor] = ()) -> None:
        self._files: tuple[Descriptor, ...] | None = tuple(files)
        self._count = len(self._files)
        self._records: int | None = None
        self._bytes: int | None = None
        self._names: tuple[str, ...] | None = None
        self._load: Callable[[], Sequence[Descriptor]] | None = None
        self._lock = threading.Lock()

    @classmethod
    def unread(
        cls,
        *,
        count: int,
        records: int,
        size: int,
        paths: Sequence[str],
        load: Callable[[], Sequence[Descriptor]],
    ) -> DataFiles[Descriptor]:
        """Files known by their number, rows, bytes and paths; ``load`` gives the descriptors, in the
        order of ``paths``, when one is first read."""
        if len(paths) != count:
            raise ValueError(f"{count} data files with {len(paths)} paths")
        files: DataFiles[Descriptor] = cls()
        files._files, files._count, files._names, files._load = None, count, tuple(paths), load
        files._records, files._bytes = records, size
        return files

    @property
    def read(self) -> bool:
        """Whether the descriptors are parsed (always, for a write that did not come from the store)."""
        return self._files is not None

    def _read(self) -> tuple[Descriptor, ...]:
        files = self._files
        if files is not None:
            return files
        with self._lock:
            if self._files is None:
                assert self._load is not None and self._names is not None
                loaded = tuple(self._load())
                if tuple(f.path for f in loaded) != self._names:
                    raise InvalidPreCommit(
                        f"the stored descriptors of {len(loaded)} data files are not the {self._count} files listed "
                        "with the write (its head in epoch_metadata.head_zlib); set that column to NULL for the "
                        "epoch's row, and the write is read whole"
                    )
                self._files, self._load = loaded, None
            return self._files

    def paths(self) -> Sequence[str]:
        """Each file's path, in order, without parsing the descriptors."""
        if self._names is None:
            self._names = tuple(f.path for f in self._read())
        return self._names

    def record_count(self) -> int:
        """The files' rows, without parsing the descriptors."""
        if self._records is None:
            self._records = sum(f.record_count for f in self._read())
        return self._records

    def size_in_bytes(self) -> int:
        """The files' bytes, without parsing the descriptors."""
        if self._bytes is None:
            self._bytes = sum(f.file_size_in_bytes for f in self._read())
        return self._bytes

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Descriptor: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Descriptor]: ...
    def __getitem__(self, index: int | slice) -> Descriptor | Sequence[Descriptor]:
        return self._read()[index]

    def __iter__(self) -> Iterator[Descriptor]:
        return iter(self._read())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DataFiles | list | tuple):
            return len(self) == len(other) and list(self._read()) == list(other)
        return NotImplemented

    def __copy__(self) -> DataFiles[Descriptor]:
        return self  # immutable, as the frozen descriptors are

    def __deepcopy__(self, memo: dict[int, Any]) -> DataFiles[Descriptor]:
        return self

    def __reduce__(self) -> tuple[type[DataFiles[Descriptor]], tuple[tuple[Descriptor, ...]]]:
        """Pickled read: a loader and its lock do not travel to another process."""
        return DataFiles, (self._read(),)

    def __repr__(self) -> str:
        return f"DataFiles({self._count} files{'' if self.read else ', unread'})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        """Validated as a list of its descriptors (a ``DataFiles`` is taken as it is), serialised as one."""
        (item,) = get_args(source) or (Any,)
        items = handler.generate_schema(list[item])  # type: ignore[valid-type]

        def validate(value: Any, inner: core_schema.ValidatorFunctionWrapHandler) -> DataFiles[Any]:
            return value if isinstance(value, DataFiles) else DataFiles(inner(value))

        return core_schema.no_info_wrap_validator_function(
            validate,
            items,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda files: list(files), return_schema=items
            ),
        )
