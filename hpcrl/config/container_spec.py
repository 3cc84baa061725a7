"""The `container:`, `cuda:` and `image:` sections: the image the jobs run in, what a GPU job sets up, and
how `hpcrl build-image` builds the image. Their strings end up in job scripts and a definition file."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Optional

from hpcrl.config.resources_spec import mem_problem, time_problem
from hpcrl.config.schema import env_name_problem, non_empty_problem, setting

CONTAINER_RUNTIMES = ("singularity", "apptainer")


def _runtime_problem(value: str) -> str | None:
    if value in CONTAINER_RUNTIMES or (value.startswith("/") and not any(c.isspace() for c in value)):
        return None
    return f"expected one of {', '.join(map(repr, CONTAINER_RUNTIMES))} or an absolute path to one, got {value!r}"


@dataclass
class ContainerConfig:
    image: Optional[str] = None
    """Path to a .sif image; jobs run the host's Python when it is empty."""
    runtime: str = setting("singularity", valid=_runtime_problem)
    """`singularity`, `apptainer`, or the absolute path of either (a site's own install, off the PATH a job
    gets). With `runs: program` a name is resolved on the sweep's PATH and the job gets the path."""
    binds: list[str] = setting(factory=list)
    """`src[:dst[:opts]]` mounts into the image; the experiment directory (and a program's working
    directory, and cuda.lib_path) are added where no bind shows them at the same path."""
    home: Optional[str] = None
    """`--home`: the home directory inside the container (a cluster home may be slow or over quota)."""
    nv: bool = True
    """`--nv` (the host's NVIDIA driver in the image) for the stages that ask for GPUs (resources.gpus,
    eval.gpus); a stage without one (the aggregate) runs without it."""
    env: dict[str, str] = setting(factory=dict, keys=env_name_problem)
    """Variables set inside the container, exported by the job as `SINGULARITYENV_*` and `APPTAINERENV_*`."""
    cleanenv: bool = False
    """`--cleanenv`: start from an empty environment inside the container, but for what container.env sets."""
    runs: Literal["hpcrl", "program"] = "hpcrl"
    """What runs inside the image. `hpcrl`: each job runs `hpcrl` there (the image has hpcrl, as
    `hpcrl build-image` makes it). `program` (algo: program only): hpcrl supervises from the host
    and starts only the program's command in the image, which then needs no hpcrl. The default
    stays `hpcrl` so that a config written before this key runs as it did."""


@dataclass
class CudaConfig:
    lib_path: Optional[str] = None
    """Prepended to LD_LIBRARY_PATH in the job when it is not already there; with an image, also bound
    into it read-only at the same path (unless container.binds already show it there)."""
    modules: list[str] = setting(factory=list)
    """Environment modules the job loads (`module load`) before hpcrl runs; one that fails stops the job."""


def _matching(pattern: str, expected: str) -> Callable[[str], str | None]:
    """The rule of a string that must match `pattern` whole: None, or `expected ..., got '...'`."""

    def problem(text: str) -> str | None:
        return None if re.fullmatch(pattern, text) else f"expected {expected}, got {text!r}"

    return problem


_python_problem = _matching(r"3\.\d+(\.\d+)?", "a Python version such as 3.11 (quote it: YAML reads 3.10 as 3.1)")
_miniforge_problem = _matching(r"\d+\.\d+\.\d+-\d+", "a Miniforge release such as 24.11.3-0 (its tag on github.com/conda-forge/miniforge)")
_conda_version_problem = _matching(r"\d[0-9A-Za-z._+*]*", "a conda version such as 0.3.3 or 0.3.3.2026.03.12")
"""A version conda pins a package to (`habitat-sim=VERSION`): refused here, not minutes into a build."""
_os_package_problem = _matching(r"[a-z0-9][a-z0-9+.-]*(:[a-z0-9]+)?(=[A-Za-z0-9.+~:-]+)?", "a Debian package name (optionally =version)")


def _requirement_problem(req: str) -> str | None:
    if req.strip() and not req.lstrip().startswith("-"):
        return None
    return f"expected one requirement such as numpy>=1.26 (no pip options), got {req!r}"


def _label_problem(key: str) -> str | None:
    return None if re.fullmatch(r"[^\s=#]+", key) else "expected a label name without spaces, '=' or '#'"


