"""Importing TensorFlow quietly: without its C++ start-up banners and without Keras's and
TensorFlow Lite's extras.

Shared by the CLI and by everything that may be first to import TensorFlow in a process (a
user's builder module imports Keras at its top).
"""

from __future__ import annotations

import gc
import os
import sys

EXTRAS = ("sklearn", "scipy", "pandas", "matplotlib", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ info and warnings
_own_process = False  # `own_process()` was called: the import freezes what it made


def own_process() -> None:
    """Declare this process the project's own (the `ensemble` command, a between-graph
    client), not a user's: `import_tensorflow_quietly` then runs the import with the garbage
    collector off and moves every object alive after it to the permanent generation
    (`gc.freeze()`), which later collections never scan. TensorFlow's import makes about half
    a million objects that live as long as the process, and about 700 of garbage; collecting
    during it cost 0.4-1.0 s of CPU (4 full collections, on a loaded 2-core machine), and each
    later full collection walked them again (0.3-0.5 s each). A user's process (a notebook,
    the test suite calling `pipelines.cli.main`) keeps Python's own collection, as freezing
    its objects would keep their later garbage alive."""
    global _own_process
    _own_process = True


def import_tensorflow_quietly() -> None:
    """Import TensorFlow with stderr silenced: its C++ runtime prints start-up banners (oneDNN,
    CUDA probing) before any log level applies. Errors still surface as Python exceptions;
    TensorFlow's Python warnings (retracing, when fits of new shapes retrace) are turned off.

    Keras imports scikit-learn, SciPy, pandas and matplotlib (pyplot) when they are installed,
    for wrappers and plots this CLI never uses, and TensorFlow Lite imports JAX (its `jit`):
    about 2 s of every process's start-up, JAX 0.7 s of it under load. Those
    not loaded yet are hidden while TensorFlow loads (a `None` entry in `sys.modules` makes an
    import fail, which Keras handles by leaving the extra off) and importable again after, so a
    command that needs one (scikit-learn for data and metrics) still loads it, once, when used.
    """
    if "tensorflow" in sys.modules:
        return
    hidden = [name for name in EXTRAS if name not in sys.modules]
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    collecting = gc.isenabled() and _own_process
    try:
        if collecting:  # `own_process`: no collection during the import, then frozen
            gc.disable()
        sys.modules.update(dict.fromkeys(hidden))
        os.dup2(devnull, 2)
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # retracing warnings: fits of new shapes retrace
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
        if collecting:
            gc.freeze()
            gc.enable()
