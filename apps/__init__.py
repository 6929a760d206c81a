"""Gradio apps for mmrlvr: `mmrlvr demo` (apps.launcher) with one file per tab.

Every tab's handler is a plain function of its inputs (tested without a server); `build` wires it
into the Blocks app under a fixed `api_name`, so `gradio_client` can call each one. Shared pieces:
`runinfo` (what a run dir says: task, starting model, examples, checkpoints), `generate` (token by
token streaming), `panels` (one model's answer as a person reads it, the example tables),
`verdicts` (the verifier's verdict and the explained reward rows), `common` (context, checks).
"""
import os

# The demo runs on machines without internet access and must never wait on telemetry.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
