"""bridge's version, in the foundation so that what records it (a manifest) need not import the
package, whose ``__init__`` offers the Python API (bridge.api, far above)."""

__version__ = "0.1.0"
