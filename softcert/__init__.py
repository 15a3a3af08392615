"""softcert: formal verification and analysis of softmax operators.

One import root: ``softcert.kernels`` < ``softcert.bounds`` < ``softcert.analysis`` |
``softcert.certify`` < ``softcert.cli`` (the layers pyproject.toml's import-linter contract
enforces). The subpackages are imported on demand; this module only names the version.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("softcert")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"