@dataclass
class ImageConfig:
    """The Singularity image the jobs run in (`hpcrl build-image`). Its values end up in a
    definition file, where a line break would start a section or a header: every string of the
    schema is one line, and these fields say what else they accept."""

    base: str = "docker://nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"
    """`docker://IMAGE:TAG` (pin `@sha256:...` for a reproducible base), `library://` or `oras://` URIs,
    or the path of a local .sif (`Bootstrap: localimage`): a heavy base built rarely, with a thin layer on top."""
    os_packages: list[str] = setting(factory=list, valid=_os_package_problem)
    """Debian/Ubuntu packages, installed with apt: the base must be Debian or Ubuntu based."""
    python: str = setting("3.11", valid=_python_problem)
    """Python of the image's conda environment (Miniforge), whatever Python the base ships."""
    miniforge: str = setting("24.11.3-0", valid=_miniforge_problem)
    """The Miniforge release that installs conda in the image: pinned, so that the definition (and its content hash) names what the image holds."""
    torch: str = setting("torch==2.5.1", valid=_requirement_problem)
    """The torch requirement pip installs from torch_index (match the base's CUDA)."""
    torch_index: Optional[str] = setting("https://download.pytorch.org/whl/cu124", valid=non_empty_problem)
    """The index that holds the torch build for the base's CUDA (cu124 for CUDA 12.4); null for PyPI."""
    pip: list[str] = setting(factory=list, valid=_requirement_problem)
    """More requirements pip installs into the image's environment."""
    extras: list[Literal["vizdoom", "habitat", "distributed", "video", "tensorboard"]] = setting(factory=list)
    """hpcrl's extras installed with it, each with the OS packages and conda packages it needs (habitat: habitat-sim)."""
    habitat_channel: str = setting("aihabitat-nightly", valid=non_empty_problem)
    """Conda channel of habitat-sim: the stable `aihabitat` channel has Linux builds for Python 3.9 only,
    older than hpcrl supports."""
    habitat_version: Optional[str] = setting(None, valid=_conda_version_problem)
    """Pin habitat-sim (conda version spec, e.g. `0.3.3`); the newest build in the channel otherwise."""
    hpcrl_source: Optional[str] = setting(None, valid=non_empty_problem)
    """Source checkout or wheel of hpcrl copied into the image through `%files`; by default the
    checkout this hpcrl runs from."""
    env: dict[str, str] = setting(factory=dict, keys=env_name_problem)
    """Variables of the image's `%environment`, set in every job that runs it."""
    labels: dict[str, str] = setting(factory=dict, keys=_label_problem)
    """`%labels` of the image (`apptainer inspect` shows them), beside hpcrl's own."""
    output_dir: str = setting("images", valid=non_empty_problem)
    """Directory of the built images: `<output_dir>/<name>-<content hash>.sif`, which `hpcrl sweep` uses
    when container.image is not set."""
    cachedir: Optional[str] = setting(None, valid=non_empty_problem)
    """APPTAINER_CACHEDIR of the build (default `~/.apptainer/cache`, a quota trap); `$VARS` expand
    where the build runs, so `--submit` can use the node's scratch."""
    tmpdir: Optional[str] = setting(None, valid=non_empty_problem)
    """APPTAINER_TMPDIR: holds the whole unpacked image, so local disk, not Lustre/NFS."""
    template: str = setting("hpcrl.def.j2", valid=non_empty_problem)
    """Template name, looked up in ./singularity/ first, then in hpcrl's bundled singularity/."""
    build_time: str = setting("02:00:00", valid=time_problem)
    """Time limit of the `--submit` build job, `HH:MM:SS`."""
    build_mem: str = setting("8G", valid=mem_problem)
    """Limits of the `--submit` build job: a build takes longer, and more memory, than many training tasks."""

    _REMOTE = ("docker", "library", "oras", "shub")

    def bootstrap(self) -> tuple[str, str]:
        """(`Bootstrap:` agent, `From:` value) of the base; ValueError says what a base may be."""
        scheme, sep, rest = self.base.partition("://")
        if sep and scheme in self._REMOTE and rest.strip() and not any(c.isspace() for c in rest):
            return scheme, rest
        if not sep and self.base.endswith(".sif"):
            return "localimage", self.base
        raise ValueError(
            "expected docker://IMAGE:TAG, library://..., oras://..., shub://... or the path of a local .sif, "
            f"got {self.base!r}"
        )

    def check(self) -> list[tuple[str, str]]:
        """The base is parsed by `bootstrap()`, which the image builder calls too."""
        try:
            self.bootstrap()
        except ValueError as exc:
            return [("base", str(exc))]
        return []
