"""The versions of Python and the libraries a run depends on, as recorded in its manifest."""

from __future__ import annotations

import platform


def installed() -> dict[str, str | None]:
    """Versions of Python and the libraries a run depends on, read from the installed
    distributions' metadata (`importlib.metadata`): nothing is imported, so a process that
    does not need TensorFlow or scikit-learn never loads them to record a version.
    A library that is not installed (or installed under another distribution name) is None."""
    from importlib.metadata import PackageNotFoundError, version

    from ensemble.core import VERSION

    def first(*names: str) -> str | None:
        for name in names:
            try:
                return version(name)
            except PackageNotFoundError:
                continue
        return None

    return {"python": platform.python_version(),
            "tensorflow": first("tensorflow", "tensorflow-cpu", "tensorflow-macos",
                                "tensorflow-intel", "tf-nightly"),
            "keras": first("keras", "keras-nightly"), "numpy": first("numpy"),
            "scikit-learn": first("scikit-learn"), "pyarrow": first("pyarrow"),
            "joblib": first("joblib"), "ensemble": VERSION}
