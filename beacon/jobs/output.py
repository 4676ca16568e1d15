"""Crash-consistent, keyed JSONL output: one line per key, ever.

Every record is appended with a single ``write(2)`` on an ``O_APPEND`` descriptor and (by
default) ``fsync``'d before :meth:`KeyedJsonlWriter.write` returns, so after Ctrl-C or SIGKILL the
file holds whole lines plus at most one torn final line; after a power loss, at most the last
records are missing. On open the writer reads the keys already present, cuts a torn final line
off (the start of a record, without its newline), and refuses -- leaving it as it is -- a file
holding any other line that is not a record (corruption, or another program's file given by
mistake). A key already in the file is never written again, which makes reruns and duplicate
deliveries harmless. An exclusive ``flock`` keeps two processes from appending to the same file
at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from beacon._checks import boolean
from beacon.errors import BeaconError, ConfigError

__all__ = ["KeyedJsonlWriter", "OutputError", "dumps_record", "read_jsonl"]


class OutputError(BeaconError, OSError):
    """An output file that cannot be used (corrupt line, locked by another process)."""


def _sanitize(obj: Any) -> Any:
    # JSON has no NaN/inf; a reward that is not finite is written as null rather than as an
    # invalid token that would make the whole file unreadable by strict parsers.
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_sanitize(v) for v in obj]
    return obj


def dumps_record(record: Mapping[str, Any], *, ensure_ascii: bool = False) -> str:
    """One JSONL line (without newline): compact, UTF-8 kept, non-finite floats as null.

    ``ensure_ascii`` writes non-ASCII text ``\\u``-escaped: the form for text that has no
    UTF-8 encoding (a lone surrogate, e.g. the raw text of an input line with undecodable
    bytes, echoed in its error line), so that the line is still valid JSON in a UTF-8 file.
    """
    try:
        return json.dumps(record, ensure_ascii=ensure_ascii, allow_nan=False,
                          separators=(",", ":"))
    except ValueError:
        return json.dumps(_sanitize(record), ensure_ascii=ensure_ascii, allow_nan=False,
                          separators=(",", ":"))


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Whole, parsable JSON-object lines of a JSONL file (a torn final line is ignored)."""
    p = Path(path)
    if not p.exists():
        return
    with p.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                yield obj


