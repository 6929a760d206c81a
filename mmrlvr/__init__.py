"""mmrlvr: RL from verifiable rewards (GRPO) for vision- and audio-language models.

`from mmrlvr import GRPOTrainer, GRPOConfig, SFTTrainer, SFTConfig, Callback, load_config` is
the Python API (`mmrlvr.api`, docs/api.md); it is imported on first use, so `import mmrlvr`
stays light.
"""
__version__ = "0.1.0"

API = ("GRPOTrainer", "GRPOConfig", "SFTTrainer", "SFTConfig", "Callback", "load_config")
"""The names `mmrlvr` itself exports from `mmrlvr.api`, lazily."""


def __getattr__(name: str):
    if name in API:
        from mmrlvr import api       # the one import the package root makes upwards (lazily)

        return getattr(api, name)
    raise AttributeError(f"module 'mmrlvr' has no attribute {name!r}")


def version_text() -> str:
    """What `mmrlvr --version` prints: this version and those of the libraries a bug report
    needs (read from the installed packages' metadata, so nothing heavy is imported)."""
    import platform
    from importlib import metadata

    parts = [f"python {platform.python_version()}"]
    for package in ("torch", "transformers"):     # one short line: argparse wraps long ones
        try:
            parts.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{package} not installed")
    return f"mmrlvr {__version__} ({', '.join(parts)})"
