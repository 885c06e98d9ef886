"""The package's version in a module of its own, importing nothing.

``version_compat`` and ``get_provider_info`` read it from here rather than from the package root,
whose lazy names reach every layer; hatch reads the wheel's version from this file too.
"""

#: The one version: the wheel's metadata, ``get_provider_info`` and ``__version__`` agree.
__version__ = "0.2.0"

#: Python versions the package is tested on (docs/compatibility.md); the published metadata says the
#: same, so only an install that bypassed the resolver meets this.
SUPPORTED_PYTHON = ((3, 11), (3, 13))