class KeyedJsonlWriter:
    """Append-only JSONL writer keyed by ``record[key_field]``.

    Use as a context manager. ``fsync=True`` (default) syncs each record to disk (about 0.1 ms
    on an SSD); ``False`` leaves flushing to the OS, which still survives a killed process.
    """

    def __init__(self, path: str | Path, *, key_field: str = "key", fsync: bool = True,
                 required: str | None = None) -> None:
        if not isinstance(path, str | os.PathLike) or not isinstance(os.fspath(path), str) \
                or not os.fspath(path).strip():
            raise ConfigError("path", path, "must be a non-empty file path (str or os.PathLike)")
        if not isinstance(key_field, str) or not key_field:
            raise ConfigError("key_field", key_field, "must be a non-empty string")
        if required is not None and (not isinstance(required, str) or not required):
            raise ConfigError("required", required, "must be a non-empty string or None")
        self.path = Path(path)
        self.key_field = key_field
        # a field every record of this kind of file has (None: any keyed record): a file whose
        # records lack it is another kind of file, refused on open
        self.required = required
        self.fsync = boolean("fsync", fsync)
        self._keys: set[str] = set()
        self._fd: int | None = None
        self.recovered_bytes = 0  # size of the torn tail cut off on open
        self._torn: str | None = None  # a partial line that could not be cut off

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> Self:
        if self._fd is not None:
            return self
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputError(f"{self.path} is being written by another process") from None
            self._recover(fd)
            self._remove_stale_temps()
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)  # also releases the flock

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- state -------------------------------------------------------------------------------
    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    # -- writing -----------------------------------------------------------------------------
    def _seen(self, record: dict[str, Any]) -> None:
        """Called on open for each record already in the file (a subclass may learn from
        them, e.g. the format to keep writing in)."""

    def write(self, record: Mapping[str, Any]) -> bool:
        """Append ``record`` unless its key is already in the file; True if written."""
        if self._fd is None:
            raise OutputError(f"{self.path} is not open")
        key = record.get(self.key_field)
        if not isinstance(key, str) or not key:
            raise OutputError(f"record has no string {self.key_field!r}: {str(record)[:200]}")
        if key in self._keys:
            return False
        try:
            data = (dumps_record(record) + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: write that record \u-escaped
            data = (dumps_record(record, ensure_ascii=True) + "\n").encode("ascii")
        if self._torn is not None:
            raise OutputError(f"{self.path}: an earlier write failed half-way and its partial "
                              f"line could not be removed ({self._torn}); reopen the file (the "
                              "partial line is cut off on open)")
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except BaseException:
            # A write that failed half-way (disk full, file size limit, Ctrl-C between two
            # chunks) left a partial line: cut it off, or a later record -- once space is
            # freed -- would be glued to it, corrupting (or silently losing) that record.
            written = len(data) - len(view)
            if written:
                try:
                    os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
                except OSError as cut:
                    self._torn = f"{type(cut).__name__}: {cut}"
            raise
        self._keys.add(key)  # in the file from here on, even if the fsync below fails
        if self.fsync:
            os.fsync(self._fd)
        return True

    def compact(self, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Atomically drop the records for which ``keep`` is false; returns the dropped ones.

        The kept lines are copied byte for byte to a temporary file in the same directory,
        synced, and renamed over the output (``os.replace`` is atomic), so a crash leaves either
        the old file or the new one. Used to retry failed prompts without duplicating keys.
        """
        if self._fd is None:
            raise OutputError(f"{self.path} is not open")
        dropped: list[dict[str, Any]] = []
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(self._fd, "rb", closefd=False) as src, open(tmp, "wb") as dst:
                src.seek(0)
                for raw in src:
                    if not raw.strip():
                        continue
                    obj = json.loads(raw)
                    if keep(obj):
                        dst.write(raw)
                    else:
                        dropped.append(obj)
                dst.flush()
                os.fsync(dst.fileno())
        except BaseException:  # the output is untouched; leave no partial copy behind
            tmp.unlink(missing_ok=True)
            raise
        if not dropped:
            tmp.unlink()
            return dropped
        new_fd = os.open(tmp, os.O_RDWR | os.O_APPEND)
        try:
            fcntl.flock(new_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # pragma: no cover - nobody else knows the temp name
            os.close(new_fd)
            raise OutputError(f"{tmp} is locked") from None
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd = new_fd
        for obj in dropped:
            self._keys.discard(obj[self.key_field])
        return dropped

    # -- recovery ----------------------------------------------------------------------------
    def _remove_stale_temps(self) -> None:
        """Delete the temporary copies (:meth:`compact`) that a killed process left behind.

        A SIGKILL or a power loss during a compaction leaves ``.NAME.PID.tmp`` (up to a whole
        copy of the output) that nothing else removes. Called with the file's lock held: a
        writer compacts only while it holds that lock, so no such copy is in use. (Whether the
        PID is alive says nothing: the killed process may linger as a zombie, or the PID may
        have been reused.)
        """
        prefix, suffix = f".{self.path.name}.", ".tmp"
        try:
            entries = list(os.scandir(self.path.parent))
        except OSError:  # pragma: no cover - an unreadable directory: nothing to clean
            return
        for entry in entries:
            name = entry.name
            pid = name[len(prefix):-len(suffix)]
            if not (name.startswith(prefix) and name.endswith(suffix) and pid.isdigit()):
                continue
            with contextlib.suppress(OSError):  # already gone, or not ours to remove
                os.unlink(entry.path)

    def _recover(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        if size == 0:
            return
        good_end = 0  # byte offset just past the last valid line
        bad: tuple[int, str] | None = None  # first invalid line (line number, text)
        torn = False  # that line is what a write cut short leaves (see _looks_torn)
        lineno = 0
        unterminated = False  # the last record is whole but lacks its newline
        with open(fd, "rb", closefd=False) as fh:
            fh.seek(0)
            offset = 0
            for raw in fh:
                lineno += 1
                end = offset + len(raw)
                obj: Any = None
                try:
                    # Without its newline only the final line can be read here: a record
                    # whole up to its newline (a write torn just before it, a hand-edited
                    # file) is a result, kept; a torn prefix does not parse and is cut off.
                    obj = json.loads(raw)
                except ValueError:
                    obj = None
                if isinstance(obj, dict) and isinstance(obj.get(self.key_field), str):
                    if self.required is not None and self.required not in obj:
                        # a keyed record of another kind: the job's output and DPO file
                        # swapped -- the rerun dropped the "pairs" without an output line
                        # (the real output lines) and mixed the two kinds of records
                        raise OutputError(
                            f"{self.path} line {lineno} is a record without "
                            f"{self.required!r}, not a line of this kind of file (the job's "
                            "output and its DPO file swapped?); the file was left as it is"
                        )
                    unterminated = not raw.endswith(b"\n")
                    if bad is not None:
                        # A bad line followed by good ones is corruption, not a torn write.
                        raise OutputError(
                            f"{self.path} line {bad[0]} is not a JSON record with a "
                            f"{self.key_field!r}: {bad[1][:200]!r}; fix or remove it"
                        )
                    self._keys.add(obj[self.key_field])
                    self._seen(obj)
                    good_end = end
                elif raw.strip() or not raw.endswith(b"\n"):
                    if bad is None:
                        bad = (lineno, raw.decode("utf-8", "replace").rstrip("\r\n"))
                        torn = _looks_torn(raw)
                else:
                    good_end = end if bad is None else good_end  # blank line: harmless
                offset = end
        if bad is not None and not (bad[0] == lineno and torn):
            # Whole lines that are not records: another file (a prompts file, a dataset, a
            # CSV given as --out by mistake) or a damaged one -- never cut, it is not ours.
            raise OutputError(
                f"{self.path} line {bad[0]} is not a JSON record with a {self.key_field!r}: "
                f"{bad[1][:200]!r}; is it the output of another program? The file was left "
                "as it is: give another file name, or fix or remove that line"
            )
        if good_end < size:
            # Only the tail after the last good record is cut: a torn append.
            self.recovered_bytes = size - good_end
            os.ftruncate(fd, good_end)
            os.fsync(fd)
        elif unterminated:
            os.write(fd, b"\n")  # O_APPEND: the next record starts on its own line
            os.fsync(fd)


def _looks_torn(raw: bytes) -> bool:
    """Whether a line that is not a record is what an interrupted append leaves at the end of
    the file: no newline (a record is written with its newline in one ``write``), and either a
    start of a JSON object that does not parse or nothing but whitespace and NUL bytes (the
    unwritten blocks of a power loss). A line that parses (a one-line JSON file without its
    newline) or starts otherwise (a CSV, plain text) is some other file's content. A last line
    that starts with NUL bytes is torn whatever its end: a power loss left the first blocks of
    the final append unwritten (zeros) and its last ones, newline included, on disk."""
    if raw.startswith(b"\x00"):
        return True
    if raw.endswith(b"\n"):
        return False
    body = raw.strip(b" \t\r\x00")
    if not body:
        return True
    if not body.startswith(b"{"):
        return False
    try:
        json.loads(body)
    except ValueError:
        return True
    return False


def _fsync_dir(path: Path) -> None:
    # The rename itself is durable only once the directory entry is synced.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - directories that cannot be opened (some FUSE mounts)
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
