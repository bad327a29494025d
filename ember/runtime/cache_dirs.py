"""Where built kernels are written: a part (cpp, cuda, triton) of the cache directory, or, where
that cannot be written, a temporary directory of this process.

A cache directory that names a file, is read-only or cannot be created sent every graph through
ATen (the build failed creating ``<dir>/cpp``), with a warning per graph naming neither
EMBER_CACHE_DIR nor the cache_dir option. A cache is a speed-up, never a condition: kernels are
then built in a temporary directory (removed at exit) with one warning per cache directory. What
the unwritable directory already holds (a read-only cache filled earlier, a CI artifact) is still
read: callers look there first.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

_lock = threading.Lock()
# cache directory -> the temporary directory that stands in for it in this process
_stand_ins: dict[Path, Path] = {}


def writable_part(cache_dir: Path | str, part: str) -> Path:
    """``cache_dir/part``, created, where this process can write there; else that part of a
    temporary directory of this process (one warning per cache directory)."""
    root = Path(cache_dir)
    with _lock:
        stand_in = _stand_ins.get(root)
    if stand_in is None:
        target = root / part
        try:
            # created on every build, not once: `ember cache clear` in another process removes it
            target.mkdir(parents=True, exist_ok=True)
            # a directory root may still not write into (read-only, another user's): try it
            fd, probe = tempfile.mkstemp(dir=target, prefix=".probe-")
            os.close(fd)
            os.unlink(probe)
            return target
        except OSError as e:
            stand_in = _stand_in(root, e)
    target = stand_in / part
    target.mkdir(parents=True, exist_ok=True)
    return target


def stand_in_for(cache_dir: Path | str) -> Path | None:
    """The temporary directory that stands in for ``cache_dir`` in this process, if any."""
    with _lock:
        return _stand_ins.get(Path(cache_dir))


def stand_in_after(cache_dir: Path | str, error: OSError) -> Path:
    """From now on in this process, the temporary directory that stands in for ``cache_dir``,
    which a build found it could not write after all (a full disk: the probe of writable_part
    fits, a library does not). One warning, as for a directory that cannot be written at all."""
    return _stand_in(Path(cache_dir), error)


def _stand_in(root: Path, error: OSError) -> Path:
    with _lock:
        if root in _stand_ins:
            return _stand_ins[root]
        stand_in = Path(tempfile.mkdtemp(prefix="ember-cache-"))
        atexit.register(shutil.rmtree, stand_in, ignore_errors=True)
        _stand_ins[root] = stand_in
    reason = error.strerror or type(error).__name__
    warnings.warn(f"ember: the cache directory {str(root)!r} (EMBER_CACHE_DIR or the cache_dir option) cannot "
                  f"be written ({reason}: {error.filename!r}); this process builds its kernels in {str(stand_in)!r}, "
                  "removed at exit, so the next process builds them again", RuntimeWarning, stacklevel=2)
    return stand_in
