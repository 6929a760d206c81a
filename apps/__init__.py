"""Gradio apps for mmrlvr: `mmrlvr demo` (apps.launcher) with one file per tab.

Every tab's handler is a plain function of its inputs (tested without a server); `build` wires it
into the Blocks app under a fixed `api_name`, so `gradio_client` can call each one.
"""
import os

# The demo runs on machines without internet access and must never wait on telemetry.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
