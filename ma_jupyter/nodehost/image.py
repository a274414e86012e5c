"""The Python environment a node runs (a venv, a conda env or an interpreter), resolved on the host."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidSpec
from ..models import Image
from .host_policy import load_policy

# Folders of the host's system that every sandbox sees read-only (when they exist).  /usr covers
# Debian's merged /bin, /lib...; the top-level ones are symlinks into it there.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys")


@dataclass(frozen=True)
class ImageEnv:
    """The Python environment a node runs with.

    Attributes:
        python: the interpreter a ``python``/``python3`` command runs with.
        bin_dir: put first on PATH, so the image's ``torchrun``, ``mpirun``... are found.
        roots: host folders the sandbox must show read-only for the interpreter to work.
        env: variables that activate it (VIRTUAL_ENV, CONDA_PREFIX...).
    """

    python: str
    bin_dir: str
    roots: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


def _prefix_of(executable: str) -> str:
    """``/x/bin/python3`` -> ``/x``: the installation an interpreter belongs to."""
    return str(Path(executable).resolve().parent.parent)


def _venv_home(venv: Path) -> list[str]:
    """The base installation a virtualenv points at (``home`` in pyvenv.cfg)."""
    try:
        for line in (venv / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                return [str(Path(value.strip()).resolve().parent)]
    except OSError:
        pass
    return []


def _conda_env_dir(name: str) -> Path:
    if "/" in name:
        return Path(name).expanduser()
    bases = []
    for var in ("CONDA_PREFIX", "MAMBA_ROOT_PREFIX"):
        if os.environ.get(var):
            bases.append(Path(os.environ[var]))
    if os.environ.get("CONDA_EXE"):
        bases.append(Path(os.environ["CONDA_EXE"]).resolve().parent.parent)
    bases += [Path.home() / d for d in ("miniconda3", "anaconda3", "miniforge3", "mambaforge")]
    bases += [Path("/opt/conda")]
    for base in bases:
        for candidate in (base / "envs" / name, base.parent / name if base.parent.name == "envs" else None):
            if candidate is not None and (candidate / "bin" / "python").exists():
                return candidate
    if name == "base":
        for base in bases:
            if (base / "bin" / "python").exists() and (base / "conda-meta").is_dir():
                return base
    raise InvalidSpec(
        f"image: no conda env named {name!r} was found (looked in {', '.join(str(b / 'envs') for b in bases)}); "
        "give the env's full path instead",
        field="image",
    )


def resolve_image(image: Image) -> ImageEnv:
    """The interpreter, PATH entry and folders of the job's image.

    ``python`` names an interpreter, ``venv`` a virtualenv folder, ``conda_env`` a conda env by
    name or path (its interpreter is run directly, as ``conda run -n`` would, without conda's
    activation scripts); none means the interpreter the service runs on.  A registered image's
    ``name`` says nothing here: the service filled in its environment beside it.

    Raises:
        InvalidSpec: the interpreter or environment does not exist, or one of its folders is a
            system folder or the service's home (a sandbox would show it to the job).
    """
    if image.name and not (image.python or image.venv or image.conda_env):
        raise InvalidSpec(
            f"image: the registered image {image.name!r} was not resolved to its environment: submit "
            "the job through the service's REST API, which does",
            field="image",
        )
    env = _resolve_image(image)
    if image.python or image.venv or image.conda_env:
        policy = load_policy()
        for root in env.roots:
            policy.check_private(root, "image", "image")
    return env


def _resolve_image(image: Image) -> ImageEnv:
    if image.python:
        path = Path(image.python)
        if not path.is_absolute():
            found = shutil.which(image.python)
            if not found:
                raise InvalidSpec(
                    f"image: {image.python!r} is not on PATH; give its full path", field="image"
                )
            path = Path(found)
        if not os.access(path, os.X_OK) or path.is_dir():
            raise InvalidSpec(f"image: {path} is not an executable Python interpreter", field="image")
        return ImageEnv(str(path), str(path.parent), _roots(str(path.parent.parent), _prefix_of(str(path))))
    if image.venv:
        venv = Path(image.venv).expanduser()
        python = venv / "bin" / "python"
        if not python.exists():
            raise InvalidSpec(
                f"image: {venv} is not a virtualenv ({python} is missing); create it with python -m venv {venv}",
                field="image",
            )
        venv = venv.resolve()
        return ImageEnv(
            str(venv / "bin" / "python"),
            str(venv / "bin"),
            # the base installation is where the venv's interpreter resolves to; only a venv made
            # with --copies has to be taken at its pyvenv.cfg's word (checked like every root)
            _roots(str(venv), _prefix_of(str(python)), *([] if python.is_symlink() else _venv_home(venv))),
            {"VIRTUAL_ENV": str(venv)},
        )
    if image.conda_env:
        env_dir = _conda_env_dir(image.conda_env)
        if not (env_dir / "bin" / "python").exists():
            raise InvalidSpec(f"image: {env_dir} has no bin/python", field="image")
        env_dir = env_dir.resolve()
        base = env_dir.parent.parent if env_dir.parent.name == "envs" else env_dir
        return ImageEnv(
            str(env_dir / "bin" / "python"),
            str(env_dir / "bin"),
            _roots(str(env_dir), str(base)),
            {"CONDA_PREFIX": str(env_dir), "CONDA_DEFAULT_ENV": image.conda_env},
        )
    executable = sys.executable
    env = {"VIRTUAL_ENV": sys.prefix} if sys.prefix != sys.base_prefix else {}
    return ImageEnv(
        executable,
        str(Path(executable).parent),
        _roots(sys.prefix, sys.base_prefix, sys.exec_prefix, _prefix_of(executable)),
        env,
    )


def _roots(*paths: str) -> tuple[str, ...]:
    """Distinct folders to bind, dropping those the system binds already cover or that nest."""
    found: list[str] = []
    for raw in paths:
        for path in {os.path.abspath(raw), os.path.realpath(raw)}:
            if not os.path.isdir(path) or any(path == s or path.startswith(s + "/") for s in SYSTEM_DIRS):
                continue
            if path in ("/", "/etc", "/proc", "/dev", "/tmp"):
                continue
            found.append(path)
    found = sorted(set(found))
    return tuple(p for p in found if not any(p != q and p.startswith(q + "/") for q in found))


#: where an installation keeps its packages, relative to its prefix (venv, conda, Debian's python)
_PACKAGE_DIRS = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages")


def package_dirs(image: ImageEnv) -> list[Path]:
    """The package folders of the image's installations (its roots), as found on the host."""
    found: list[Path] = []
    # a system interpreter (/usr/bin/python3) has no roots of its own: its prefix holds them
    for root in dict.fromkeys((*image.roots, _prefix_of(image.python))):
        for prefix in (Path(root), Path(root) / "local"):
            for pattern in _PACKAGE_DIRS:
                found += [p for p in sorted(prefix.glob(pattern)) if p.is_dir() and p not in found]
    return found


def missing_modules(image: ImageEnv, modules: tuple[str, ...]) -> list[str]:
    """The top-level ``modules`` that none of the image's package folders holds.

    Read from the folders, never by running the image's interpreter: that would run the
    image's ``.pth`` files and ``sitecustomize`` on the host, as the service's account.  An
    image whose package folders cannot be found misses nothing (it is not refused on a guess);
    a module counts as present as a package, a single-file module or an extension module.
    """
    folders = package_dirs(image)
    if not folders:
        return []

    def present(name: str) -> bool:
        for folder in folders:
            if (folder / name).is_dir() or (folder / f"{name}.py").is_file():
                return True
            if any(folder.glob(f"{name}.*.so")):
                return True
        return False

    return [m for m in modules if not present(m)]
