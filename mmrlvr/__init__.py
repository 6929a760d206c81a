"""mmrlvr: RL from verifiable rewards (GRPO) for vision- and audio-language models."""
__version__ = "0.1.0"


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
